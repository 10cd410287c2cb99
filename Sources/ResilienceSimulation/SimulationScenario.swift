import Auth
import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// A whole client stack built on a ``Simulation``, a random workload driven through it, and the
/// invariants checked as it runs: one configuration of the package, run under one seed per call.
///
/// The scenarios:
/// - ``engine``: `AsyncRequestEngine` with retries (seeded jitter), a retry budget, a per-host
///   concurrency limit with a wait line, and deduplicated reads, over a faulty host; readers storm
///   shared documents, writers send idempotent writes, some callers cancel, some carry deadlines.
/// - ``auth``: the same behind `AuthenticatedRequestEngine` and one `TokenRefreshCoordinator`,
///   with the server revoking tokens at random moments (401 storms) and refreshes that are slow,
///   fail, or outlast the refresh timeout.
/// - ``queue``: `OfflineQueueEngine` on a `DiskQueueStore` (drained by its own passes or a
///   `DrainService`) across connectivity flips, network and disk faults, restarts, power cuts and
///   priority changes (see `SimulationScenario+Queue.swift`).
/// - ``concurrentDeliveries``: the queue's workload with `maxConcurrentDeliveries` 2...16 and
///   four ordering keys.
/// - ``cache``: two users' `CachedRequestEngine`s on one `DiskResponseCache`, documents changing
///   on the server, callers' own revalidations, disk faults and power cuts (see
///   `SimulationScenario+Cache.swift`).
/// - ``offlineFirst``: an `OfflineFirstClient` editing documents while screens read them, across
///   relaunches and power cuts: what the app saved shows in every read that begins after (see
///   `SimulationScenario+OfflineFirst.swift`).
///
/// Invariants (a violated one is reported with the seed and the command that replays it):
/// every caller gets an answer (no waiter is left suspended); no request outlives its deadline
/// on the virtual clock; the deduplicating origin sees at most one effect per logical write;
/// no request is sent more often than its retry policy allows, and retries stay within the
/// retry budget; at most one token refresh runs at a time and no more start than revocations
/// and failures explain; every acknowledged queue entry is delivered across disk faults and
/// power cuts, the newest acknowledged edit of a coalescing key is the one that lands, and each
/// ordering key's writes land in order; the cache serves nothing as fresh that the origin did not
/// confirm within its lifetime, no `no-store` response from the store, nothing across
/// partitions, no file a crash cut; an offline-first read shows what the app saved before it
/// began. Each scenario's file says exactly what it checks.
public struct SimulationScenario: Sendable, Hashable, CustomStringConvertible {
    /// The scenario's name (`resilience-demo simulate --scenario NAME`).
    public let name: String

    public var description: String { name }

    /// The request engine's strategies under faults, cancellation and deadlines.
    public static let engine = SimulationScenario(name: "engine")
    /// Token refresh under 401 storms, over the engine.
    public static let auth = SimulationScenario(name: "auth")

    /// The offline queue across connectivity flips, faults and restarts.
    public static let queue = SimulationScenario(name: "queue")

    /// Two users' caches on one store, documents changing on the server, own revalidations.
    public static let cache = SimulationScenario(name: "cache")

    /// An offline-first app: edits shown at once and across relaunches, reads that meet them.
    public static let offlineFirst = SimulationScenario(name: "offline-first")

    /// Devices editing shared notes offline against an origin that versions them: conflicts.
    public static let conflicts = SimulationScenario(name: "conflicts")

    /// The offline queue's workload with many entries in flight at once
    /// (`maxConcurrentDeliveries` 2...16): each ordering key still one at a time, in order.
    public static let concurrentDeliveries = SimulationScenario(name: "concurrent-deliveries")

    /// Every scenario.
    public static let all: [SimulationScenario] = [.engine, .auth, .queue, .cache, .offlineFirst, .conflicts, .concurrentDeliveries]

    /// The scenario called `name`, if there is one.
    public init?(named name: String) {
        guard let scenario = Self.all.first(where: { $0.name == name }) else { return nil }
        self = scenario
    }

    private init(name: String) {
        self.name = name
    }

