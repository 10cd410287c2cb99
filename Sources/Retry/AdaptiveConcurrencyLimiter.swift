@_spi(ResilienceCore) import ResilienceCore

/// Which share of a limiter's places a request may take. Interactive requests (a user waits for
/// them) keep a guaranteed share; background work (queue replays, drain cycles, prefetch, hedges)
/// takes what is left, and is the first to wait when the limit shrinks.
public enum RequestPriority: Int, Sendable, Hashable, Comparable, CaseIterable {
    case background = 0
    case interactive = 1

    public static func < (lhs: RequestPriority, rhs: RequestPriority) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A concurrency limit that finds itself: at most `currentLimit` operations run at once, and the
/// limit follows the latency and the drops of what runs (`AdaptiveLimitAlgorithm`), between
/// `minLimit` and `maxLimit`. A bulkhead like `ConcurrencyLimiter`, for an upstream whose capacity
/// nobody knows or that changes under you.
///
/// ```swift
/// let limiter = try AdaptiveConcurrencyLimiter(algorithm: .gradient(), minLimit: 4, maxLimit: 500, maxWaiting: 1_000)
/// let data = try await limiter.withPermit { try await fetch() }          // interactive
/// try await limiter.withPermit(priority: .background) { try await sync() }
/// ```
///
/// - **Places.** An interactive call runs at once while fewer than `currentLimit` run. A
///   background call runs only while it leaves the interactive share free: `interactiveShare` of
///   the limit (rounded up), less the interactive calls already running — except that one
///   background call may always run when none does and a place is free, so background work never
///   starves. So interactive work finds a place within its share (waiting at most for that one
///   background call), and background work is what waits when the limit shrinks.
/// - **The line.** Calls that find no place wait, at most `maxWaiting` of them in all and at most
///   `maxWaitingPerLimit` per place of the current limit (by default half as many as the limit: a
///   wait of about half a round trip); one more is refused at once with `LimiterRejection`, reason
///   `.concurrencyLimit`. A line that only followed `maxWaiting` would, past the upstream's
///   capacity, hold calls until their timeouts passed and starve every one of them. A freed place goes
///   to the longest-waiting interactive call, else to the longest-waiting background call its
///   share allows. A waiter cancelled leaves at once with `CancellationError`; a place handed to
///   it in that instant goes on to the next.
/// - **Samples.** Each operation's time from admission to its end, on the limiter's clock, and
///   whether it was a drop: `withPermit` counts a thrown error as a drop (a cancellation as
///   nothing); `acquire`/`release(_:outcome:)` let a caller say (the engine counts timeouts,
///   429, 503 and connection failures). Lock-based, like `ConcurrencyLimiter`: no actor hop.
/// - **Permits.** A permit is released once; releasing it again (or a permit of another limiter)
///   changes nothing and is counted in `unmatchedReleases`, so the limit holds whatever the caller
///   does.
public final class AdaptiveConcurrencyLimiter: Sendable {
    /// Everything that sets up a limiter; `Configuration()` is the tuned default.
    public struct Configuration: Sendable, Equatable {
        public var algorithm: AdaptiveLimitAlgorithm
        /// The limit never goes below this (at least 1; above 2⁵³, 2⁵³).
        public var minLimit: Int
        /// The limit never goes above this (above 2⁵³, 2⁵³: no limit in practice).
        public var maxLimit: Int
        /// Calls allowed to wait for a place (at least 0; `Int.max` works).
        public var maxWaiting: Int
        /// The line also holds at most this many calls per place of the current limit (rounded
        /// up): at 1, a call waits about one round trip of the upstream at most, and past its
        /// capacity the rest are refused at once instead of queueing until their timeouts pass.
        /// `.infinity`: only `maxWaiting` bounds the line. At least 0.
        public var maxWaitingPerLimit: Double
        /// The limit a limiter starts at, within `minLimit…maxLimit`.
        public var initialLimit: Int
        /// The share of the limit kept for interactive calls (0…1).
        public var interactiveShare: Double

