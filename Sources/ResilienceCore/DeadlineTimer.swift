/// Runs actions at deadlines on an injected clock with **one** sleeping task, however many
/// deadlines are pending — instead of a sleeping task per deadline.
///
/// A task per deadline costs more than its task: on Linux a cancelled `sleep` leaves its timer
/// in the dispatch queue until the deadline it was set for, holding its memory (about 0.7 KiB), so
/// a stream of fast operations each guarded by a 30 s timeout held 30 s worth of timers. Here a
/// deadline is an entry in a sorted array, removed at once when cancelled; the sleeper waits for
/// the earliest and is re-armed only when an earlier one arrives (never, for equal timeouts).
package final class DeadlineTimer: Sendable {
    package struct Token: Sendable, Hashable {
        fileprivate let deadline: Duration
        fileprivate let id: UInt64
    }

    private struct Entry: Sendable {
        let token: Token
        let action: @Sendable () -> Void
    }

    private struct State: Sendable {
        /// Sorted by deadline, then id.
        var entries: [Entry] = []
        var nextID: UInt64 = 0
        var sleeper: Task<Void, Never>?
        var sleeperDeadline: Duration?
        var isShutDown = false
    }

    private let state = Locked(State())
    private let time: TimeSource

    package init(time: TimeSource) {
        self.time = time
    }

    /// Runs `action` (once, on some task) when `delay` has passed, unless `cancel` comes first.
    @discardableResult
    package func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> Token {
        let deadline = time.now() + max(.zero, delay)
        let (token, staleSleeper) = state.withLock { state -> (Token, Task<Void, Never>?) in
            let token = Token(deadline: deadline, id: state.nextID)
            state.nextID &+= 1
            guard !state.isShutDown else { return (token, nil) }
            let position = Self.insertionPoint(for: token, in: state.entries)
            state.entries.insert(Entry(token: token, action: action), at: position)
            guard state.sleeperDeadline.map({ deadline < $0 }) ?? true else { return (token, nil) }
            let stale = state.sleeper
            state.sleeperDeadline = deadline
            state.sleeper = startSleeper(until: deadline)
            return (token, stale)
        }
        staleSleeper?.cancel()
        return token
    }

    /// Forgets the deadline; its action will not run (a no-op if it ran already).
    package func cancel(_ token: Token) {
        state.withLock { state in
            let position = Self.insertionPoint(for: token, in: state.entries)
            if position < state.entries.count, state.entries[position].token == token {
                state.entries.remove(at: position)
            }
        }
    }

    /// Drops every deadline and stops the sleeper; later schedules do nothing.
    package func shutdown() {
        let sleeper = state.withLock { state -> Task<Void, Never>? in
            state.isShutDown = true
            state.entries = []
            state.sleeperDeadline = nil
            defer { state.sleeper = nil }
            return state.sleeper
        }
        sleeper?.cancel()
    }

    /// The number of pending deadlines (for tests).
    package var pendingCount: Int { state.withLock { $0.entries.count } }

    /// Binary search: the first position whose entry is not before `token`.
    private static func insertionPoint(for token: Token, in entries: [Entry]) -> Int {
        var low = 0
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            let other = entries[middle].token
            if (other.deadline, other.id) < (token.deadline, token.id) { low = middle + 1 } else { high = middle }
        }
        return low
    }

    private func startSleeper(until deadline: Duration) -> Task<Void, Never> {
        let time = self.time
        return Task { [weak self] in
            var next = deadline
            while true {
                do {
                    try await time.sleep(next - time.now())
                } catch {
                    return  // re-armed for an earlier deadline, or shut down
                }
                guard let self else { return }
                let (due, following) = self.state.withLock { state -> ([Entry], Duration?) in
                    let now = time.now()
                    let count = state.entries.prefix { $0.token.deadline <= now }.count
                    let due = Array(state.entries.prefix(count))
                    state.entries.removeFirst(count)
                    let following = state.entries.first?.token.deadline
                    state.sleeperDeadline = following
                    if following == nil { state.sleeper = nil }
                    return (due, following)
                }
                for entry in due { entry.action() }
                guard let following else { return }
                next = following
            }
        }
    }
}