    /// Runs this scenario under `seed` and checks its invariants.
    public func run(seed: UInt64) -> SimulationReport {
        let violations = Locked<[String]>([])
        let run = Simulation.run(seed: seed, timeLimit: .seconds(3_600)) { simulation in
            let found: [String]
            switch name {
            case "auth": found = await ClientWorkload(simulation: simulation, authenticated: true).run()
            case "queue": found = await QueueWorkload(simulation: simulation).run()
            case "concurrent-deliveries": found = await QueueWorkload(simulation: simulation, concurrentDeliveries: true).run()
            case "cache": found = await CacheWorkload(simulation: simulation).run()
            case "offline-first": found = await OfflineFirstWorkload(simulation: simulation).run()
            case "conflicts": found = await ConflictsWorkload(simulation: simulation).run()
            default: found = await ClientWorkload(simulation: simulation, authenticated: false).run()
            }
            violations.withLock { $0 = found }
        }
        var all = violations.withLock { $0 }
        if run.escapedJobs > 0 {
            all.append("\(run.escapedJobs) jobs reached the scheduler from another thread: the run depends on more than its seed")
        }
        switch run.ending {
        case .finished: break
        case .stuck(let waiting):
            all.append("a waiter was left suspended: every task waits and nothing will wake one (at \(run.elapsed); waiting at \(waiting.joined(separator: ", ")))")
        case .timeLimit: all.append("the run did not finish within \(Duration.seconds(3_600)) of virtual time")
        case .violated(let invariant): all.append(invariant)
        case .stepLimit: all.append("20 million steps without finishing: tasks keep running while time stands still (a livelock)")
        }
        return SimulationReport(scenario: self, run: run, violations: all)
    }
}

/// What one scenario run under one seed found.
public struct SimulationReport: Sendable {
    /// The scenario.
    public let scenario: SimulationScenario
    /// The run: seed, ending, trace.
    public let run: Simulation.Run
    /// Invariants violated, one line each; empty when the run passed.
    public let violations: [String]

    /// Whether every invariant held.
    public var passed: Bool { violations.isEmpty }

    /// The command that replays this run exactly.
    public var replayCommand: String {
        "swift run resilience-demo simulate --scenario \(scenario.name) --seed \(run.seed)"
    }
}

/// The package's own exponential backoff (`ExponentialRetryPolicy`, full jitter, capped at 1 024
/// times the base), its jitter drawn from the simulation's seed.
struct SeededRetryPolicy: RetryPolicy {
    let simulation: Simulation
    let maxRetries: Int
    let base: Duration

    func delay(forAttempt attempt: Int) -> TimeInterval? {
        var random = SimulationRandom(simulation: simulation)
        return ExponentialRetryPolicy(maxRetries: maxRetries, baseDelay: base.seconds, maxDelay: base.seconds * 1_024, jitter: .full)
            .delay(forAttempt: attempt, using: &random)
    }
}

extension Simulation {
    /// The request engine the queue, cache and offline-first scenarios build on: the simulated
    /// network, one retry with seeded backoff.
    func makeRequestEngine() -> AsyncRequestEngine {
        AsyncRequestEngine(
            session: network,
            configuration: .init(retry: .init(policy: SeededRetryPolicy(simulation: self, maxRetries: 1, base: .milliseconds(100)))),
            clock: clock
        )
    }
}

/// Draws from the simulation's seed, for APIs that take a `RandomNumberGenerator`.
struct SimulationRandom: RandomNumberGenerator {
    let simulation: Simulation

    mutating func next() -> UInt64 { simulation.nextRandom() }
}

/// A request of the simulated workload.
struct SimulatedRequest: NetworkRequest {
    var url: URL
    var method: HTTPMethod
    var headers: [String: String] = [:]
    var body: Data?
    var timeout: TimeInterval = 2
    var deadline: Duration?
}

/// A token provider that refreshes against the origin, slowly, sometimes failing and sometimes
/// outlasting the coordinator's refresh timeout; it records every refresh for the invariants.
final class SimulatedTokenProvider: TokenProvider {
    struct Refresh {
        var started: Duration
        var ended: Duration?
        var succeeded = false
    }

    private let simulation: Simulation
    private let state = Locked<(token: String?, refreshes: [Refresh])>((nil, []))

    init(simulation: Simulation) {
        self.simulation = simulation
    }

    var refreshes: [Refresh] { state.withLock { $0.refreshes } }

    func currentToken() async -> String? { state.withLock { $0.token } }

