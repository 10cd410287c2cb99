import Auth
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

// What a 401 storm costs AuthenticatedRequestEngine: 10 000 concurrent GETs of distinct URLs sent
// with a token the server rejects (one shared refresh, then one retry each), against the same
// 10 000 GETs sent with a token the server accepts, and against 10 000 GETs whose rejected token
// the provider reports as expired (the coordinator refreshes before sending). All three run in
// one process, in rotating order, on one server and one session, so the ratios are read off one
// run. See ../../README.md.

let benchmarks: @Sendable () -> Void = {
    let slot = AuthFixtureSlot()
    let report = AuthStormReport()
    Benchmark(
        "auth 401 storm vs valid token, 10 000 requests, interleaved",
        configuration: .init(
            metrics: AuthMetrics.all,
            warmupIterations: 1,
            maxDuration: .seconds(90),
            maxIterations: 8
        ),
        closure: { benchmark, fixture in
            // Rotate which side goes first: valid, storm, known expiry | storm, known expiry, valid | …
            let order = fixture.nextIterationOrder()
            var results: [AuthBatchKind: AuthBatchResult] = [:]
            for kind in order {
                results[kind] = try await fixture.batch(requests: 10_000, kind: kind)
            }
            guard let valid = results[.valid], let storm = results[.storm401], let known = results[.knownExpiry],
                let admission = results[.storm401Admission]
            else { return }
            // The point of the coordinator: 10 000 rejected requests, one refresh.
            precondition(storm.refreshes == 1, "401 storm: \(storm.refreshes) refreshes (want 1)")
            precondition(known.refreshes == 1, "known expiry: \(known.refreshes) refreshes (want 1)")
            precondition(admission.refreshes == 1, "storm with admission limit: \(admission.refreshes) refreshes (want 1)")
            precondition(valid.refreshes == 0, "valid token: \(valid.refreshes) refreshes (want 0)")
            let iteration = AuthIteration(valid: valid, storm: storm, knownExpiry: known, admission: admission)
            iteration.record(in: benchmark)
            report.add(iteration)
        },
        setup: { try slot.open() },
        teardown: {
            slot.close()
            report.print()
        }
    )
}

// MARK: - Fixture

/// The small body every request gets with an accepted token.
let authItemBody = "{\"id\":1,\"name\":\"item\"}"

struct AuthGet: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

/// The token the server accepts right now.
final class ServerToken: Sendable {
    private let token = Mutex<String>("")
    var value: String {
        get { token.withLock { $0 } }
        set { token.withLock { $0 = newValue } }
    }
}

/// A provider whose refresh returns (and then reports as current) a token the server accepts.
final class BenchTokenProvider: TokenProvider {
    private struct State {
        var current: String
        var refreshes = 0
    }
    private let state: Mutex<State>
    private let refreshed: String
    private let currentExpiry: Date?

    /// `currentExpiry`: the expiry reported for `current` (none once refreshed).
    init(current: String, refreshed: String, currentExpiry: Date? = nil) {
        state = Mutex(State(current: current))
        self.refreshed = refreshed
        self.currentExpiry = currentExpiry
    }

    func tokenExpiry() async -> Date? {
        state.withLock { $0.refreshes == 0 } ? currentExpiry : nil
    }

    var refreshCount: Int { state.withLock { $0.refreshes } }

    func currentToken() async -> String? { state.withLock { $0.current } }

    func refreshToken() async throws -> String {
        state.withLock {
            $0.refreshes += 1
            $0.current = refreshed
        }
        return refreshed
    }
}

/// The three batches of an iteration.
enum AuthBatchKind: Sendable, Hashable {
    /// The provider's token is accepted.
    case valid
    /// The provider's token is rejected with 401 and no expiry is known: one refresh, one retry each.
    case storm401
    /// The provider's token is rejected, but the provider reports that it expired a minute ago:
    /// the coordinator refreshes before sending.
    case knownExpiry
    /// A 401 storm through an engine with `maxConcurrentRequests: 64`: requests not yet admitted
    /// when the refresh starts go out with the new token.
    case storm401Admission
}

struct AuthBatchResult: Sendable {
    var duration: Duration
    var cpu: Duration
    var refreshes: Int
    /// Requests the server saw in this batch, and how many of those it rejected with 401.
    var serverRequests: Int
    var rejected: Int
}

final class AuthFixture: Sendable {
    let server: LoopbackHTTPServer
    let session: URLSession
    let engine: AsyncRequestEngine
    let serverToken = ServerToken()
    private let counters = AuthCounters()

    init() throws {
        server = try LoopbackHTTPServer()
        session = URLSession(configuration: .ephemeral)
        engine = AsyncRequestEngine(session: session)
        let serverToken = self.serverToken
        let counters = self.counters
        server.route(
            "/auth/*",
            handler: { request in
                if request.header("authorization") == "Bearer " + serverToken.value {
                    return .ok(authItemBody)
                }
                counters.withLock { $0.rejected += 1 }
                return .status(401)
            })
    }

