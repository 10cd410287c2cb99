import Benchmark
import Foundation
import RequestEngine
import ResilienceTesting
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// What AsyncRequestEngine costs on top of a bare URLSession, measured end to end over loopback HTTP
// against ResilienceTesting's LoopbackHTTPServer. Every engine benchmark has its raw-URLSession
// baseline in the same run, so the ratio can be read off one `swift package benchmark`
// invocation. See ../../README.md for how to run them, what each one measures and the figures.
//
// Each benchmark gets its own server and its own `URLSession(configuration: .ephemeral)`, made
// before its warm-up and shut down after its last iteration, so none inherits another's warm
// connections. The benchmark tool runs the benchmarks in name order, each in a process of its own.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        timeUnits: .microseconds,
        warmupIterations: 50,
        maxDuration: .seconds(8),
        maxIterations: 20_000
    )

    // MARK: 1. One GET at a time

    let rawSequential = FixtureSlot()
    Benchmark(
        "raw URLSession.data(for:) sequential",
        closure: { _, fixture in try await fixture.rawGET(fixture.itemURL) },
        setup: { try rawSequential.open() },
        teardown: { rawSequential.close() }
    )
    let engineSequential = FixtureSlot()
    Benchmark(
        "engine.send sequential",
        closure: { _, fixture in try await fixture.engineGET(fixture.itemURL) },
        setup: { try engineSequential.open() },
        teardown: { engineSequential.close() }
    )

    // MARK: 2. 64 concurrent GETs per iteration, distinct URLs (so the engine cannot deduplicate)

    let concurrentConfiguration = Benchmark.Configuration(
        warmupIterations: 10,
        maxDuration: .seconds(8),
        maxIterations: 2_000
    )
    let rawConcurrent = FixtureSlot()
    Benchmark(
        "raw 64 concurrent",
        configuration: concurrentConfiguration,
        closure: { _, fixture in try await fixture.rawBatch() },
        setup: { try rawConcurrent.open() },
        teardown: { rawConcurrent.close(reportingConnectionsAs: "raw 64 concurrent") }
    )
    let engineConcurrent = FixtureSlot()
    Benchmark(
        "engine 64 concurrent",
        configuration: concurrentConfiguration,
        closure: { _, fixture in try await fixture.engineBatch() },
        setup: { try engineConcurrent.open() },
        teardown: { engineConcurrent.close(reportingConnectionsAs: "engine 64 concurrent") }
    )

    // MARK: 1b and 2b. The same two comparisons, interleaved in one process

    // The separate raw and engine benchmarks above run in different processes, seconds apart, and
    // on a small VM a whole process's latency can shift by 20 % from one run to the next (how warm
    // the vCPUs are, where the threads land). These two alternate raw and engine operations on one
    // session (raw, engine, engine, raw, …), so both sides see the same conditions; they also
    // report the process CPU time (all threads) each operation took.
    let sequentialInterleaved = FixtureSlot()
    let sequentialReport = InterleavedReport(label: "engine vs raw sequential, interleaved", unit: "request")
    Benchmark(
        "engine vs raw sequential, interleaved",
        configuration: .init(metrics: InterleavedMetrics.all, warmupIterations: 5, maxDuration: .seconds(10), maxIterations: 1_000),
        closure: { benchmark, fixture in
            let result = try await runInterleaved(
                pairs: 50,
                raw: { try await fixture.rawGET(fixture.itemURL) },
                engine: { try await fixture.engineGET(fixture.itemURL) }
            )
            sequentialReport.add(result)
            result.record(in: benchmark)
        },
        setup: { try sequentialInterleaved.open() },
        teardown: {
            sequentialInterleaved.close()
            sequentialReport.print()
        }
    )
    let concurrentInterleaved = FixtureSlot()
    let concurrentReport = InterleavedReport(label: "engine vs raw 64 concurrent, interleaved", unit: "batch of 64")
    Benchmark(
        "engine vs raw 64 concurrent, interleaved",
        configuration: .init(metrics: InterleavedMetrics.all, warmupIterations: 3, maxDuration: .seconds(10), maxIterations: 1_000),
        closure: { benchmark, fixture in
            let result = try await runInterleaved(
                pairs: 2,
                raw: { try await fixture.rawBatch() },
                engine: { try await fixture.engineBatch() }
            )
            concurrentReport.add(result)
            result.record(in: benchmark)
        },
        setup: { try concurrentInterleaved.open() },
        teardown: {
            concurrentInterleaved.close(reportingConnectionsAs: "engine vs raw 64 concurrent, interleaved")
            concurrentReport.print()
        }
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
            // The point of single flight: 10 000 callers, one request on the wire.
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

/// One benchmark's server, session and engine, and the operations the benchmarks time.
final class Fixture: Sendable {
    let server: LoopbackHTTPServer
    let session: URLSession
    /// An engine with the defaults (no retry policy, no event sink) on `session`.
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

    /// One GET straight through URLSession (the baseline), checked as the engine checks it.
    func rawGET(_ url: URL) async throws {
        let (data, response) = try await session.data(for: URLRequest(url: url), delegate: nil)
        try Self.check(data, response)
    }

    /// One GET through the engine.
    func engineGET(_ url: URL) async throws {
        let (data, response) = try await engine.send(Get(url: url))
        try Self.check(data, response)
    }

    /// `distinctURLs` fetched concurrently straight through URLSession; returns when all 64 have.
    func rawBatch() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for url in distinctURLs {
                group.addTask { try await self.rawGET(url) }
            }
            try await group.waitForAll()
        }
    }

    /// `distinctURLs` fetched concurrently through the engine; returns when all 64 have.
    func engineBatch() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for url in distinctURLs {
                group.addTask { try await self.engineGET(url) }
            }
            try await group.waitForAll()
        }
    }

    /// What the engine checks too: an HTTP 2xx response (and here also the expected body).
    static func check(_ data: Data, _ response: URLResponse) throws {
        guard let http = response as? HTTPURLResponse, (200...299).contains(http.statusCode) else {
            throw BenchmarkFailure.unexpectedResponse(String(describing: response))
        }
        guard data.count == itemBody.utf8.count else { throw BenchmarkFailure.unexpectedBody(byteCount: data.count) }
    }
}