    func refreshToken() async throws -> String {
        let index = state.withLock { state in
            state.refreshes.append(Refresh(started: simulation.now))
            return state.refreshes.count - 1
        }
        simulation.record("refresh \(index) started")
        let slow = simulation.chance(0.1)
        let latency = slow ? simulation.random(in: .seconds(5)...(.seconds(40))) : simulation.random(in: .milliseconds(20)...(.milliseconds(400)))
        do {
            try await simulation.clock.sleep(for: latency)
        } catch {
            state.withLock { $0.refreshes[index].ended = simulation.now }
            throw error
        }
        let fails = simulation.chance(0.15)
        let token = fails ? nil : simulation.origin.issueToken()
        state.withLock { state in
            state.refreshes[index].ended = simulation.now
            state.refreshes[index].succeeded = token != nil
            if let token { state.token = token }
        }
        simulation.record("refresh \(index) \(token.map { "gave \($0)" } ?? "failed")")
        guard let token else { throw URLError(.userAuthenticationRequired) }
        return token
    }
}

/// The engine and auth scenarios: concurrent callers reading and writing through one engine.
struct ClientWorkload {
    let simulation: Simulation
    let authenticated: Bool

    static let host = "api.sim"
    static let callers = 8
    static let operations = 12
    static let documents = 4
    static let maxRetries = 3
    static let refreshTimeout = Duration.seconds(10)

    private struct Outcome {
        var name: String
        var started: Duration
        var ended: Duration
        var deadline: Duration?
        /// Time the scheduler held this request's tasks in opened windows (see `PauseLedger`).
        var paused: Duration
        var result: String
    }

