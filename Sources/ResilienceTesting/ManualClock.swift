@_spi(ResilienceCore) import ResilienceCore
import Retry

/// A clock whose time moves only when a test calls `advance(by:)` or `advance(to:)`.
///
/// - `sleep(until:)` returns at once for a deadline that is not in the future; otherwise the sleeper
///   waits until time is advanced to (or past) its deadline.
/// - One `advance` wakes every sleeper that became due, in deadline order (ties in the order they
///   started sleeping).
/// - A cancelled sleeper wakes at once with `CancellationError` and is forgotten.
/// - `waitForSleepers(_:)` suspends until at least that many sleepers are waiting, so a test can
///   advance time exactly when the code under test has gone to sleep — no wall-clock waiting.
public final class ManualClock: Clock, Sendable {
    /// A point on the manual timeline: the offset from the clock's zero.
    public struct Instant: InstantProtocol, Hashable, Sendable {
        public var offset: Duration
        public init(offset: Duration) { self.offset = offset }
        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct State {
        var now: Instant
        /// Tagged with their deadlines; resumed with `true` when due, `false` when cancelled.
        var sleepers = WaiterList<Bool, Instant>()
        /// Tagged with the number of sleepers they wait for.
        var watchers = WaiterList<Void, Int>()
    }

    private let state: Locked<State>

    public init(now: Instant = Instant(offset: .zero)) {
        state = Locked(State(now: now))
    }

    public var now: Instant { state.withLock { $0.now } }
    public var minimumResolution: Duration { .zero }

    /// How many tasks are sleeping on this clock now.
    public var sleeperCount: Int { state.withLock { $0.sleepers.waitingCount() } }

    /// The earliest deadline among current sleepers.
    public var nextDeadline: Instant? { state.withLock { $0.sleepers.tags.min() } }

    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try Task.checkCancellation()
        let ticket = state.withLock { state -> WaiterList<Bool, Instant>.Ticket? in
            guard deadline > state.now else { return nil }
            return state.sleepers.issue(deadline)
        }
        guard let ticket else { return }
        // The clock is the simulation's own timer, not code whose windows it explores: no
        // pause before it suspends (which would make every timer late).
        let woke = await suspendCancellably(
            install: { continuation in
                let (value, watchers) = state.withLock { state -> (Bool?, [WaiterList<Void, Int>.Waiter]) in
                    if let handed = state.sleepers.claim(ticket) { return (handed, []) }
                    if deadline <= state.now {
                        state.sleepers.withdraw(ticket)
                        return (true, [])
                    }
                    state.sleepers.park(ticket, continuation)
                    let sleeping = state.sleepers.waitingCount()
                    return (nil, state.watchers.takeAll { $0 <= sleeping })
                }
                for watcher in watchers { watcher.resume(returning: ()) }
                return value
            },
            onCancel: {
                state.withLock { $0.sleepers.cancel(ticket, with: false) }?.resume(returning: false)
            },
            opensWindow: false
        )
        if !woke { throw CancellationError() }
    }

    /// The earliest deadline of a sleeper later than now (the simulation's next moment; a sleeper
    /// due already but not yet suspended wakes itself as it suspends).
    package var nextFutureDeadline: Instant? {
        state.withLock { state in state.sleepers.tags.filter { $0 > state.now }.min() }
    }

    /// Moves time forward by `duration` and wakes every sleeper now due, in deadline order.
    public func advance(by duration: Duration) {
        advance(to: state.withLock { $0.now }.advanced(by: duration))
    }

    /// Moves time to `instant` (never backwards) and wakes every sleeper now due, in deadline order.
    public func advance(to instant: Instant) {
        let due = state.withLock { state -> [WaiterList<Bool, Instant>.Waiter] in
            if instant > state.now { state.now = instant }
            let now = state.now
            return state.sleepers.takeAll { $0 <= now }.sorted { ($0.tag, $0.ticket) < ($1.tag, $1.ticket) }
        }
        for sleeper in due { sleeper.resume(returning: true) }
    }

    /// Advances to the earliest sleeper's deadline and wakes it (and any sharing that deadline).
    /// Returns `false` when nobody sleeps.
    @discardableResult
    public func advanceToNextDeadline() -> Bool {
        guard let next = nextDeadline else { return false }
        advance(to: next)
        return true
    }

    /// Suspends until at least `count` tasks sleep on this clock. Returns at once if they already
    /// do, and when the waiting task is cancelled (so a test's time limit can end it).
    public func waitForSleepers(_ count: Int = 1) async {
        await state.wait(on: \.watchers, tag: count, cancelled: ()) { state in
            state.sleepers.waitingCount() >= count ? () : nil
        }
    }
}