        /// The defaults: the gradient algorithm between 4 and 1 000 places starting at 20, a line of
        /// at most half as many calls as the limit (and never more than 1 000), a quarter of the
        /// places kept for interactive calls.
        public init() {
            algorithm = .gradient()
            minLimit = 4
            maxLimit = 1_000
            maxWaiting = 1_000
            maxWaitingPerLimit = Self.defaultMaxWaitingPerLimit
            initialLimit = 20
            interactiveShare = 0.25
        }

        /// `maxWaitingPerLimit`'s default: a line half as long as the limit (Benchmarks/README.md,
        /// "Adaptive limits under overload", has why).
        public static let defaultMaxWaitingPerLimit = 0.5

        /// The largest limit: 2⁵³, the largest whole number the limit's estimate (a `Double`)
        /// holds exactly. Larger limits are clamped to it.
        static let largestLimit = 1 << 53

        /// Each part set; throws `AdaptiveConcurrencyLimiter.ConfigurationError` for a limit below
        /// 1, `minLimit > maxLimit`, a negative `maxWaiting` or `maxWaitingPerLimit` (or NaN), or a
        /// share outside 0…1. Every other value works: limits above 2⁵³ (`Int.max`, say) are
        /// clamped to 2⁵³ (which no limit reaches in practice), `initialLimit` is put within the
        /// limits, and a `maxWaiting` of `Int.max` or a `maxWaitingPerLimit` of `.infinity` or any
        /// finite size means what it says (`limit × maxWaitingPerLimit` past `maxWaiting` is
        /// `maxWaiting`).
        public init(
            algorithm: AdaptiveLimitAlgorithm,
            minLimit: Int,
            maxLimit: Int,
            maxWaiting: Int,
            maxWaitingPerLimit: Double = Configuration.defaultMaxWaitingPerLimit,
            initialLimit: Int? = nil,
            interactiveShare: Double = 0.25
        ) throws(ConfigurationError) {
            guard minLimit >= 1, maxLimit >= 1 else { throw .nonPositiveLimit(minLimit: minLimit, maxLimit: maxLimit) }
            guard minLimit <= maxLimit else { throw .minimumAboveMaximum(minLimit: minLimit, maxLimit: maxLimit) }
            guard maxWaiting >= 0 else { throw .negativeWaitLine(maxWaiting) }
            guard maxWaitingPerLimit >= 0 else { throw .negativeWaitingPerLimit(maxWaitingPerLimit) }
            guard (0...1).contains(interactiveShare) else { throw .shareOutOfRange(interactiveShare) }
            self.algorithm = algorithm
            self.minLimit = min(minLimit, Self.largestLimit)
            self.maxLimit = min(maxLimit, Self.largestLimit)
            self.maxWaiting = maxWaiting
            self.maxWaitingPerLimit = maxWaitingPerLimit
            self.initialLimit = min(self.maxLimit, max(self.minLimit, initialLimit ?? min(20, self.maxLimit)))
            self.interactiveShare = interactiveShare
        }
    }

    /// A configuration that cannot work, said at construction.
    public enum ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
        case nonPositiveLimit(minLimit: Int, maxLimit: Int)
        case minimumAboveMaximum(minLimit: Int, maxLimit: Int)
        case negativeWaitLine(Int)
        case negativeWaitingPerLimit(Double)
        case shareOutOfRange(Double)

        public var description: String {
            switch self {
            case .nonPositiveLimit(let low, let high): "limits must be at least 1 (minLimit \(low), maxLimit \(high))"
            case .minimumAboveMaximum(let low, let high): "minLimit \(low) is above maxLimit \(high)"
            case .negativeWaitLine(let count): "maxWaiting must not be negative (\(count))"
            case .negativeWaitingPerLimit(let ratio): "maxWaitingPerLimit must be 0 or more (\(ratio))"
            case .shareOutOfRange(let share): "interactiveShare must be within 0...1 (\(share))"
            }
        }
    }

