@_spi(ResilienceCore) import ResilienceCore

/// Stops calling a dependency that keeps failing, so it can recover and callers fail fast.
///
/// - **closed**: calls pass; outcomes fill a sliding window — the last `windowSize` calls
///   (`.count`) or the calls of the last stretch of time (`.time`). When the window holds at least
///   `minimumCalls` outcomes and the share of failures reaches `failureRateThreshold` (or, with
///   `slowCallDuration` set, the share of slow calls reaches `slowCallRateThreshold`), the breaker
///   opens.
/// - **open**: `acquire()` returns `nil` (the engine throws `NetworkError.circuitOpen`) until
///   `openDuration` has passed on the injected clock.
/// - **half-open**: the first `halfOpenProbes` calls after that pass as probes; others are refused.
///   One failed (or slow) probe opens the breaker again for another `openDuration`; when every
///   probe succeeds it closes with an empty window.
/// - **isolated** (manual control, reported as `.open`): `isolate()` holds the breaker open until
///   `reset()`, whatever the clock says; `reset()` closes it with an empty window from any state.
///
/// Each permit must be answered exactly once with `record(_:for:)`. `.ignored` (a cancelled call,
/// or one whose failure says nothing about the dependency's health) frees a half-open probe slot
/// without counting. Outcomes of permits handed out before the last state change are ignored, so
/// a slow call that started while closed cannot close a breaker that has since opened.
///
/// `stateChanges` reports each transition as the breaker makes it. The move from open to
/// half-open is made lazily — when the first call after `openDuration` is let through as a probe —
/// and reported then, not at the instant the timer ran out (no timer runs); `state` already says
/// `.halfOpen` in between.
///
/// The logic is the value type `CircuitBreakerStateMachine`; this class only adds a lock, a clock
/// and the notifications.
public final class CircuitBreaker: Sendable {
    public struct Configuration: Sendable, Hashable {
        /// What the closed breaker remembers.
        public enum Window: Sendable, Hashable {
            /// The outcomes of the last `n` calls (at least 1).
            case count(Int)
            /// The outcomes recorded during the last `duration` (at least 1 ms). Kept in ten buckets
            /// of `duration / 10`, so an outcome leaves the window between 0.9 × and 1 × `duration`
            /// after it was recorded, and memory stays fixed whatever the call rate.
            case time(Duration)
        }

        /// The sliding window the failure and slow-call rates are measured over.
        public var window: Window
        /// Outcomes needed in the window before the rates are judged; at least 1, and at most the
        /// window's size for a count window.
        public var minimumCalls: Int
        /// Failure share (0 ... 1) at which the breaker opens.
        public var failureRateThreshold: Double
        /// How long the breaker stays open before probing.
        public var openDuration: Duration
        /// Probes allowed while half-open; they must all succeed to close; at least 1.
        public var halfOpenProbes: Int
        /// A recorded call (success or failure) that took longer than this, from `acquire()` to
        /// `record`, counts as slow; `nil` (the default) turns slow-call detection off.
        public var slowCallDuration: Duration?
        /// Slow-call share (0 ... 1) at which the breaker opens; judged only with `slowCallDuration` set.
        public var slowCallRateThreshold: Double

        /// The size of a count window; setting it makes the window `.count(newValue)`. A time window
        /// has no count bound and reports `Int.max`.
        public var windowSize: Int {
            get {
                switch window {
                case .count(let size): size
                case .time: .max
                }
            }
            set { window = .count(max(1, newValue)) }
        }

        /// A count-based window of the last `windowSize` calls.
        public init(
            windowSize: Int = 20,
            minimumCalls: Int = 10,
            failureRateThreshold: Double = 0.5,
            openDuration: Duration = .seconds(30),
            halfOpenProbes: Int = 1,
            slowCallDuration: Duration? = nil,
            slowCallRateThreshold: Double = 1
        ) {
            self.init(
                window: .count(windowSize),
                minimumCalls: minimumCalls,
                failureRateThreshold: failureRateThreshold,
                openDuration: openDuration,
                halfOpenProbes: halfOpenProbes,
                slowCallDuration: slowCallDuration,
                slowCallRateThreshold: slowCallRateThreshold
            )
        }

        /// Any window. Out-of-range values are clamped: a count below 1 → 1, a time window below
        /// 1 ms → 1 ms, rates outside 0 ... 1 to the nearest bound (NaN → the default), negative
        /// durations → zero.
        public init(
            window: Window,
            minimumCalls: Int = 10,
            failureRateThreshold: Double = 0.5,
            openDuration: Duration = .seconds(30),
            halfOpenProbes: Int = 1,
            slowCallDuration: Duration? = nil,
            slowCallRateThreshold: Double = 1
        ) {
            switch window {
            case .count(let size):
                self.window = .count(max(1, size))
                self.minimumCalls = min(max(1, minimumCalls), max(1, size))
            case .time(let duration):
                self.window = .time(max(.milliseconds(1), duration))
                self.minimumCalls = max(1, minimumCalls)
            }
            self.failureRateThreshold = Self.rate(failureRateThreshold, default: 0.5)
            self.openDuration = max(.zero, openDuration)
            self.halfOpenProbes = max(1, halfOpenProbes)
            self.slowCallDuration = slowCallDuration.map { max(.zero, $0) }
            self.slowCallRateThreshold = Self.rate(slowCallRateThreshold, default: 1)
        }