enum BenchmarkFailure: Error {
    case unexpectedResponse(String)
    case unexpectedBody(byteCount: Int)
}

/// Holds a benchmark's fixture from its setup hook to its teardown hook.
final class FixtureSlot: Sendable {
    private let fixture = Mutex<Fixture?>(nil)

    func open() throws -> Fixture {
        let opened = try Fixture()
        fixture.withLock { $0 = opened }
        return opened
    }

    /// Shuts the fixture down; with a `label`, first prints how many connections the session opened.
    func close(reportingConnectionsAs label: String? = nil) {
        let closing = fixture.withLock { slot -> Fixture? in
            defer { slot = nil }
            return slot
        }
        guard let closing else { return }
        if let label {
            print("\(label): URLSession opened \(closing.server.acceptedConnections) connections, at most \(closing.server.peakOpenConnections) at once")
        }
        closing.shutdown()
    }
}

// MARK: - Interleaved comparison

enum InterleavedMetrics {
    static let rawP50 = BenchmarkMetric.custom("raw p50 (µs)", useScalingFactor: false)
    static let engineP50 = BenchmarkMetric.custom("engine p50 (µs)", useScalingFactor: false)
    static let p50Ratio = BenchmarkMetric.custom("engine/raw p50 (‰)", useScalingFactor: false)
    static let rawCPU = BenchmarkMetric.custom("raw CPU, mean (µs)", useScalingFactor: false)
    static let engineCPU = BenchmarkMetric.custom("engine CPU, mean (µs)", useScalingFactor: false)
    static let cpuRatio = BenchmarkMetric.custom("engine/raw CPU (‰)", useScalingFactor: false)
    static let all = [rawP50, engineP50, p50Ratio, rawCPU, engineCPU, cpuRatio]
}

/// Wall-clock and process-CPU durations of individual operations of one kind.
struct OperationSamples: Sendable {
    var wall: [Duration] = []
    var cpu: [Duration] = []

    var wallP50: Duration { wall.sorted().nearestRank(0.5) }
    var cpuMean: Duration { cpu.isEmpty ? .zero : cpu.reduce(.zero, +) / cpu.count }

    mutating func append(contentsOf other: OperationSamples) {
        wall += other.wall
        cpu += other.cpu
    }
}