    /// How an operation that held a place ended, for the limit.
    public enum Outcome: Sendable, Equatable {
        /// It finished: its latency is a sample.
        case success
        /// The upstream could not take it (a timeout, 429, 503, a failed connection): the limit shrinks.
        case dropped
        /// Says nothing about the upstream (cancelled, refused before it was sent).
        case ignored
    }

    /// A place held: give it back with `release(_:outcome:)`, once. A permit is its place, copies
    /// included: giving it back again, or giving back a permit of another limiter, changes
    /// nothing (no place is freed, no sample taken) and is counted in `unmatchedReleases`.
    public struct Permit: Sendable {
        let priority: RequestPriority
        let admittedAt: Duration
        let place: Place
    }

    /// What makes a permit its place: whether it was given back, and whose it is. A class, so
    /// that every copy of a permit sees the one release.
    final class Place: @unchecked Sendable {
        // @unchecked Sendable: `owner` is immutable; `released` is read and written only under the
        // lock of the limiter `owner` names, and `release` checks `owner` before it touches it.
        let owner: ObjectIdentifier
        var released = false

        init(owner: ObjectIdentifier) { self.owner = owner }
    }

    public let configuration: Configuration

    private struct State: Sendable {
        var estimator: AdaptiveLimitEstimator
        var running: [Int] = [0, 0]  // by priority
        var interactiveWaiters = WaiterList<Bool, Void>()
        var backgroundWaiters = WaiterList<Bool, Void>()
        var unmatchedReleases = 0

        var inFlight: Int { running[0] + running[1] }
        var waiting: Int { interactiveWaiters.count + backgroundWaiters.count }
    }

    private let state: Locked<State>
    private let time: TimeSource

    /// - Parameters:
    ///   - configuration: the algorithm, the limits, the line and the shares.
    ///   - clock: what latency is measured on (`ManualClock` in tests).
    ///
    /// A configuration whose parts were set one by one is made sound here rather than trusted:
    /// limits below 1 become 1 and limits above 2⁵³ become 2⁵³, a `maxLimit` below `minLimit`
    /// becomes `minLimit`, a negative line becomes 0, a share outside 0…1 (or NaN) is clamped
    /// (NaN: the default quarter), and the initial limit is put within the limits.
    /// `configuration` holds what is used.
    public init(configuration: Configuration = Configuration(), clock: some Clock<Duration> = ContinuousClock()) {
        var configuration = configuration
        configuration.minLimit = min(max(1, configuration.minLimit), Configuration.largestLimit)
        configuration.maxLimit = min(max(configuration.minLimit, configuration.maxLimit), Configuration.largestLimit)
        configuration.maxWaiting = max(0, configuration.maxWaiting)
        configuration.maxWaitingPerLimit =
            configuration.maxWaitingPerLimit.isNaN
            ? Configuration.defaultMaxWaitingPerLimit : max(0, configuration.maxWaitingPerLimit)
        configuration.initialLimit = min(configuration.maxLimit, max(configuration.minLimit, configuration.initialLimit))
        configuration.interactiveShare = configuration.interactiveShare.isNaN ? 0.25 : min(1, max(0, configuration.interactiveShare))
        self.configuration = configuration
        self.time = TimeSource(clock)
        self.state = Locked(
            State(
                estimator: AdaptiveLimitEstimator(
                    algorithm: configuration.algorithm,
                    minLimit: configuration.minLimit,
                    maxLimit: configuration.maxLimit,
                    initialLimit: configuration.initialLimit
                )))
    }

    /// `AdaptiveConcurrencyLimiter(configuration: try Configuration(algorithm:minLimit:maxLimit:maxWaiting:))`.
    public convenience init(
        algorithm: AdaptiveLimitAlgorithm,
        minLimit: Int,
        maxLimit: Int,
        maxWaiting: Int,
        clock: some Clock<Duration> = ContinuousClock()
    ) throws(ConfigurationError) {
        self.init(
            configuration: try Configuration(algorithm: algorithm, minLimit: minLimit, maxLimit: maxLimit, maxWaiting: maxWaiting),
            clock: clock
        )
    }

