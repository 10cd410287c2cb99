import Retry

/// Fires actions at deadlines on an injected clock, with **one** sleeping task per engine instead
/// of a timer per request.
///
/// Each attempt with a timeout registers "cancel me at deadline D" and unregisters when it ends.
/// A single sleeper waits for the earliest live deadline. Requests with the same timeout register
/// deadlines in increasing order, so the sleeper is almost never re-armed: a stream of fast
/// requests costs a heap insert and remove each, no task, no timer. Registrations live in an
/// indexed binary heap and are removed eagerly, so memory stays proportional to attempts in flight.
final class DeadlineWatchdog: Sendable {
    private struct Item: Sendable {
        let deadline: Duration
        let id: UInt64
        let action: @Sendable () -> Void
    }

    private struct State: Sendable {
        var heap: [Item] = []
        var positions: [UInt64: Int] = [:]
        var nextID: UInt64 = 0
        var sleeper: Task<Void, Never>?
        var sleeperDeadline: Duration?
        var isShutDown = false
    }

    private let state = Locked(State())
    private let time: TimeSource

    init(time: TimeSource) {
        self.time = time
    }

    /// Runs `action` (on some task, once) when `delay` has passed, unless `cancel` comes first.
    func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> UInt64 {
        let deadline = time.now() + delay
        return state.withLock { state in
            state.nextID += 1
            let id = state.nextID
            Self.push(Item(deadline: deadline, id: id, action: action), into: &state)
            if !state.isShutDown, state.sleeperDeadline.map({ deadline < $0 }) ?? true {
                state.sleeper?.cancel()
                state.sleeperDeadline = deadline
                state.sleeper = startSleeper(until: deadline)
            }
            return id
        }
    }

    /// Forgets a registration; its action will not run.
    func cancel(_ id: UInt64) {
        state.withLock { state in
            guard let position = state.positions[id] else { return }
            Self.remove(at: position, from: &state)
        }
    }

    /// Stops the sleeper; pending actions never run.
    func shutdown() {
        let sleeper = state.withLock { state -> Task<Void, Never>? in
            state.isShutDown = true
            state.heap = []
            state.positions = [:]
            defer { state.sleeper = nil; state.sleeperDeadline = nil }
            return state.sleeper
        }
        sleeper?.cancel()
    }

    private func startSleeper(until first: Duration) -> Task<Void, Never> {
        // Detached: the sleeper outlives the request that armed it and must not keep (or pass
        // on) that request's task-local values or priority. High priority: it does almost no work,
        // and a deadline must not wait behind request work.
        Task.detached(priority: .high) { [time = self.time, state = self.state] in
            var wake = first
            while true {
                do {
                    try await time.sleep(wake - time.now())
                } catch {
                    return  // re-armed for an earlier deadline, or shut down
                }
                let now = time.now()
                let (due, next) = state.withLock { state -> ([@Sendable () -> Void], Duration?) in
                    var due: [@Sendable () -> Void] = []
                    while let top = state.heap.first, top.deadline <= now {
                        due.append(top.action)
                        Self.remove(at: 0, from: &state)
                    }
                    let next = state.heap.first?.deadline
                    state.sleeperDeadline = next
                    if next == nil { state.sleeper = nil }
                    return (due, next)
                }
                for action in due { action() }
                guard let next else { return }
                wake = next
            }
        }
    }

    // MARK: - Indexed binary min-heap on deadline

    private static func push(_ item: Item, into state: inout State) {
        state.heap.append(item)
        state.positions[item.id] = state.heap.count - 1
        siftUp(state.heap.count - 1, &state)
    }

    private static func remove(at position: Int, from state: inout State) {
        let last = state.heap.count - 1
        state.positions[state.heap[position].id] = nil
        if position != last {
            state.heap[position] = state.heap[last]
            state.positions[state.heap[position].id] = position
        }
        state.heap.removeLast()
        if position < state.heap.count {
            siftDown(position, &state)
            siftUp(position, &state)
        }
    }

    private static func siftUp(_ start: Int, _ state: inout State) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard state.heap[child].deadline < state.heap[parent].deadline else { return }
            swapAt(child, parent, &state)
            child = parent
        }
    }

    private static func siftDown(_ start: Int, _ state: inout State) {
        var parent = start
        let count = state.heap.count
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < count, state.heap[left].deadline < state.heap[smallest].deadline { smallest = left }
            if right < count, state.heap[right].deadline < state.heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return }
            swapAt(parent, smallest, &state)
            parent = smallest
        }
    }

    private static func swapAt(_ a: Int, _ b: Int, _ state: inout State) {
        state.heap.swapAt(a, b)
        state.positions[state.heap[a].id] = a
        state.positions[state.heap[b].id] = b
    }
}