struct InterleavedResult: Sendable {
    var raw = OperationSamples()
    var engine = OperationSamples()

    var p50RatioPermille: Int { permille(engine.wallP50, raw.wallP50) }
    var cpuRatioPermille: Int { permille(engine.cpuMean, raw.cpuMean) }

    /// This iteration's figures as the benchmark's custom metrics.
    func record(in benchmark: Benchmark) {
        benchmark.measurement(InterleavedMetrics.rawP50, raw.wallP50.microseconds)
        benchmark.measurement(InterleavedMetrics.engineP50, engine.wallP50.microseconds)
        benchmark.measurement(InterleavedMetrics.p50Ratio, p50RatioPermille)
        benchmark.measurement(InterleavedMetrics.rawCPU, raw.cpuMean.microseconds)
        benchmark.measurement(InterleavedMetrics.engineCPU, engine.cpuMean.microseconds)
        benchmark.measurement(InterleavedMetrics.cpuRatio, cpuRatioPermille)
    }
}

func permille(_ numerator: Duration, _ denominator: Duration) -> Int {
    guard denominator > .zero else { return 0 }
    return Int((numerator / denominator * 1000).rounded())
}

/// CPU time consumed so far by the whole process (every thread: caller, URLSession, server).
func processCPUTime() -> Duration {
    var now = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
    return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
}

/// Runs `pairs` raw and `pairs` engine operations one at a time, alternating which of a pair goes
/// first (raw, engine, engine, raw, …) so that neither side always runs right after the other.
func runInterleaved(
    pairs: Int,
    raw: () async throws -> Void,
    engine: () async throws -> Void
) async throws -> InterleavedResult {
    var result = InterleavedResult()
    for pair in 0..<pairs {
        for engineTurn in pair.isMultiple(of: 2) ? [false, true] : [true, false] {
            let wallStart = ContinuousClock.now
            let cpuStart = processCPUTime()
            if engineTurn { try await engine() } else { try await raw() }
            let cpu = processCPUTime() - cpuStart
            let wall = wallStart.duration(to: .now)
            if engineTurn {
                result.engine.wall.append(wall)
                result.engine.cpu.append(cpu)
            } else {
                result.raw.wall.append(wall)
                result.raw.cpu.append(cpu)
            }
        }
    }
    return result
}

/// Pools every interleaved iteration (warm-up included) and prints the overall figures at teardown.
final class InterleavedReport: Sendable {
    private let label: String
    private let unit: String
    private let pooled = Mutex(InterleavedResult())

    init(label: String, unit: String) {
        self.label = label
        self.unit = unit
    }

    func add(_ result: InterleavedResult) {
        pooled.withLock { pooled in
            pooled.raw.append(contentsOf: result.raw)
            pooled.engine.append(contentsOf: result.engine)
        }
    }

