import Foundation
import Resilience
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One end-to-end scenario: runs against the shared server and says whether it met its expectation.
struct Scenario: Sendable {
    let name: String
    let run: @Sendable (LoopbackHTTPServer) async throws -> Outcome
}

struct Outcome: Sendable {
    let passed: Bool
    let detail: String
}

struct DemoRequest: NetworkRequest {
    let url: URL
    var method: HTTPMethod = .get
    var headers: [String: String] = [:]
    var body: Data? = nil
    var timeout: TimeInterval = 10
}

enum Demo {
    /// This program's own executable, to start a second process of it.
    static var ownExecutable: String {
        #if os(Linux)
        "/proc/self/exe"
        #else
        Bundle.main.executablePath ?? CommandLine.arguments[0]
        #endif
    }

    static let scenarios: [Scenario] = [
        Scenario(name: "flaky server: retries with jitter", run: flakyServer),
        Scenario(name: "Retry-After on 429 is honoured", run: retryAfter),
        Scenario(name: "deduplication storm: 1000 callers", run: deduplicationStorm),
        Scenario(name: "prompt cancellation mid-request", run: cancellation),
        Scenario(name: "circuit breaker fails fast", run: circuitBreaker),
        Scenario(name: "garbage reply is a typed error", run: garbageReply),
        Scenario(name: "total deadline across retries", run: totalDeadline),
        Scenario(name: "hedging beats a slow response", run: hedging),
        Scenario(name: "per-host concurrency limit", run: hostLimit),
        Scenario(name: "circuit breakers per host, isolate and reset", run: breakersPerHost),
        Scenario(name: "fault injection rehearses an outage", run: faultInjection),
        Scenario(name: "401 storm: one token refresh", run: authStorm),
        Scenario(name: "offline → queued → restart → reconnect → drained", run: offlineQueue),
        Scenario(name: "offline reads: cached feed, paused read, 304", run: offlineReads),
        Scenario(name: "offline notes: saved offline, shown, relaunched, delivered", run: offlineNotes),
        Scenario(name: "drain-service cycles with a budget, SIGTERM stop", run: drainServiceCycles),
        Scenario(name: "metrics table and Prometheus text", run: metrics),
    ]

    /// What `work` returns, or `nil` when it takes longer than `limit`: a broken layer then fails
    /// its scenario instead of hanging the demo.
    static func within<T: Sendable>(_ limit: Duration, _ work: @escaping @Sendable () async -> T?) async -> T? {
        await withTaskGroup(of: T?.self) { group in
            group.addTask { await work() }
            group.addTask {
                try? await Task.sleep(for: limit)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    static func runAll() async -> Bool {
        let server: LoopbackHTTPServer
        do {
            server = try LoopbackHTTPServer()
        } catch {
            print("could not start the loopback server: \(error)")
            return false
        }
        defer { server.shutdown() }
        print("Resilience demo — loopback server on \(server.baseURL)\n")

        var rows: [(String, Outcome, Duration)] = []
        for scenario in scenarios {
            print("▶ \(scenario.name)")
            let start = ContinuousClock.now
            let outcome: Outcome
            do {
                outcome = try await scenario.run(server)
            } catch {
                outcome = Outcome(passed: false, detail: "threw \(error)")
            }
            let elapsed = ContinuousClock.now - start
            print("  \(outcome.passed ? "✓" : "✗") \(outcome.detail)\n")
            rows.append((scenario.name, outcome, elapsed))
        }

        print("Summary")
        let width = rows.map(\.0.count).max() ?? 0
        for (name, outcome, elapsed) in rows {
            let padded = name.padding(toLength: width, withPad: " ", startingAt: 0)
            let ms = Int((elapsed.seconds * 1000).rounded())
            print("  \(outcome.passed ? "PASS" : "FAIL")  \(padded)  \(String(repeating: " ", count: max(0, 6 - String(ms).count)))\(ms) ms")
        }
        let passed = rows.allSatisfy(\.1.passed)
        print(passed ? "\nAll \(rows.count) scenarios passed." : "\nSome scenarios FAILED.")
        return passed
    }

    // MARK: - Scenarios

    static func flakyServer(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/flaky", [.status(503), .status(502), .status(500), .ok("{\"ok\":true}")])
        let events = EventLog()
        let engine = AsyncRequestEngine(
            retryPolicy: ExponentialRetryPolicy(maxRetries: 4, baseDelay: 0.05, maxDelay: 1, jitter: .full),
            eventSink: events
        )
        let (data, response) = try await engine.send(DemoRequest(url: server.url("/flaky")))
        for line in events.lines { print("    \(line)") }
        let ok = response.statusCode == 200 && server.hits("/flaky") == 4 && !data.isEmpty
        return Outcome(passed: ok, detail: "3 failures then 200 after \(server.hits("/flaky")) calls")
    }

    static func retryAfter(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/limited", [.status(429, headers: ["Retry-After": "1"]), .ok()])
        let events = EventLog()
        let engine = AsyncRequestEngine(retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0.01), eventSink: events)
        let start = ContinuousClock.now
        _ = try await engine.send(DemoRequest(url: server.url("/limited")))
        let waited = ContinuousClock.now - start
        for line in events.lines { print("    \(line)") }
        return Outcome(passed: waited >= .seconds(1), detail: "server asked for 1 s, engine waited \(format(waited)) (policy alone: 10 ms)")
    }