    /// The number of operations allowed to run at once now.
    public var currentLimit: Int { state.withLock { $0.estimator.limit } }

    /// Operations holding a place now (including one just handed to a waiter not yet resumed).
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// Calls waiting for a place now.
    public var waiting: Int { state.withLock { $0.waiting } }

    /// Releases that matched no place held, and so changed nothing: a permit (or a copy of one)
    /// given back a second time, or a permit of another limiter. Each is a bug in the caller —
    /// counted rather than trapped on, so that the limit still holds in a release build and a
    /// test or a metric can find it; 0 in a correct program.
    public var unmatchedReleases: Int { state.withLock { $0.unmatchedReleases } }

    /// Runs `operation` once a place is free for `priority`, and gives the place back when it
    /// ends: a thrown error counts as a drop (a `CancellationError`, or a throw while the task is
    /// cancelled, as nothing), a return as a success.
    ///
    /// Throws `LimiterRejection` (the line is full) or `CancellationError` (cancelled before it got
    /// a place) without running `operation`; otherwise returns or rethrows what `operation` does.
    public func withPermit<T>(
        priority: RequestPriority = .interactive,
        isolation: isolated (any Actor)? = #isolation,
        _ operation: () async throws -> T
    ) async throws -> T {
        let permit = try await acquire(priority: priority)
        do {
            let value = try await operation()
            release(permit, outcome: .success)
            return value
        } catch {
            release(permit, outcome: error is CancellationError || Task.isCancelled ? .ignored : .dropped)
            throw error
        }
    }

    /// Takes a place for `priority` if one is free now and nobody it must not pass is waiting;
    /// `nil` otherwise (then `acquire(priority:)` waits for one). Synchronous: the common case
    /// of a limiter with room costs no suspension point.
    public func tryAcquire(priority: RequestPriority = .interactive) -> Permit? {
        let share = configuration.interactiveShare
        let admitted = state.withLock { state -> Bool in
            let lineEmpty = priority == .interactive ? state.interactiveWaiters.isEmpty : state.waiting == 0
            guard lineEmpty, Self.hasPlace(for: priority, in: state, share: share) else { return false }
            state.running[priority.rawValue] += 1
            return true
        }
        return admitted ? permit(priority) : nil
    }

    /// Takes a place for `priority`, waiting in line for one if needed.
    ///
    /// - Throws: `LimiterRejection` when the line is full, `CancellationError` when cancelled
    ///   (already, or while waiting).
    public func acquire(priority: RequestPriority = .interactive) async throws -> Permit {
        if Task.isCancelled { throw CancellationError() }
        let share = configuration.interactiveShare
        let maxWaiting = configuration.maxWaiting
        let perLimit = configuration.maxWaitingPerLimit
        let admission = state.withLock { state -> Admission in
            let lineEmpty = priority == .interactive ? state.interactiveWaiters.isEmpty : state.waiting == 0
            if lineEmpty, Self.hasPlace(for: priority, in: state, share: share) {
                state.running[priority.rawValue] += 1
                return .admitted
            }
            let limit = state.estimator.limit
            let line = Self.line(limit: limit, perLimit: perLimit, maxWaiting: maxWaiting)
            guard state.waiting < line else { return .rejected(limit: limit, line: line) }
            return priority == .interactive
                ? .wait(state.interactiveWaiters.issue(()))
                : .wait(state.backgroundWaiters.issue(()))
        }
        switch admission {
        case .admitted:
            return permit(priority)
        case .rejected(let limit, let line):
            throw LimiterRejection(reason: .concurrencyLimit(maxConcurrent: limit, maxWaiting: line))
        case .wait(let ticket):
            let line: WritableKeyPath<State, WaiterList<Bool, Void>> & Sendable =
                priority == .interactive ? \State.interactiveWaiters : \State.backgroundWaiters
            let admitted = await state.wait(for: ticket, on: line, cancelled: false)
            guard admitted else { throw CancellationError() }
            let permit = permit(priority)
            if Task.isCancelled {
                // Handed a place in the same instant as the cancellation: pass it on, run nothing.
                release(permit, outcome: .ignored)
                throw CancellationError()
            }
            return permit
        }
    }

