import ResilienceCore
/// Stops calling a dependency that keeps failing, so it can recover and callers fail fast.
///
/// - **closed**: calls pass; outcomes fill a sliding window of the last `windowSize` calls. When the
///   window holds at least `minimumCalls` outcomes and the share of failures reaches
///   `failureRateThreshold`, the breaker opens.
/// - **open**: `acquire()` returns `nil` (the engine throws `NetworkError.circuitOpen`) until
///   `openDuration` has passed on the injected clock.
/// - **half-open**: the first `halfOpenProbes` calls after that pass as probes; others are refused.
///   One failed probe opens the breaker again for another `openDuration`; when every probe
///   succeeds it closes with an empty window.
///
/// Each permit must be answered exactly once with `record(_:for:)`. `.ignored` (a cancelled call,
/// or one whose failure says nothing about the dependency's health) frees a half-open probe slot
/// without counting. Outcomes of permits handed out before the last state change are ignored, so
/// a slow call that started while closed cannot close a breaker that has since opened.
///
/// The logic is the value type `CircuitBreakerStateMachine`; this class only adds a lock and a clock.
public final class CircuitBreaker: Sendable {
    public struct Configuration: Sendable, Hashable {
        /// Outcomes remembered while closed (count-based sliding window); at least 1.
        public var windowSize: Int
        /// Outcomes needed in the window before the failure rate is judged; 1 ... windowSize.
        public var minimumCalls: Int
        /// Failure share (0 ... 1) at which the breaker opens.
        public var failureRateThreshold: Double
        /// How long the breaker stays open before probing.
        public var openDuration: Duration
        /// Probes allowed while half-open; they must all succeed to close; at least 1.
        public var halfOpenProbes: Int

        public init(
            windowSize: Int = 20,
            minimumCalls: Int = 10,
            failureRateThreshold: Double = 0.5,
            openDuration: Duration = .seconds(30),
            halfOpenProbes: Int = 1
        ) {
            self.windowSize = max(1, windowSize)
            self.minimumCalls = min(max(1, minimumCalls), self.windowSize)
            self.failureRateThreshold = failureRateThreshold.isNaN ? 0.5 : min(1, max(0, failureRateThreshold))
            self.openDuration = max(.zero, openDuration)
            self.halfOpenProbes = max(1, halfOpenProbes)
        }
    }

    public enum State: String, Sendable, Hashable {
        case closed, open, halfOpen
    }

    /// What happened to a permitted call.
    public enum Outcome: Sendable, Hashable {
        case success
        case failure
        /// Neither: the call was cancelled, or failed for a reason unrelated to the dependency's health.
        case ignored
    }

    /// Permission for one call; answer it once with `record(_:for:)`.
    public struct Permit: Sendable, Hashable {
        let generation: UInt64
        let isProbe: Bool
    }

    /// Thrown by `run(_:isFailure:)` while the breaker refuses calls.
    public struct OpenError: Error, Sendable, Hashable {
        /// Time left until the breaker lets a probe through (zero when half-open with all probe slots taken).
        public let retryAfter: Duration
    }

    public let configuration: Configuration
    private let machine: Locked<CircuitBreakerStateMachine>
    private let time: TimeSource

    public init(configuration: Configuration = Configuration(), clock: some Clock<Duration> = ContinuousClock()) {
        self.configuration = configuration
        self.machine = Locked(CircuitBreakerStateMachine(configuration: configuration))
        self.time = TimeSource(clock)
    }

    /// The state now (an open breaker whose timer ran out reports `.halfOpen`).
    public var state: State {
        let now = time.now()
        return machine.withLock { $0.state(now: now) }
    }

    /// A permit for one call, or `nil` when the call must fail fast.
    public func acquire() -> Permit? {
        let now = time.now()
        return machine.withLock { machine in
            switch machine.acquire(now: now) {
            case .allowed(let permit): return permit
            case .rejected: return nil
            }
        }
    }

    /// Time until an open breaker lets a probe through; zero when calls are allowed.
    public var retryAfter: Duration {
        let now = time.now()
        return machine.withLock { $0.remainingOpenTime(now: now) }
    }

    /// Records what happened to the call `permit` allowed.
    public func record(_ outcome: Outcome, for permit: Permit) {
        let now = time.now()
        machine.withLock { $0.record(outcome, for: permit, now: now) }
    }