    func shutdown() {
        session.invalidateAndCancel()
        server.shutdown()
    }

    /// valid, storm, known expiry; then storm, known expiry, valid; then known expiry, valid, storm; …
    func nextIterationOrder() -> [AuthBatchKind] {
        let rotation = counters.withLock { counters in
            defer { counters.iteration += 1 }
            return counters.iteration % 4
        }
        let kinds: [AuthBatchKind] = [.valid, .storm401, .knownExpiry, .storm401Admission]
        return Array(kinds[rotation...] + kinds[..<rotation])
    }

    /// `requests` concurrent GETs of distinct URLs (`/auth/<batch>/<n>`) through a fresh
    /// coordinator and authenticated engine over the shared engine. Except for `.valid`, the
    /// provider's token is one the server rejects and its refresh returns the accepted one.
    func batch(requests: Int, kind: AuthBatchKind) async throws -> AuthBatchResult {
        let expired = kind != .valid
        let batch = counters.withLock { counters in
            counters.batch += 1
            counters.rejected = 0
            return counters.batch
        }
        let accepted = "token-\(batch)"
        serverToken.value = accepted
        let provider = BenchTokenProvider(
            current: expired ? "expired-\(batch)" : accepted,
            refreshed: accepted,
            currentExpiry: kind == .knownExpiry ? Date().addingTimeInterval(-60) : nil
        )
        let authenticated = AuthenticatedRequestEngine(
            requestEngine: engine,
            coordinator: TokenRefreshCoordinator(provider: provider),
            maxConcurrentRequests: kind == .storm401Admission ? 64 : nil
        )
        let urls = (0..<requests).map { server.url("/auth/\(batch)/\($0)") }
        let hitsBefore = server.totalHits
        let outcomes = AuthOutcomes(expected: requests)

        let cpuStart = authProcessCPUTime()
        let start = ContinuousClock.now
        for url in urls {
            Task {
                do {
                    let (data, _) = try await authenticated.send(AuthGet(url: url))
                    outcomes.add(data.count == authItemBody.utf8.count ? nil : AuthBenchmarkFailure.unexpectedBody(data.count))
                } catch {
                    outcomes.add(error)
                }
            }
        }
        if let failure = await outcomes.all() { throw failure }
        let duration = start.duration(to: .now)
        let cpu = authProcessCPUTime() - cpuStart
        return AuthBatchResult(
            duration: duration,
            cpu: cpu,
            refreshes: provider.refreshCount,
            serverRequests: server.totalHits - hitsBefore,
            rejected: counters.withLock { $0.rejected }
        )
    }
}

/// Batch and iteration numbers, and the 401s the server answered in the current batch.
final class AuthCounters: Sendable {
    struct Values {
        var batch = 0
        var iteration = 0
        var rejected = 0
    }
    private let values = Mutex(Values())

    func withLock<R>(_ body: (inout Values) -> R) -> R {
        values.withLock { body(&$0) }
    }
}

enum AuthBenchmarkFailure: Error {
    case unexpectedBody(Int)
}

/// Waits, without polling, for every unstructured caller; keeps the first failure.
final class AuthOutcomes: Sendable {
    private struct State {
        var reported = 0
        var failure: (any Error)?
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let expected: Int
    private let state = Mutex(State())

    init(expected: Int) { self.expected = expected }

    func add(_ failure: (any Error)?) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.reported += 1
            if state.failure == nil { state.failure = failure }
            guard state.reported == expected else { return nil }
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func all() async -> (any Error)? {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if state.reported == expected { return true }
                state.waiter = continuation
                return false
            }
            if done { continuation.resume() }
        }
        return state.withLock { $0.failure }
    }
}

final class AuthFixtureSlot: Sendable {
    private let fixture = Mutex<AuthFixture?>(nil)

    func open() throws -> AuthFixture {
        let opened = try AuthFixture()
        fixture.withLock { $0 = opened }
        return opened
    }

    func close() {
        let closing = fixture.withLock { slot -> AuthFixture? in
            defer { slot = nil }
            return slot
        }
        closing?.shutdown()
    }
}

// MARK: - Metrics and report

enum AuthMetrics {
    static let validMilliseconds = BenchmarkMetric.custom("valid token batch (ms)", useScalingFactor: false)
    static let stormMilliseconds = BenchmarkMetric.custom("401 storm batch (ms)", useScalingFactor: false)
    static let ratio = BenchmarkMetric.custom("storm/valid wall (‰)", useScalingFactor: false)
    static let cpuRatio = BenchmarkMetric.custom("storm/valid CPU (‰)", useScalingFactor: false)
    static let rejected = BenchmarkMetric.custom("storm requests rejected 401", useScalingFactor: false)
    static let knownMilliseconds = BenchmarkMetric.custom("known expiry batch (ms)", useScalingFactor: false)
    static let knownRatio = BenchmarkMetric.custom("known expiry/valid wall (‰)", useScalingFactor: false)
    static let admissionRatio = BenchmarkMetric.custom("storm with admission limit 64/valid wall (‰)", useScalingFactor: false)
    static let admissionRejected = BenchmarkMetric.custom("storm with admission limit: rejected 401", useScalingFactor: false)
    static let all = [validMilliseconds, stormMilliseconds, ratio, cpuRatio, rejected, knownMilliseconds, knownRatio, admissionRatio, admissionRejected]
}

