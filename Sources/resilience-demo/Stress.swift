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

/// `resilience-demo stress dedup|auth|queue ...`: load runs for people who load-test, each ending
/// with one machine-readable line of `key=value` pairs.
enum Stress {
    static let usage = """
        usage: resilience-demo stress dedup --callers N     N concurrent identical GETs through one engine
               resilience-demo stress auth  --callers N [--max-concurrent M]
                                                            N concurrent requests with an expired token
                                                            (M: AuthenticatedRequestEngine's admission limit)
               resilience-demo stress queue --entries N     N durable enqueues offline, restart, reconnect, drain
        """

    /// Runs the stress named in `arguments`; returns the process exit code.
    static func run(_ arguments: [String]) async -> Int32 {
        guard let kind = arguments.first else {
            FileHandle.standardError.write(Data((usage + "\n").utf8))
            return 64
        }
        do {
            let options = try parse(Array(arguments.dropFirst()))
            switch kind {
            case "dedup":
                try options.allow(["--callers"])
                return try await dedup(callers: options.number("--callers") ?? 10_000)
            case "auth":
                try options.allow(["--callers", "--max-concurrent"])
                return try await auth(callers: options.number("--callers") ?? 10_000, maxConcurrent: options.number("--max-concurrent"))
            case "queue":
                try options.allow(["--entries"])
                return try await queue(entries: options.number("--entries") ?? 10_000)
            default:
                FileHandle.standardError.write(Data("resilience-demo stress: unknown kind '\(kind)'\n\(usage)\n".utf8))
                return 64
            }
        } catch let error as UsageError {
            FileHandle.standardError.write(Data("resilience-demo stress: \(error.message)\n\(usage)\n".utf8))
            return 64
        } catch {
            print("stress \(kind) failed: \(error)")
            return 1
        }
    }

    struct UsageError: Error { let message: String }

    struct Options {
        var values: [String: Int] = [:]

        func number(_ name: String) -> Int? { values[name] }

        func allow(_ names: Set<String>) throws {
            if let unknown = values.keys.first(where: { !names.contains($0) }) {
                throw UsageError(message: "unknown option '\(unknown)'")
            }
        }
    }

    /// `--name N` pairs, each N a positive whole number.
    private static func parse(_ arguments: [String]) throws -> Options {
        var options = Options()
        var index = 0
        while index < arguments.count {
            let name = arguments[index]
            guard name.hasPrefix("--") else { throw UsageError(message: "unexpected argument '\(name)'") }
            guard index + 1 < arguments.count, let number = Int(arguments[index + 1]), number > 0, number <= 10_000_000 else {
                throw UsageError(message: "\(name) needs a positive whole number")
            }
            options.values[name] = number
            index += 2
        }
        return options
    }

    // MARK: - dedup

    static func dedup(callers: Int) async throws -> Int32 {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/catalog", LoopbackResponse.ok("catalog").held())
        let joins = EventLog(quiet: true)
        let engine = AsyncRequestEngine(session: URLSession(configuration: .ephemeral), eventSink: joins)
        let url = server.url("/catalog")
        print("stress dedup: \(callers) concurrent identical GETs, one engine, loopback server \(server.baseURL)")
        let waits = Samples()
        let start = ContinuousClock.now
        let tasks = (0..<callers).map { _ in
            Task {
                let began = ContinuousClock.now
                let (data, _) = try await engine.send(StressRequest(url: url))
                waits.add(ContinuousClock.now - began)
                return data.count
            }
        }
        await joins.waitForDeduplicated(callers - 1)
        await server.waitForHits("/catalog", atLeast: 1)
        server.releaseHeld("/catalog")
        var answered = 0
        for task in tasks where try await task.value > 0 { answered += 1 }
        let wall = ContinuousClock.now - start
        let calls = server.hits("/catalog")
        print("callers answered: \(answered) of \(callers); upstream calls: \(calls)")
        print(line([("upstream_calls", "\(calls)"), ("callers", "\(callers)"), ("wall_s", seconds(wall))] + waits.percentiles() + [("peak_rss_mb", peakRSS())]))
        return calls == 1 && answered == callers ? 0 : 1
    }