        private static func rate(_ value: Double, default fallback: Double) -> Double {
            value.isNaN ? fallback : min(1, max(0, value))
        }
    }

    /// Never gains cases (users switch over it exhaustively): manual isolation reports `.open`,
    /// see `isIsolated`.
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
        /// When the permit was granted, on the breaker's clock (slow-call detection measures from here).
        let startedAt: Duration

        init(generation: UInt64, isProbe: Bool, startedAt: Duration = .zero) {
            self.generation = generation
            self.isProbe = isProbe
            self.startedAt = startedAt
        }
    }

    /// Thrown by `run(_:isFailure:)` while the breaker refuses calls.
    public struct OpenError: Error, Sendable, Hashable {
        /// Time left until the breaker lets a probe through (zero when half-open with all probe
        /// slots taken; `openDuration` while isolated, as a hint — only `reset()` ends isolation).
        public let retryAfter: Duration
    }

    public let configuration: Configuration
    /// The authority this breaker guards when it belongs to a `CircuitBreakerRegistry`, else `nil`.
    public let host: String?
    private let machine: Locked<CircuitBreakerStateMachine>
    private let time: TimeSource
    private let subscribers = StreamSubscribers<CircuitBreakerStateChange>()
    /// Called (under the breaker's lock, so in order) with each change; the registry's merged stream.
    private let onStateChange: (@Sendable (CircuitBreakerStateChange) -> Void)?

    public convenience init(configuration: Configuration = Configuration(), clock: some Clock<Duration> = ContinuousClock()) {
        self.init(configuration: configuration, host: nil, time: TimeSource(clock), onStateChange: nil)
    }

    init(
        configuration: Configuration,
        host: String?,
        time: TimeSource,
        onStateChange: (@Sendable (CircuitBreakerStateChange) -> Void)?
    ) {
        self.configuration = configuration
        self.host = host
        self.machine = Locked(CircuitBreakerStateMachine(configuration: configuration))
        self.time = time
        self.onStateChange = onStateChange
    }

    /// The state now (an open breaker whose timer ran out reports `.halfOpen`; an isolated one `.open`).
    public var state: State {
        let now = time.now()
        return machine.withLock { $0.state(now: now) }
    }

    /// Whether `isolate()` holds the breaker open (until `reset()`).
    public var isIsolated: Bool {
        machine.withLock { $0.isIsolated }
    }

    /// A permit for one call, or `nil` when the call must fail fast.
    public func acquire() -> Permit? {
        update { machine, now in
            switch machine.acquire(now: now) {
            case .allowed(let permit): permit
            case .rejected: nil
            }
        }
    }

    /// Time until an open breaker lets a probe through; zero when calls are allowed;
    /// `openDuration` while isolated.
    public var retryAfter: Duration {
        let now = time.now()
        return machine.withLock { $0.remainingOpenTime(now: now) }
    }

    /// Records what happened to the call `permit` allowed.
    public func record(_ outcome: Outcome, for permit: Permit) {
        update { machine, now in machine.record(outcome, for: permit, now: now) }
    }

    /// Holds the breaker open until `reset()` (resilience4j's forced-open state, Polly's manual
    /// isolation): every `acquire()` returns `nil`, whatever the clock says, and the outcomes of
    /// calls already running are ignored. `state` reports `.open`.
    public func isolate() {
        update { machine, _ in machine.isolate() }
    }

    /// Closes the breaker with an empty window, from any state (ends an isolation too). Outcomes
    /// of calls already running are ignored.
    public func reset() {
        update { machine, _ in machine.reset() }
    }

    /// A new stream of this breaker's state changes from now on (each call makes a new stream;
    /// any number may listen). It ends when the consumer stops listening. Changes are delivered in
    /// the order they happen; the buffer is unbounded, but changes are rare (a few per
    /// `openDuration`).
    public var stateChanges: AsyncStream<CircuitBreakerStateChange> {
        subscribers.stream()
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

    /// Runs `body` on the machine under the lock, and reports a change of the stored state. The
    /// report is made under the lock so that two changes racing on different threads reach every
    /// stream in the order they happened (yielding to a stream never calls back into the breaker).
    private func update<R>(_ body: (inout CircuitBreakerStateMachine, Duration) -> R) -> R {
        let now = time.now()
        return machine.withLock { machine in
            let before = machine.storedState
            let result = body(&machine, now)
            let after = machine.storedState
            if before != after {
                let change = CircuitBreakerStateChange(host: host, from: before, to: after)
                subscribers.yield(change)
                onStateChange?(change)
            }
            return result
        }
    }
}
