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

    private struct Sleeper {
        let id: UInt64
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct Watcher {
        let id: UInt64
        let count: Int
        let continuation: CheckedContinuation<Void, Never>
    }

    private struct State {
        var now: Instant
        var nextID: UInt64 = 0
        var sleepers: [Sleeper] = []
        var cancelledEarly: Set<UInt64> = []
        var watchers: [Watcher] = []
    }

    private let state: Locked<State>

    public init(now: Instant = Instant(offset: .zero)) {
        state = Locked(State(now: now))
    }

    public var now: Instant { state.withLock { $0.now } }
    public var minimumResolution: Duration { .zero }

    /// How many tasks are sleeping on this clock now.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// The earliest deadline among current sleepers.
    public var nextDeadline: Instant? { state.withLock { $0.sleepers.map(\.deadline).min() } }

    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try Task.checkCancellation()
        let id: UInt64? = state.withLock { state in
            guard deadline > state.now else { return nil }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (cancelled, ready) = state.withLock { state -> (Bool, [Watcher]) in
                    if state.cancelledEarly.remove(id) != nil { return (true, []) }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return (false, Self.takeSatisfiedWatchers(&state))
                }
                if cancelled { continuation.resume(throwing: CancellationError()) }
                for watcher in ready { watcher.continuation.resume() }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                if let index = state.sleepers.firstIndex(where: { $0.id == id }) {
                    return state.sleepers.remove(at: index).continuation
                }
                state.cancelledEarly.insert(id)
                return nil
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Moves time forward by `duration` and wakes every sleeper now due, in deadline order.
    public func advance(by duration: Duration) {
        advance(to: state.withLock { $0.now }.advanced(by: duration))
    }

    /// Moves time to `instant` (never backwards) and wakes every sleeper now due, in deadline order.
    public func advance(to instant: Instant) {
        let due = state.withLock { state -> [Sleeper] in
            if instant > state.now { state.now = instant }
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }
                .sorted { ($0.deadline, $0.id) < ($1.deadline, $1.id) }
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
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
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if state.sleepers.count >= count || state.cancelledEarly.remove(id) != nil { return true }
                    state.watchers.append(Watcher(id: id, count: count, continuation: continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let watcher = state.withLock { state -> Watcher? in
                guard let index = state.watchers.firstIndex(where: { $0.id == id }) else {
                    state.cancelledEarly.insert(id)
                    return nil
                }
                return state.watchers.remove(at: index)
            }
            watcher?.continuation.resume()
        }
    }

    private static func takeSatisfiedWatchers(_ state: inout State) -> [Watcher] {
        let count = state.sleepers.count
        let ready = state.watchers.filter { $0.count <= count }
        state.watchers.removeAll { $0.count <= count }
        return ready
    }
}
