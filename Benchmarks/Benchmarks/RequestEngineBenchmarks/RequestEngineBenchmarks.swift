import Benchmark
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import RequestEngine
import ResilienceTesting
import Synchronization

// What AsyncRequestEngine costs on top of a bare URLSession, measured end to end over loopback HTTP
// against ResilienceTesting's LoopbackHTTPServer. Every engine benchmark has its raw-URLSession
// baseline in the same run, so the ratio can be read off one `swift package benchmark`
// invocation. See ../../README.md for how to run them and what was measured.
//
// Each benchmark gets its own server and its own `URLSession(configuration: .ephemeral)` (set up
// before its warm-up, shut down after its last iteration), so no benchmark inherits another one's
// warm connection pool.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        timeUnits: .microseconds,
        warmupIterations: 50,
        maxDuration: .seconds(8),
        maxIterations: 20_000
    )

    // MARK: 1. One GET at a time

    let sequential = FixtureSlot()
    Benchmark(
        "raw URLSession.data(for:) sequential",
        closure: { _, fixture in
            let (data, response) = try await fixture.session.data(for: URLRequest(url: fixture.itemURL), delegate: nil)
            try Fixture.check(data, response)
            blackHole(data)
        },
        setup: { try sequential.open() },
        teardown: { sequential.close() }
    )
    let sequentialEngine = FixtureSlot()
    Benchmark(
        "engine.send sequential",
        closure: { _, fixture in
            let (data, response) = try await fixture.engine.send(Get(url: fixture.itemURL))
            try Fixture.check(data, response)
            blackHole(data)
        },
        setup: { try sequentialEngine.open() },
        teardown: { sequentialEngine.close() }
    )

    // MARK: 2. 64 concurrent GETs per iteration, distinct URLs (so the engine cannot deduplicate)

    let concurrent = FixtureSlot()
    let concurrentConfiguration = Benchmark.Configuration(warmupIterations: 10, maxDuration: .seconds(10), maxIterations: 2_000)
    Benchmark(
        "raw 64 concurrent",
        configuration: concurrentConfiguration,
        closure: { _, fixture in
            let session = fixture.session
            try await withThrowingTaskGroup(of: Void.self) { group in
                for url in fixture.distinctURLs {
                    group.addTask {
                        let (data, response) = try await session.data(for: URLRequest(url: url), delegate: nil)
                        try Fixture.check(data, response)
                    }
                }
                try await group.waitForAll()
            }
        },
        setup: { try concurrent.open() },
        teardown: { concurrent.close() }
    )
    let concurrentEngine = FixtureSlot()
    Benchmark(
        "engine 64 concurrent",
        configuration: concurrentConfiguration,
        closure: { _, fixture in
            let engine = fixture.engine
            try await withThrowingTaskGroup(of: Void.self) { group in
                for url in fixture.distinctURLs {
                    group.addTask {
                        let (data, response) = try await engine.send(Get(url: url))
                        try Fixture.check(data, response)
                    }
                }
                try await group.waitForAll()
            }
        },
        setup: { try concurrentEngine.open() },
        teardown: { concurrentEngine.close() }
    )

    // MARK: 3. Dedup storm: 10 000 identical concurrent GETs, one upstream call

    let storm = FixtureSlot()
    let stormReport = StormReport()
    Benchmark(
        "dedup storm 10 000",
        configuration: .init(
            metrics: [.wallClock, .mallocCountTotal, StormMetrics.upstreamCalls, StormMetrics.waitP50, StormMetrics.waitP99],
            timeUnits: .milliseconds,
            warmupIterations: 1,
            maxDuration: .seconds(20),
            maxIterations: 30
        ),
        closure: { benchmark, fixture in
            let result = try await runStorm(fixture, callers: 10_000)
            // The whole point of single flight: 10 000 callers, one request on the wire.
            precondition(
                result.upstreamCalls == 1 && result.startedEvents == 1,
                "dedup storm: \(result.upstreamCalls) upstream calls, \(result.startedEvents) started events (want 1 and 1)"
            )
            benchmark.measurement(StormMetrics.upstreamCalls, result.upstreamCalls)
            benchmark.measurement(StormMetrics.waitP50, result.waitP50.microseconds)
            benchmark.measurement(StormMetrics.waitP99, result.waitP99.microseconds)
            stormReport.add(result)
        },
        setup: { try storm.open() },
        teardown: {
            storm.close()
            stormReport.print()
        }
    )
}