    func run() async -> [String] {
        let simulation = simulation
        simulation.network.setHost(
            Self.host,
            .init(
                latency: .milliseconds(5)...(.milliseconds(120)),
                faults: .init(refused: 0.03, resetBefore: 0.03, resetAfter: 0.04, timeout: 0.03, serverError: 0.05, throttled: 0.03)
            )
        )
        let budget = RetryBudget(retryRatio: 0.2, minRetriesPerSecond: 1, maxBalance: 10, clock: simulation.clock)
        let engine = AsyncRequestEngine(
            session: simulation.network,
            configuration: .init(
                retry: .init(policy: SeededRetryPolicy(simulation: simulation, maxRetries: Self.maxRetries, base: .milliseconds(100)), budget: budget),
                limits: .init(concurrencyPerHost: 3, waitingPerHost: 100)
            ),
            clock: simulation.clock
        )
        let provider = SimulatedTokenProvider(simulation: simulation)
        let sender: any RequestSending
        if authenticated {
            simulation.origin.requiresToken = true
            let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: Self.refreshTimeout, clock: simulation.clock)
            sender = AuthenticatedRequestEngine(requestEngine: engine, coordinator: coordinator, maxConcurrentRequests: 6)
        } else {
            sender = engine
        }
        let outcomes = Locked<[Outcome]>([])
        let revocations = Locked(0)
        await withTaskGroup(of: Void.self) { group in
            if authenticated {
                group.addTask {
                    // The server revokes every token at random moments: a 401 storm each time.
                    for _ in 0..<4 {
                        try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(200)...(.seconds(4))))
                        simulation.origin.revokeTokens()
                        revocations.withLock { $0 += 1 }
                        simulation.record("server revokes tokens")
                    }
                }
            }
            for caller in 0..<Self.callers {
                group.addTask {
                    for operation in 0..<Self.operations {
                        try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.milliseconds(400))))
                        let outcome = await perform(caller: caller, operation: operation, sender: sender)
                        outcomes.withLock { $0.append(outcome) }
                    }
                }
            }
        }
        return check(outcomes.withLock { $0 }, provider: provider, revocations: revocations.withLock { $0 })
    }

    private func perform(caller: Int, operation: Int, sender: any RequestSending) async -> Outcome {
        let simulation = simulation
        let name = "c\(caller).\(operation)"
        let document = "d\(simulation.random(in: 0...(Self.documents - 1)))"
        let url = URL(string: "https://\(Self.host)/docs/\(document)")!
        var draft = SimulatedRequest(url: url, method: .get)
        let write = simulation.chance(0.4)
        if write {
            draft.method = .put
            draft.body = Data("\(caller * 1_000 + operation)".utf8)
            draft.headers = ["Idempotency-Key": "k-\(name)", "X-Sim-Mutation": name, "X-Sim-Request": name]
        }
        if simulation.chance(0.5) { draft.deadline = simulation.random(in: .milliseconds(100)...(.seconds(3))) }
        // Some callers give up at once (a screen closed as it opened), some a little later.
        let cancelAfter: Duration? =
            simulation.chance(0.15) ? (simulation.chance(0.3) ? .zero : simulation.random(in: .zero...(.milliseconds(300)))) : nil
        let request = draft
        let started = simulation.now
        let ledger = PauseLedger()
        let call = Task { () -> String in
            await PauseLedger.$current.withValue(ledger) {
                do {
                    let (data, response) = try await sender.response(for: request)
                    return "\(response.statusCode) \(String(decoding: data, as: UTF8.self))"
                } catch let error as NetworkError {
                    return "error \(error)"
                } catch {
                    return "error \(type(of: error))"
                }
            }
        }
        if let cancelAfter {
            Task {
                try? await simulation.clock.sleep(for: cancelAfter)
                call.cancel()
            }
        }
        let result = await call.value
        let line = "\(name) \(request.method.rawValue) \(document)\(request.deadline.map { " deadline \(Int($0 / .milliseconds(1)))ms" } ?? "")\(cancelAfter == nil ? "" : " cancellable") -> \(result)"
        simulation.record(line)
        return Outcome(name: name, started: started, ended: simulation.now, deadline: request.deadline, paused: ledger.paused, result: result)
    }

    private func check(_ outcomes: [Outcome], provider: SimulatedTokenProvider, revocations: Int) -> [String] {
        var violations: [String] = []
        let expected = Self.callers * Self.operations
        if outcomes.count != expected { violations.append("\(expected - outcomes.count) callers never got an answer") }
        for outcome in outcomes {
            // A deadline is kept up to the time the scheduler held the request's own tasks, as
            // a preempted thread would be late by as much.
            if let deadline = outcome.deadline, outcome.ended - outcome.started > deadline + outcome.paused {
                violations.append(
                    "\(outcome.name) outlived its deadline of \(deadline): answered after \(outcome.ended - outcome.started) (\(outcome.paused) of it held by the scheduler)"
                )
            }
        }
        for (mutation, count) in simulation.origin.allEffects where count > 1 {
            violations.append("write \(mutation) took effect \(count) times (one Idempotency-Key per write)")
        }
        let attempts = simulation.network.attemptsByRequest
        // Each send makes at most maxRetries + 1 attempts; behind Auth a 401 adds one more send.
        let allowed = (Self.maxRetries + 1) * (authenticated ? 2 : 1)
        for (name, count) in attempts where count > allowed {
            violations.append("\(name) was sent \(count) times; its policy allows \(allowed)")
        }
        // The budget starts full (10), earns 0.2 per request and 1 per second: retries beyond that
        // spent tokens that were never there.
        let requests = outcomes.count
        let retries = attempts.values.reduce(0) { $0 + max(0, $1 - 1) }
        let budgetAllows = 10 + 0.2 * Double(requests) + simulation.now.seconds + 1
        if Double(retries) > budgetAllows {
            violations.append("\(retries) retries of writes exceed the retry budget's \(Int(budgetAllows))")
        }
        if authenticated {
            let refreshes = provider.refreshes
            for (index, refresh) in refreshes.enumerated() {
                // A refresh is over for the coordinator when it ends or times out.
                for (earlier, other) in refreshes[..<index].enumerated() {
                    let over = min(other.ended ?? .seconds(1 << 40), other.started + Self.refreshTimeout)
                    if refresh.started < over { violations.append("refresh \(index) started while refresh \(earlier) was running") }
                }
            }
            let succeeded = refreshes.filter(\.succeeded).count
            let failed = refreshes.filter { !$0.succeeded }.count
            let timedOut = refreshes.filter { ($0.ended ?? .seconds(1 << 40)) - $0.started > Self.refreshTimeout }.count
            // One refresh for the first token, one per revocation, and one more for each refresh
            // that failed or outlasted the timeout: anything beyond is a refresh loop.
            if refreshes.count > 1 + revocations + failed + timedOut {
                violations.append("\(refreshes.count) refreshes (\(succeeded) succeeded) for \(revocations) revocations, \(failed) failures and \(timedOut) timeouts")
            }
        }
        return violations
    }
}