    static func deduplicationStorm(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/catalog", LoopbackResponse.ok("catalog").held())
        let events = EventLog(quiet: true)
        let engine = AsyncRequestEngine(eventSink: events)
        let url = server.url("/catalog")
        let callers = 1000
        let results = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<callers {
                group.addTask { try await engine.send(DemoRequest(url: url)).0.count }
            }
            await events.waitForDeduplicated(callers - 1)
            await server.waitForHits("/catalog", atLeast: 1)
            server.releaseHeld("/catalog")
            return try await group.reduce(into: 0) { $0 += $1 > 0 ? 1 : 0 }
        }
        let hits = server.hits("/catalog")
        return Outcome(passed: hits == 1 && results == callers, detail: "\(callers) concurrent GETs, \(hits) upstream call, \(results) answered")
    }

    static func cancellation(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/slow", LoopbackResponse.ok().held())
        let engine = AsyncRequestEngine()
        let url = server.url("/slow")
        let task = Task { () -> NetworkError? in
            do {
                _ = try await engine.send(DemoRequest(url: url, method: .post))
                return nil
            } catch let error as NetworkError {
                return error
            }
        }
        await server.waitForHits("/slow", atLeast: 1)
        let start = ContinuousClock.now
        task.cancel()
        let error = try await task.value
        let elapsed = ContinuousClock.now - start
        server.releaseHeld("/slow")
        var isCancelled = false
        if case .cancelled = error { isCancelled = true }
        return Outcome(passed: isCancelled && elapsed < .milliseconds(100), detail: "cancelled caller answered in \(format(elapsed))")
    }

    static func circuitBreaker(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/down", .status(500))
        let breaker = CircuitBreaker(configuration: .init(windowSize: 10, minimumCalls: 5, failureRateThreshold: 0.5, openDuration: .seconds(30)))
        let engine = AsyncRequestEngine(configuration: .init(circuitBreaker: .shared(breaker)))
        var fastFailures = 0
        for _ in 0..<20 {
            do {
                _ = try await engine.send(DemoRequest(url: server.url("/down")))
            } catch NetworkError.circuitOpen {
                fastFailures += 1
            } catch {}
        }
        let hits = server.hits("/down")
        return Outcome(
            passed: hits == 5 && fastFailures == 15 && breaker.state == .open,
            detail: "20 calls: \(hits) reached the server, \(fastFailures) failed fast (breaker \(breaker.state))")
    }

    static func garbageReply(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/garbage", .raw(Data("NOT HTTP AT ALL\r\n\r\n".utf8)))
        do {
            _ = try await AsyncRequestEngine().send(DemoRequest(url: server.url("/garbage")))
            return Outcome(passed: false, detail: "garbage was accepted")
        } catch NetworkError.invalidResponse {
            return Outcome(passed: true, detail: "NetworkError.invalidResponse, no crash")
        }
    }

    static func format(_ duration: Duration) -> String {
        let ms = duration.seconds * 1000
        return ms < 10 ? String(format: "%.2f ms", ms) : String(format: "%.0f ms", ms)
    }
}

/// Prints the engine's events as they happen and counts deduplications.
final class EventLog: RequestEventSink {
    private struct State {
        var lines: [String] = []
        var deduplicated = 0
        var waiters = WaiterList<Void, Int>()
    }
    private let state = Locked(State())
    private let quiet: Bool

    init(quiet: Bool = false) { self.quiet = quiet }

    var lines: [String] { state.withLock { $0.lines } }

    func record(_ event: RequestEvent) async {
        let line: String? =
            switch event {
            case .started(_, let url, let method): "→ \(method.rawValue) \(url.path)"
            case .retryScheduled(_, let attempt, let delay): "↻ attempt \(attempt) failed, retrying in \(Int(delay * 1000)) ms"
            case .succeeded(_, let status, let duration, let attempt): "✓ \(status) on attempt \(attempt) after \(Int(duration * 1000)) ms"
            case .failed(_, let error, let attempt): "✗ \(error) on attempt \(attempt)"
            case .deduplicated: nil
            }
        let ready = state.withLock { state -> [WaiterList<Void, Int>.Waiter] in
            if let line, !quiet { state.lines.append(line) }
            guard case .deduplicated = event else { return [] }
            state.deduplicated += 1
            let count = state.deduplicated
            return state.waiters.takeAll { $0 <= count }
        }
        for waiter in ready { waiter.resume(returning: ()) }
    }

    func waitForDeduplicated(_ count: Int) async {
        await state.wait(on: \.waiters, tag: count, cancelled: ()) { $0.deduplicated >= count ? () : nil }
    }
}