struct AuthIteration: Sendable {
    let valid: AuthBatchResult
    let storm: AuthBatchResult
    let knownExpiry: AuthBatchResult
    let admission: AuthBatchResult

    var admissionRatioPermille: Int { authPermille(admission.duration, valid.duration) }

    var knownRatioPermille: Int { authPermille(knownExpiry.duration, valid.duration) }

    var ratioPermille: Int { authPermille(storm.duration, valid.duration) }
    var cpuRatioPermille: Int { authPermille(storm.cpu, valid.cpu) }

    func record(in benchmark: Benchmark) {
        benchmark.measurement(AuthMetrics.validMilliseconds, valid.duration.authMilliseconds)
        benchmark.measurement(AuthMetrics.stormMilliseconds, storm.duration.authMilliseconds)
        benchmark.measurement(AuthMetrics.ratio, ratioPermille)
        benchmark.measurement(AuthMetrics.cpuRatio, cpuRatioPermille)
        benchmark.measurement(AuthMetrics.rejected, storm.rejected)
        benchmark.measurement(AuthMetrics.knownMilliseconds, knownExpiry.duration.authMilliseconds)
        benchmark.measurement(AuthMetrics.knownRatio, knownRatioPermille)
        benchmark.measurement(AuthMetrics.admissionRatio, admissionRatioPermille)
        benchmark.measurement(AuthMetrics.admissionRejected, admission.rejected)
    }
}

final class AuthStormReport: Sendable {
    private let iterations = Mutex<[AuthIteration]>([])

    func add(_ iteration: AuthIteration) {
        iterations.withLock { $0.append(iteration) }
    }

    func print() {
        let all = iterations.withLock { $0 }
        guard !all.isEmpty else { return }
        let ratios = all.map(\.ratioPermille).sorted()
        let cpuRatios = all.map(\.cpuRatioPermille).sorted()
        let valid = all.map(\.valid.duration).sorted()
        let storm = all.map(\.storm.duration).sorted()
        let known = all.map(\.knownExpiry.duration).sorted()
        let knownRatios = all.map(\.knownRatioPermille).sorted()
        let admissionRatios = all.map(\.admissionRatioPermille).sorted()
        Swift.print(
            """
            auth 401 storm vs valid token (10 000 requests each, \(all.count) interleaved iterations, warm-up included)
              valid token: median \(valid[valid.count / 2].authMilliseconds) ms per batch; 401 storm: median \(storm[storm.count / 2].authMilliseconds) ms
              storm/valid wall: median \(Double(ratios[ratios.count / 2]) / 1000), min \(Double(ratios[0]) / 1000), max \(Double(ratios[ratios.count - 1]) / 1000)
              storm/valid process CPU: median \(Double(cpuRatios[cpuRatios.count / 2]) / 1000)
              refreshes per storm: \(Set(all.map(\.storm.refreshes)).sorted()); requests the server saw per storm: \(Set(all.map(\.storm.serverRequests)).sorted()), of which rejected 401: \(Set(all.map(\.storm.rejected)).sorted())
              known expiry (refresh before sending): median \(known[known.count / 2].authMilliseconds) ms per batch, known/valid wall: median \(Double(knownRatios[knownRatios.count / 2]) / 1000), min \(Double(knownRatios[0]) / 1000), max \(Double(knownRatios[knownRatios.count - 1]) / 1000); requests the server saw: \(Set(all.map(\.knownExpiry.serverRequests)).sorted()), refreshes: \(Set(all.map(\.knownExpiry.refreshes)).sorted())
              401 storm with maxConcurrentRequests 64: storm/valid wall: median \(Double(admissionRatios[admissionRatios.count / 2]) / 1000), min \(Double(admissionRatios[0]) / 1000), max \(Double(admissionRatios[admissionRatios.count - 1]) / 1000); rejected 401 per storm: \(Set(all.map(\.admission.rejected)).sorted())
            """)
    }
}

func authPermille(_ numerator: Duration, _ denominator: Duration) -> Int {
    guard denominator > .zero else { return 0 }
    return Int((numerator / denominator * 1000).rounded())
}

func authProcessCPUTime() -> Duration {
    var now = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
    return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
}

extension Duration {
    var authMilliseconds: Int {
        let (seconds, attoseconds) = components
        return Int(seconds) * 1_000 + Int(attoseconds / 1_000_000_000_000_000)
    }
}