    /// Gives a place back and records how its operation went; the limit may change, and freed
    /// places go to the callers waiting. A permit already given back (or a copy of one), or one of
    /// another limiter, changes nothing and is counted in `unmatchedReleases`.
    public func release(_ permit: Permit, outcome: Outcome) {
        let ended = outcome == .ignored ? Duration.zero : time.now()
        let share = configuration.interactiveShare
        let owner = ObjectIdentifier(self)
        let ready = state.withLock { state -> [WaiterList<Bool, Void>.Waiter] in
            guard permit.place.owner == owner, !permit.place.released else {
                state.unmatchedReleases += 1
                return []
            }
            permit.place.released = true
            let inFlight = state.inFlight
            state.running[permit.priority.rawValue] -= 1
            if outcome != .ignored {
                state.estimator.record(began: permit.admittedAt, ended: ended, inFlight: inFlight, dropped: outcome == .dropped)
            }
            return Self.admitWaiters(&state, share: share)
        }
        for waiter in ready { waiter.resume(returning: true) }
    }

    private enum Admission {
        case admitted
        case rejected(limit: Int, line: Int)
        case wait(WaiterList<Bool, Void>.Ticket)
    }

    /// The permit for a place just taken.
    private func permit(_ priority: RequestPriority) -> Permit {
        Permit(priority: priority, admittedAt: time.now(), place: Place(owner: ObjectIdentifier(self)))
    }

    /// How many may wait at `limit`: `limit × perLimit` rounded up, at most `maxWaiting`. Worked
    /// out in `Double` and converted only when below `maxWaiting` (so below `Int.max`): a product
    /// past `Int.max` (a huge `perLimit`, `.infinity` included) is `maxWaiting`, never a trap.
    private static func line(limit: Int, perLimit: Double, maxWaiting: Int) -> Int {
        let wanted = (Double(limit) * perLimit).rounded(.up)
        return wanted < Double(maxWaiting) ? Int(wanted) : maxWaiting
    }

    /// Whether a call of `priority` may take a place now: interactive while under the limit;
    /// background while the interactive share stays free — and always one background call when
    /// none runs and a place is free, so background work never starves (at a limit of 1, or a
    /// share of 1, it runs one at a time; an interactive call then waits for at most that one).
    private static func hasPlace(for priority: RequestPriority, in state: State, share: Double) -> Bool {
        let limit = state.estimator.limit
        guard state.inFlight < limit else { return false }
        guard priority == .background else { return true }
        if state.running[RequestPriority.background.rawValue] == 0 { return true }
        let reserved = Int((Double(limit) * share).rounded(.up))  // at most the limit, at most 2⁵³
        let stillReserved = max(0, reserved - state.running[RequestPriority.interactive.rawValue])
        return state.inFlight + stillReserved < limit
    }

    /// Hands free places to waiters, interactive first, each as its share allows.
    private static func admitWaiters(_ state: inout State, share: Double) -> [WaiterList<Bool, Void>.Waiter] {
        if state.interactiveWaiters.isEmpty, state.backgroundWaiters.isEmpty { return [] }  // the usual case
        var ready: [WaiterList<Bool, Void>.Waiter] = []
        for priority in [RequestPriority.interactive, .background] {
            while hasPlace(for: priority, in: state, share: share) {
                let handoff =
                    priority == .interactive
                    ? state.interactiveWaiters.resumeFirst(with: true)
                    : state.backgroundWaiters.resumeFirst(with: true)
                guard let handoff else { break }
                state.running[priority.rawValue] += 1
                if case .resume(let waiter) = handoff { ready.append(waiter) }
            }
        }
        return ready
    }
}