    func print() {
        let all = pooled.withLock { $0 }
        guard !all.raw.wall.isEmpty else { return }
        let raw = all.raw.wall.sorted()
        let engine = all.engine.wall.sorted()
        Swift.print(
            """
            \(label): \(raw.count) raw and \(engine.count) engine operations (one \(unit) each, warm-up included)
              wall p50: raw \(raw.nearestRank(0.5).microseconds) µs, engine \(engine.nearestRank(0.5).microseconds) µs, \
            engine/raw \(String(format: "%.3f", Double(all.p50RatioPermille) / 1000))
              wall p99: raw \(raw.nearestRank(0.99).microseconds) µs, engine \(engine.nearestRank(0.99).microseconds) µs
              process CPU per operation (mean): raw \(all.raw.cpuMean.microseconds) µs, \
            engine \(all.engine.cpuMean.microseconds) µs, engine/raw \(String(format: "%.3f", Double(all.cpuRatioPermille) / 1000))
            """)
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
}

/// Numbers the storms, so that each one gets a held path (`/storm/N`) of its own.
let stormCounter = Atomic<Int>(0)

/// `callers` concurrent identical GETs through one engine against a held route. The response is
/// released only once every caller but the first has joined the shared call (counted from
/// `.deduplicated` events, awaited without sleeping) and the one upstream request has reached the
/// server; then every caller is awaited. A caller's wait runs from just before its `send` to its
/// return.
///
/// The callers are unstructured tasks, as independent callers in an app would be, not children of
/// one task group: Swift's task group removes each finished child by walking its list of
/// children, so collecting 10 000 children costs O(n²) and on this machine tripled the storm's
/// duration and inflated the measured waits — a cost of the harness, not of the engine.
func runStorm(_ fixture: Fixture, callers: Int) async throws -> StormResult {
    let path = "/storm/\(stormCounter.add(1, ordering: .relaxed).newValue)"
    let url = fixture.server.url(path)
    let sink = StormSink(expectedJoins: callers - 1)
    // A fresh engine per storm, so that its sink counts this storm's events only.
    let engine = AsyncRequestEngine(session: fixture.session, eventSink: sink)
    let server = fixture.server
    let waits = WaitCollector(expected: callers)

    for _ in 0..<callers {
        Task {
            let start = ContinuousClock.now
            do {
                let (data, response) = try await engine.send(Get(url: url))
                let waited = start.duration(to: .now)
                try Fixture.check(data, response)
                waits.add(.success(waited))
            } catch {
                waits.add(.failure(error))
            }
        }
    }
    await sink.waitForJoins()
    await server.waitForHits(path, atLeast: 1)
    server.releaseHeld(path)

    let sorted = try await waits.all().sorted()
    return StormResult(
        upstreamCalls: server.hits(path),
        startedEvents: sink.startedCount,
        waitP50: sorted.nearestRank(0.50),
        waitP99: sorted.nearestRank(0.99),
        waitMax: sorted.last ?? .zero
    )
}

/// Collects the callers' waits and lets one task wait, without polling, until all have reported.
final class WaitCollector: Sendable {
    private struct State {
        var waits: [Duration] = []
        var failure: (any Error)?
        var reported = 0
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let expected: Int
    private let state: Mutex<State>

    init(expected: Int) {
        self.expected = expected
        var initial = State()
        initial.waits.reserveCapacity(expected)
        state = Mutex(initial)
    }

    func add(_ outcome: Result<Duration, any Error>) {
        let ready = state.withLock { state -> CheckedContinuation<Void, Never>? in
            switch outcome {
            case .success(let waited): state.waits.append(waited)
            case .failure(let error): state.failure = state.failure ?? error
            }
            state.reported += 1
            guard state.reported == expected, let waiter = state.waiter else { return nil }
            state.waiter = nil
            return waiter
        }
        ready?.resume()
    }

    /// Every caller's wait, once all have reported; throws the first caller's error if any failed.
    func all() async throws -> [Duration] {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if state.reported == expected { return true }
                state.waiter = continuation
                return false
            }
            if done { continuation.resume() }
        }
        let (waits, failure) = state.withLock { ($0.waits, $0.failure) }
        if let failure { throw failure }
        return waits
    }
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

/// Collects every storm (warm-up included) and prints a summary at teardown, so that the upstream
/// call count and the wait percentiles appear in the run's output next to the tables.
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
        Swift.print(
            """
            dedup storm 10 000: \(all.count) storms (warm-up included), upstream calls per storm: \(upstream)
              per-caller wait p50: median \(p50s.nearestRank(0.5).formattedMilliseconds) over the storms
              per-caller wait p99: median \(p99s.nearestRank(0.5).formattedMilliseconds), \
            min \(p99s.first?.formattedMilliseconds ?? "-"), max \(p99s.last?.formattedMilliseconds ?? "-") over the storms
              slowest caller: median \(maxima.nearestRank(0.5).formattedMilliseconds) over the storms
            """)
    }
}

// MARK: - Small helpers

extension Array where Element == Duration {
    /// Nearest-rank percentile of an ascending array (`.zero` when empty).
    func nearestRank(_ fraction: Double) -> Duration {
        guard !isEmpty else { return .zero }
        let rank = Int((Double(count) * fraction).rounded(.up))
        return self[Swift.min(Swift.max(rank, 1), count) - 1]
    }
}

extension Duration {
    /// Whole microseconds (truncated).
    var microseconds: Int {
        let (seconds, attoseconds) = components
        return Int(seconds) * 1_000_000 + Int(attoseconds / 1_000_000_000_000)
    }

    var formattedMilliseconds: String {
        String(format: "%.2f ms", Double(microseconds) / 1000)
    }
}