// MARK: - Requests

/// A plain GET with the protocol's defaults (no headers, no body, 30 s timeout), as an app would write it.
struct Get: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

/// The small body every route answers with.
let itemBody = "{\"id\":1,\"name\":\"item\"}"

// MARK: - Fixture

/// One benchmark's server, session and engine.
final class Fixture: Sendable {
    let server: LoopbackHTTPServer
    let session: URLSession
    let engine: AsyncRequestEngine
    /// `/item`, answered at once with `itemBody`.
    let itemURL: URL
    /// `/item?i=0` … `/item?i=63`: the same route, 64 distinct request identities.
    let distinctURLs: [URL]

    init() throws {
        server = try LoopbackHTTPServer()
        server.route("/item", .ok(itemBody))
        server.route("/storm/*", LoopbackResponse.ok(itemBody).held())
        session = URLSession(configuration: .ephemeral)
        engine = AsyncRequestEngine(session: session)
        itemURL = server.url("/item")
        distinctURLs = (0..<64).map { [server] in server.url("/item?i=\($0)") }
    }

    func shutdown() {
        session.invalidateAndCancel()
        server.shutdown()
    }

    /// The raw baseline checks what the engine checks: an HTTP 2xx response.
    static func check(_ data: Data, _ response: URLResponse) throws {
        guard let http = response as? HTTPURLResponse, (200...299).contains(http.statusCode) else {
            throw BenchmarkFailure.unexpectedResponse(String(describing: response))
        }
        guard data.count == itemBody.utf8.count else { throw BenchmarkFailure.unexpectedBody(data.count) }
    }
}

enum BenchmarkFailure: Error {
    case unexpectedResponse(String)
    case unexpectedBody(Int)
    case notOpen
}

/// Holds a benchmark's fixture from its setup hook to its teardown hook.
final class FixtureSlot: Sendable {
    private let fixture = Mutex<Fixture?>(nil)

    func open() throws -> Fixture {
        let opened = try Fixture()
        fixture.withLock { $0 = opened }
        return opened
    }

    func close() {
        let closing = fixture.withLock { slot -> Fixture? in
            defer { slot = nil }
            return slot
        }
        closing?.shutdown()
    }
}

// MARK: - Dedup storm

enum StormMetrics {
    static let upstreamCalls = BenchmarkMetric.custom("upstream calls", useScalingFactor: false)
    static let waitP50 = BenchmarkMetric.custom("caller wait p50 (µs)", useScalingFactor: false)
    static let waitP99 = BenchmarkMetric.custom("caller wait p99 (µs)", useScalingFactor: false)
}

struct StormResult: Sendable {
    var upstreamCalls: Int
    var startedEvents: Int
    var waitP50: Duration
    var waitP99: Duration
    var waitMax: Duration
    var total: Duration
}

/// Prevents reusing a held path: each storm iteration gets `/storm/N` of its own.
let stormCounter = Atomic<Int>(0)