    // MARK: - auth

    static func auth(callers: Int, maxConcurrent: Int?) async throws -> Int32 {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        let valid = ValidTokenBox("fresh-token")
        server.route(
            "/items/*",
            handler: { request in
                request.header("authorization") == "Bearer " + valid.value ? .ok(request.path) : .status(401)
            })
        let provider = StressTokenProvider(current: "expired-token", refreshed: valid.value)
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: .ephemeral)),
            coordinator: TokenRefreshCoordinator(provider: provider),
            maxConcurrentRequests: maxConcurrent
        )
        print(
            "stress auth: \(callers) concurrent GETs of distinct URLs with an expired token"
                + (maxConcurrent.map { ", admission limit \($0)" } ?? ""))
        let waits = Samples()
        let start = ContinuousClock.now
        let tasks = (0..<callers).map { index in
            let url = server.url("/items/\(index)")
            return Task {
                let began = ContinuousClock.now
                let (data, _) = try await engine.send(StressRequest(url: url))
                waits.add(ContinuousClock.now - began)
                return data == Data(url.path.utf8)
            }
        }
        var succeeded = 0
        var failed = 0
        for task in tasks {
            if (try? await task.value) == true { succeeded += 1 } else { failed += 1 }
        }
        let wall = ContinuousClock.now - start
        let refreshes = provider.refreshCount
        print("succeeded: \(succeeded), failed: \(failed), refreshes: \(refreshes), requests the server saw: \(server.totalHits)")
        print(
            line(
                [("refreshes", "\(refreshes)"), ("callers", "\(callers)"), ("succeeded", "\(succeeded)"), ("upstream_calls", "\(server.totalHits)"), ("wall_s", seconds(wall))]
                    + waits.percentiles() + [("peak_rss_mb", peakRSS())]))
        return refreshes == 1 && succeeded == callers ? 0 : 1
    }

    // MARK: - queue

    static func queue(entries: Int) async throws -> Int32 {
        let server = try LoopbackHTTPServer(requestLogLimit: .max)  // every key is checked below
        defer { server.shutdown() }
        server.route("/events/*", .status(201))
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-stress-queue-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let session = URLSession(configuration: .ephemeral)
        print("stress queue: \(entries) durable enqueues while offline, then a restart, a reconnect and a drain")

        // Phase 1: offline; 64 concurrent writers enqueue; every acknowledged key is remembered.
        let acknowledged = KeySet()
        let start = ContinuousClock.now
        do {
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session),
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
                store: try DiskQueueStore(directory: folder),
                maxQueueSize: entries
            )
            let writers = 64
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<writers {
                    group.addTask {
                        var index = writer
                        while index < entries {
                            let key = "stress-\(index)"
                            let request = QueuedRequest(method: .post, url: server.url("/events/\(index)"), body: Data("{\"n\":\(index)}".utf8), idempotencyKey: key)
                            if try await engine.enqueue(request).queuedID != nil { acknowledged.insert(key) }
                            index += writers
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        let enqueued = ContinuousClock.now - start
        print("enqueued \(acknowledged.count) entries durably in \(seconds(enqueued)) s")

        // Phase 2: "restart": a new store and engine on the same folder; reconnect; drain.
        let reopenStart = ContinuousClock.now
        let store = try DiskQueueStore(directory: folder)
        let reopened = ContinuousClock.now - reopenStart
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let engine = OfflineQueueEngine(requestEngine: AsyncRequestEngine(session: session), reachabilityMonitor: monitor, store: store, maxQueueSize: entries)
        print("reopened \(store.openReport.loaded) entries in \(seconds(reopened)) s (quarantined: \(store.openReport.quarantined.count))")
        await monitor.setConnected(true)
        let drainStart = ContinuousClock.now
        var delivered = 0
        while true {
            let report = await engine.flush()
            delivered += report.delivered.count
            if report.remaining == 0 || report.results.isEmpty { break }
        }
        let drained = ContinuousClock.now - drainStart
        let received = Set(server.requestLog.compactMap { $0.header("idempotency-key") })
        let lost = acknowledged.all.subtracting(received).count
        let remaining = await engine.pendingCount()
        print("delivered \(delivered) in \(seconds(drained)) s; server received \(received.count) distinct keys; lost \(lost); remaining \(remaining)")
        print(
            line([
                ("entries", "\(entries)"), ("acknowledged", "\(acknowledged.count)"), ("delivered", "\(delivered)"), ("lost", "\(lost)"),
                ("enqueue_s", seconds(enqueued)), ("reopen_s", seconds(reopened)), ("drain_s", seconds(drained)),
                ("wall_s", seconds(ContinuousClock.now - start)), ("peak_rss_mb", peakRSS()),
            ]))
        return lost == 0 && remaining == 0 && acknowledged.count == entries ? 0 : 1
    }

    // MARK: - Output

    /// One line of `key=value` pairs, in the order given.
    static func line(_ pairs: [(String, String)]) -> String {
        pairs.map { "\($0.0)=\($0.1)" }.joined(separator: " ")
    }

    static func seconds(_ duration: Duration) -> String {
        String(format: "%.3f", duration.seconds)
    }

    /// Peak resident set size of this process, in MiB.
    static func peakRSS() -> String {
        var usage = rusage()
        #if os(Linux)
        getrusage(RUSAGE_SELF.rawValue, &usage)
        let bytes = Double(usage.ru_maxrss) * 1024  // kilobytes on Linux
        #else
        getrusage(RUSAGE_SELF, &usage)
        let bytes = Double(usage.ru_maxrss)  // bytes on Darwin
        #endif
        return String(format: "%.1f", bytes / 1_048_576)
    }
}

struct StressRequest: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

/// Per-caller waits; percentiles by exact sort.
final class Samples: Sendable {
    private let values = Locked<[Duration]>([])

    func add(_ value: Duration) { values.withLock { $0.append(value) } }

    func percentiles() -> [(String, String)] {
        let sorted = values.withLock { $0 }.sorted()
        guard !sorted.isEmpty else { return [("p50_ms", "nan"), ("p99_ms", "nan")] }
        func at(_ q: Double) -> String {
            String(format: "%.1f", sorted[min(sorted.count - 1, Int((Double(sorted.count) * q).rounded(.up)) - 1)].seconds * 1000)
        }
        return [("p50_ms", at(0.5)), ("p99_ms", at(0.99))]
    }
}

final class KeySet: Sendable {
    private let keys = Locked<Set<String>>([])
    func insert(_ key: String) { _ = keys.withLock { $0.insert(key) } }
    var count: Int { keys.withLock { $0.count } }
    var all: Set<String> { keys.withLock { $0 } }
}

/// The token the loopback server accepts.
final class ValidTokenBox: Sendable {
    let value: String
    init(_ value: String) { self.value = value }
}

/// A provider whose current token is expired and whose refresh returns the accepted one.
final class StressTokenProvider: TokenProvider {
    private let state: Locked<(current: String, refreshes: Int)>
    private let refreshed: String

    init(current: String, refreshed: String) {
        state = Locked((current, 0))
        self.refreshed = refreshed
    }

    var refreshCount: Int { state.withLock { $0.refreshes } }

    func currentToken() async -> String? { state.withLock { $0.current } }

    func refreshToken() async throws -> String {
        state.withLock { state in
            state.refreshes += 1
            state.current = refreshed
        }
        return refreshed
    }
}