    /// Runs `operation` through the breaker: throws `OpenError` without running it while open,
    /// otherwise records `.failure` when `isFailure` says so for a thrown error, `.ignored` for
    /// `CancellationError`, and `.success` otherwise.
    public func run<T>(
        isolation: isolated (any Actor)? = #isolation,
        isFailure: (any Error) -> Bool = { _ in true },
        _ operation: () async throws -> T
    ) async throws -> T {
        guard let permit = acquire() else { throw OpenError(retryAfter: retryAfter) }
        do {
            let value = try await operation()
            record(.success, for: permit)
            return value
        } catch {
            record(error is CancellationError ? .ignored : (isFailure(error) ? .failure : .success), for: permit)
            throw error
        }
    }
}

/// The circuit breaker's logic as a value: no lock, no clock, no I/O. Time is passed in as the
/// elapsed `Duration` on the owner's clock, so every transition is testable by hand.
struct CircuitBreakerStateMachine: Sendable {
    enum Decision: Equatable {
        case allowed(CircuitBreaker.Permit)
        case rejected
    }

    private enum Phase {
        /// `outcomes` is a ring buffer of the last `windowSize` results (`true` = failure).
        case closed(outcomes: [Bool], next: Int, failures: Int)
        case open(until: Duration)
        /// `granted` probes handed out so far, `succeeded` of them answered with success.
        case halfOpen(granted: Int, succeeded: Int)
    }

    let configuration: CircuitBreaker.Configuration
    private var phase: Phase = .closed(outcomes: [], next: 0, failures: 0)
    /// Bumped on every transition. A permit carries the generation it was granted in, and its
    /// outcome only counts if the breaker has not changed state since — this guards the race where
    /// a slow call from the closed phase reports "success" while half-open probes are under way.
    private(set) var generation: UInt64 = 0

    init(configuration: CircuitBreaker.Configuration) {
        self.configuration = configuration
    }

    func state(now: Duration) -> CircuitBreaker.State {
        switch phase {
        case .closed: return .closed
        case .open(let until): return now >= until ? .halfOpen : .open
        case .halfOpen: return .halfOpen
        }
    }

    func remainingOpenTime(now: Duration) -> Duration {
        if case .open(let until) = phase, now < until { return until - now }
        return .zero
    }

    mutating func acquire(now: Duration) -> Decision {
        switch phase {
        case .closed:
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: false))
        case .open(let until):
            guard now >= until else { return .rejected }
            transition(to: .halfOpen(granted: 1, succeeded: 0))
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: true))
        case .halfOpen(let granted, let succeeded):
            guard granted < configuration.halfOpenProbes else { return .rejected }
            phase = .halfOpen(granted: granted + 1, succeeded: succeeded)
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: true))
        }
    }

    mutating func record(_ outcome: CircuitBreaker.Outcome, for permit: CircuitBreaker.Permit, now: Duration) {
        guard permit.generation == generation else { return }  // stale: the state changed meanwhile
        switch phase {
        case .closed(var outcomes, var next, var failures):
            guard outcome != .ignored else { return }
            let failed = outcome == .failure
            if outcomes.count < configuration.windowSize {
                outcomes.append(failed)
            } else {
                if outcomes[next] { failures -= 1 }
                outcomes[next] = failed
            }
            next = (next + 1) % configuration.windowSize
            if failed { failures += 1 }
            if outcomes.count >= configuration.minimumCalls,
               Double(failures) / Double(outcomes.count) >= configuration.failureRateThreshold {
                transition(to: .open(until: now + configuration.openDuration))
            } else {
                phase = .closed(outcomes: outcomes, next: next, failures: failures)
            }
        case .open:
            return  // cannot happen for a current-generation permit: opening bumps the generation
        case .halfOpen(let granted, let succeeded):
            switch outcome {
            case .failure:
                transition(to: .open(until: now + configuration.openDuration))
            case .ignored:
                phase = .halfOpen(granted: granted - 1, succeeded: succeeded)  // free the probe slot
            case .success:
                if succeeded + 1 >= configuration.halfOpenProbes {
                    transition(to: .closed(outcomes: [], next: 0, failures: 0))
                } else {
                    phase = .halfOpen(granted: granted, succeeded: succeeded + 1)
                }
            }
        }
    }

    private mutating func transition(to newPhase: Phase) {
        phase = newPhase
        generation &+= 1
    }
}