/// `callers` concurrent identical GETs through one engine against a held route. The response is
/// released only once every caller but the first has joined the shared call (counted from
/// `.deduplicated` events, awaited without sleeping) and the one upstream request has reached the
/// server; then every caller is awaited.
func runStorm(_ fixture: Fixture, callers: Int) async throws -> StormResult {
    let path = "/storm/\(stormCounter.add(1, ordering: .relaxed).newValue)"
    let url = fixture.server.url(path)
    let sink = StormSink(expectedJoins: callers - 1)
    // A fresh engine per storm, so its sink counts this storm's events only.
    let engine = AsyncRequestEngine(session: fixture.session, eventSink: sink)
    let server = fixture.server
    let began = ContinuousClock.now

    let waits = try await withThrowingTaskGroup(of: Duration.self, returning: [Duration].self) { group in
        for _ in 0..<callers {
            group.addTask {
                let start = ContinuousClock.now
                let (data, response) = try await engine.send(Get(url: url))
                let waited = start.duration(to: .now)
                try Fixture.check(data, response)
                return waited
            }
        }
        await sink.waitForJoins()
        await server.waitForHits(path, atLeast: 1)
        server.releaseHeld(path)
        var waits: [Duration] = []
        waits.reserveCapacity(callers)
        for try await waited in group { waits.append(waited) }
        return waits
    }
    let total = began.duration(to: .now)

    let sorted = waits.sorted()
    return StormResult(
        upstreamCalls: server.hits(path),
        startedEvents: sink.startedCount,
        waitP50: sorted.nearestRank(0.50),
        waitP99: sorted.nearestRank(0.99),
        waitMax: sorted.last ?? .zero,
        total: total
    )
}

/// Counts `.started` and `.deduplicated` events and lets one task wait, without polling, until
/// the expected number of callers has joined the shared call.
final class StormSink: RequestEventSink {
    private struct State {
        var started = 0
        var joined = 0
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let expectedJoins: Int
    private let state = Mutex(State())

    init(expectedJoins: Int) {
        self.expectedJoins = expectedJoins
    }

    var startedCount: Int { state.withLock { $0.started } }

    func record(_ event: RequestEvent) async {
        let ready = state.withLock { state -> CheckedContinuation<Void, Never>? in
            switch event {
            case .started: state.started += 1
            case .deduplicated: state.joined += 1
            default: return nil
            }
            guard state.joined >= expectedJoins, let waiter = state.waiter else { return nil }
            state.waiter = nil
            return waiter
        }
        ready?.resume()
    }

    /// Returns once `expectedJoins` `.deduplicated` events have been recorded (one waiter at a time).
    func waitForJoins() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.joined >= expectedJoins { return true }
                state.waiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }
}

/// Collects every storm iteration (warm-up included) and prints a summary at teardown, so the
/// figures appear in the run's output next to the benchmark tables.
final class StormReport: Sendable {
    private let results = Mutex<[StormResult]>([])

    func add(_ result: StormResult) {
        results.withLock { $0.append(result) }
    }

    func print() {
        let all = results.withLock { $0 }
        guard !all.isEmpty else { return }
        let p99s = all.map(\.waitP99).sorted()
        let p50s = all.map(\.waitP50).sorted()
        let maxima = all.map(\.waitMax).sorted()
        let upstream = Set(all.map(\.upstreamCalls)).sorted()
        Swift.print("""
            dedup storm 10 000: \(all.count) storms (warm-up included), upstream calls per storm: \(upstream)
              per-caller wait p50: median \(p50s.nearestRank(0.5).formattedMilliseconds) over storms
              per-caller wait p99: median \(p99s.nearestRank(0.5).formattedMilliseconds), \
            min \(p99s.first?.formattedMilliseconds ?? "-"), max \(p99s.last?.formattedMilliseconds ?? "-") over storms
              slowest caller: median \(maxima.nearestRank(0.5).formattedMilliseconds) over storms
            """)
    }
}

extension Array where Element == Duration {
    /// Nearest-rank percentile of an ascending array (`.zero` when empty).
    func nearestRank(_ fraction: Double) -> Duration {
        guard !isEmpty else { return .zero }
        let rank = Int((Double(count) * fraction).rounded(.up))
        return self[Swift.min(Swift.max(rank, 1), count) - 1]
    }
}

extension Duration {
    var microseconds: Int {
        let (seconds, attoseconds) = components
        return Int(seconds) * 1_000_000 + Int(attoseconds / 1_000_000_000_000)
    }

    var formattedMilliseconds: String {
        String(format: "%.2f ms", Double(microseconds) / 1000)
    }
}
