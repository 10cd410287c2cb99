import Dispatch
import Foundation
import Resilience
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `resilience-demo serve [--port N] [--duration S]`: a steady mixed workload through an
/// `AsyncRequestEngine` (retries, timeouts, deduplication) against an embedded
/// `LoopbackHTTPServer`, recorded by a `RequestMetricsCollector` whose `prometheusText()` is
/// served at `GET /metrics` on a second loopback server, so a Prometheus server can scrape it.
///
/// Stops on SIGINT or SIGTERM, or after `--duration` seconds, then prints a per-endpoint table.
enum Serve {
    static let usage = """
        usage: resilience-demo serve [--duration S] [--port N]
          --duration S   stop after S seconds (default: run until SIGINT or SIGTERM)
          --port N       serve /metrics on 127.0.0.1:N (default: an ephemeral port, printed)
        """

    struct Options {
        var duration: Duration?
        var port: Int?
    }

    enum ArgumentError: Error, CustomStringConvertible {
        case missingValue(String)
        case invalidValue(String, String)
        case unknown(String)

        var description: String {
            switch self {
            case .missingValue(let flag): "\(flag) needs a value"
            case .invalidValue(let flag, let value): "invalid value '\(value)' for \(flag)"
            case .unknown(let argument): "unknown argument '\(argument)'"
            }
        }
    }

    static func parse(_ arguments: [String]) throws -> Options {
        var options = Options()
        var remaining = arguments[...]
        while let argument = remaining.popFirst() {
            switch argument {
            case "--duration":
                guard let value = remaining.popFirst() else { throw ArgumentError.missingValue(argument) }
                guard let seconds = Double(value), seconds > 0, seconds.isFinite else {
                    throw ArgumentError.invalidValue(argument, value)
                }
                options.duration = .milliseconds(Int64((seconds * 1000).rounded()))
            case "--port":
                guard let value = remaining.popFirst() else { throw ArgumentError.missingValue(argument) }
                guard let port = Int(value), (1...65_535).contains(port) else {
                    throw ArgumentError.invalidValue(argument, value)
                }
                options.port = port
            default:
                throw ArgumentError.unknown(argument)
            }
        }
        return options
    }

    /// Runs the service; returns the process exit status.
    static func run(_ arguments: [String]) async -> Int32 {
        if arguments.contains("--help") || arguments.contains("-h") {
            say(usage)
            return 0
        }
        let options: Options
        do {
            options = try parse(arguments)
        } catch {
            complain("resilience-demo serve: \(error)\n\(usage)")
            return 64
        }
        let collector = RequestMetricsCollector()
        let stop = StopSignal()
        let signalSources = stop.installSignalHandlers()
        defer { for source in signalSources { source.cancel() } }

        let workload: LoopbackHTTPServer
        let metricsServer: LoopbackHTTPServer
        do {
            workload = try Workload.makeServer()
            metricsServer = try LoopbackHTTPServer(port: options.port ?? 0, requestLogLimit: 100)
        } catch {
            complain("resilience-demo serve: could not start a loopback server: \(error)")
            return 1
        }
        mountMetrics(on: metricsServer, collector: collector)

        let metricsURL = metricsServer.url("/metrics")
        say(
            """
            resilience-demo serve
              workload: \(Workload.workers) workers against \(workload.baseURL) (200 / 404 / 503 / slow / dedup routes)
              metrics:  \(metricsURL)   (also \(metricsServer.url("/metrics.json")))
            Prometheus scrape config:
              scrape_configs:
                - job_name: resilience-demo
                  static_configs: [{ targets: ["127.0.0.1:\(metricsServer.port)"] }]
            Stop with Ctrl-C (SIGINT) or SIGTERM\(options.duration.map { "; stopping by itself after \(Self.format($0))" } ?? "").
            """)

        // A long-running process on URLSession: it asks for the repair of corelibs-foundation's
        // per-request leak (Linux; nothing happens elsewhere).
        URLSessionTransport.installFoundationLeakRepair()
        // The package's transport over an ephemeral configuration: no URLCache (caching is the
        // ResponseCache layer's job), so nothing the workload reads is held in memory.
        let session = URLSessionTransport(configuration: .ephemeral)
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: ExponentialRetryPolicy(maxRetries: 2, baseDelay: 0.05, maxDelay: 0.5, jitter: .full),
            eventSink: collector
        )
        let started = ContinuousClock.now
        let workers = (0..<Workload.workers).map { worker in
            Task { await Workload.run(worker: worker, engine: engine, server: workload) }
        }
        let progress = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(10))
                if Task.isCancelled { break }
                let stats = collector.currentSnapshot()
                say(
                    "  \(Self.format(ContinuousClock.now - started)): \(stats.requestsStarted) started, \(stats.requestsSucceeded) ok, \(stats.requestsFailed) failed, \(stats.retriesScheduled) retries, \(stats.deduplicationsHit) deduplicated"
                )
            }
        }
        let timer = options.duration.map { duration in
            Task {
                try? await Task.sleep(for: duration)
                if !Task.isCancelled { stop.trigger("--duration elapsed") }
            }
        }

        let reason = await stop.wait()
        say("\nstopping (\(reason)) …")
        timer?.cancel()
        progress.cancel()
        for worker in workers { worker.cancel() }
        for worker in workers { await worker.value }
        await progress.value
        metricsServer.shutdown()
        workload.shutdown()

        printSummary(collector.currentSnapshot(), elapsed: ContinuousClock.now - started)
        return 0
    }

    /// `GET /metrics` (Prometheus text), `GET /metrics.json` (the `Codable` snapshot) and an index.
    static func mountMetrics(on server: LoopbackHTTPServer, collector: RequestMetricsCollector) {
        server.route("/metrics") { _ in
            LoopbackResponse(
                status: 200,
                headers: ["Content-Type": PrometheusTextFormat.contentType],
                body: Data(collector.prometheusText().utf8)
            )
        }
        server.route("/metrics.json") { _ in
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            guard let json = try? encoder.encode(collector.currentSnapshot()) else { return .status(500) }
            return LoopbackResponse(status: 200, headers: ["Content-Type": "application/json"], body: json)
        }
        server.route("/") { _ in
            .status(200, headers: ["Content-Type": "text/plain; charset=utf-8"], body: "resilience-demo serve\n  /metrics       Prometheus text 0.0.4\n  /metrics.json  JSON snapshot\n")
        }
    }

    static func printSummary(_ stats: RequestMetrics, elapsed: Duration) {
        func ms(_ seconds: TimeInterval?) -> String {
            guard let seconds else { return "-" }
            return String(format: "%.1f", seconds * 1000)
        }
        var lines = [
            "",
            "Ran \(format(elapsed)): \(stats.requestsStarted) requests started, \(stats.requestsSucceeded) succeeded, \(stats.requestsFailed) failed, \(stats.retriesScheduled) retries, \(stats.deduplicationsHit) deduplicated, success rate \(stats.successRate.map { String(format: "%.1f %%", $0 * 100) } ?? "-")",
            "",
        ]
        let header = ["method", "endpoint", "started", "ok", "failed", "retries", "dedup", "p50 ms", "p95 ms", "p99 ms", "statuses"]
        var rows = [header]
        for endpoint in stats.endpoints {
            let statuses =
                endpoint.statusCodes.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }
                + endpoint.failureReasons.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }
            rows.append([
                endpoint.method, endpoint.template, String(endpoint.requestsStarted), String(endpoint.requestsSucceeded),
                String(endpoint.requestsFailed), String(endpoint.retriesScheduled), String(endpoint.deduplicationsHit),
                ms(endpoint.successDuration?.p50), ms(endpoint.successDuration?.p95), ms(endpoint.successDuration?.p99),
                statuses.joined(separator: " "),
            ])
        }
        let widths = header.indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        for row in rows {
            lines.append(
                "  "
                    + row.enumerated().map { column, cell in
                        column == row.count - 1 ? cell : cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                    }.joined(separator: "  "))
        }
        say(lines.joined(separator: "\n"))
    }

    static func format(_ duration: Duration) -> String {
        String(format: "%.1f s", duration.seconds)
    }

    /// Writes a line to standard output at once (not through stdio's buffer, so that it shows up
    /// immediately when the output is piped to a file or a log collector).
    static func say(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    static func complain(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}

/// Resolves once: on SIGINT, on SIGTERM, or when `trigger` is called (the `--duration` timer).
final class StopSignal: Sendable {
    private struct State {
        var reason: String?
        var waiters = WaiterList<String, Void>()
    }
    private let state = Locked(State())
    private let queue = DispatchQueue(label: "resilience-demo.signals")

    /// Routes SIGINT and SIGTERM to `trigger` through Dispatch signal sources (the default
    /// handlers, which would kill the process mid-request, are switched off). Keep the returned
    /// sources alive while serving; cancel them afterwards.
    func installSignalHandlers() -> [any DispatchSourceSignal] {
        [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM")].map { number, name in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { [weak self] in self?.trigger(name) }
            source.resume()
            return source
        }
    }

    func trigger(_ reason: String) {
        let waiters = state.withLock { state -> [WaiterList<String, Void>.Waiter] in
            guard state.reason == nil else { return [] }
            state.reason = reason
            return state.waiters.takeAll()
        }
        for waiter in waiters { waiter.resume(returning: reason) }
    }

    /// Returns the reason once stopped.
    func wait() async -> String {
        await state.wait(on: \.waiters, tag: (), cancelled: "cancelled") { $0.reason }
    }
}

/// What each worker sends, and how often.
enum Workload {
    static let workers = 8

    /// The server, one for the whole run. Its per-path hit counts grow with every distinct path it
    /// serves, so the workload draws ids from fixed ranges (8 000 paths at most): a service that
    /// runs for hours stays the size it reached in its first minutes. Its `requestLog` keeps the
    /// last 1 000 requests.
    ///
    /// Routes: fast 200s, 404s, a flaky route (30 % 503), slow items (20 ms – 1.5 s, the engine
    /// times out at 1 s), a catalog slow enough for concurrent identical GETs to be deduplicated,
    /// and POSTs with an Idempotency-Key that sometimes fail with 503.
    static func makeServer() throws -> LoopbackHTTPServer {
        let server = try LoopbackHTTPServer(requestLogLimit: 1_000)
        server.route("/api/users/*") { _ in .json(#"{"name":"demo"}"#) }
        server.route("/api/missing/*", .status(404))
        server.route("/api/flaky") { _ in
            Double.random(in: 0..<1) < 0.3 ? .status(503) : .ok("ok")
        }
        server.route("/api/items/*") { _ in
            let milliseconds = exp(Double.random(in: log(20.0)...log(1_500.0)))
            return LoopbackResponse.ok("item").delayed(by: .milliseconds(Int64(milliseconds)))
        }
        server.route("/api/catalog", LoopbackResponse.ok("catalog").delayed(by: .milliseconds(150)))
        server.route("/api/orders") { request in
            request.method == "POST" && Double.random(in: 0..<1) < 0.2 ? .status(503) : .status(201)
        }
        return server
    }

    static func run(worker: Int, engine: AsyncRequestEngine, server: LoopbackHTTPServer) async {
        var sent = 0
        while !Task.isCancelled {
            sent += 1
            let roll = Int.random(in: 0..<100)
            let request: DemoRequest
            switch roll {
            case 0..<40:
                // A secret in the query, to show that it never reaches a metric label.
                request = DemoRequest(url: server.url("/api/users/\(Int.random(in: 1...5_000))?access_token=demo-secret-\(worker)"), timeout: 2)
            case 40..<50:
                request = DemoRequest(url: server.url("/api/missing/\(Int.random(in: 1...100))"), timeout: 2)
            case 50..<65:
                request = DemoRequest(url: server.url("/api/flaky"), timeout: 2)
            case 65..<80:
                request = DemoRequest(url: server.url("/api/items/\(Int.random(in: 1...2_900))"), timeout: 1)
            case 80..<92:
                request = DemoRequest(url: server.url("/api/catalog"), timeout: 2)
            default:
                request = DemoRequest(
                    url: server.url("/api/orders"),
                    method: .post,
                    headers: ["Idempotency-Key": "demo-\(worker)-\(sent)"],
                    body: Data(#"{"sku":"demo"}"#.utf8),
                    timeout: 2
                )
            }
            _ = try? await engine.send(request)
            try? await Task.sleep(for: .milliseconds(Int.random(in: 10...60)))
        }
    }
}
