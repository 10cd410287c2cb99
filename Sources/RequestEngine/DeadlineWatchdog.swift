import Retry
import ResilienceCore

/// Times out attempts at deadlines on an injected clock, with **one** sleeping task per engine
/// instead of a timer per request.
///
/// Each attempt with a timeout registers its call ("attempt N of this call expires at D") and
/// unregisters when it ends. A single sleeper waits for the earliest live deadline. Requests with
/// the same timeout register deadlines in increasing order, so the sleeper is almost never
/// re-armed: a stream of fast requests costs a heap insert and remove each — no task, no timer,
/// and in steady state no allocation. Registrations live in a binary heap indexed by the calls
/// themselves (each call stores its slot, `SharedCall.deadlineSlot`) and are removed eagerly, so
/// memory stays proportional to attempts in flight.
final class DeadlineWatchdog: Sendable {
    struct Entry: Sendable {
        let deadline: Duration
        let call: SharedCall
        let attempt: Int
    }

    struct State: Sendable {
        var heap: [Entry] = []
        var sleeper: Task<Void, Never>?
        var sleeperDeadline: Duration?
        var isShutDown = false
        /// Told of each passed deadline (the engine's `attemptTimedOut`); set once after init.
        var onExpiry: (@Sendable (SharedCall, Int) -> Void)?
    }

    let state = Locked(State())
    private let time: TimeSource

    init(time: TimeSource) {
        self.time = time
    }

    /// Sets what is told of each passed deadline. Set once, before any schedule.
    func onExpiry(_ handler: @escaping @Sendable (SharedCall, Int) -> Void) {
        state.withLock { $0.onExpiry = handler }
    }

    /// Calls the expiry handler with `call` and `attempt` (on some task, once) when `delay` has passed, unless
    /// `cancel(_:attempt:)` comes first. A call registers one attempt at a time.
    func schedule(_ call: SharedCall, attempt: Int, after delay: Duration) {
        let deadline = time.now() + delay
        state.withLock { state in
            Self.push(Entry(deadline: deadline, call: call, attempt: attempt), into: &state)
            if !state.isShutDown, state.sleeperDeadline.map({ deadline < $0 }) ?? true {
                state.sleeper?.cancel()
                state.sleeperDeadline = deadline
                state.sleeper = startSleeper(until: deadline)
            }
        }
    }

    /// Forgets `attempt`'s registration; nothing happens if it has fired already (a superseded
    /// task's late cancellation may then meet its successor's registration, which it leaves alone).
    func cancel(_ call: SharedCall, attempt: Int) {
        state.withLock { state in
            let slot = call.deadlineSlot
            guard slot >= 0, state.heap[slot].call === call, state.heap[slot].attempt == attempt else { return }
            Self.remove(at: slot, from: &state)
        }
    }

    /// Stops the sleeper; pending deadlines never fire.
    func shutdown() {
        let sleeper = state.withLock { state -> Task<Void, Never>? in
            state.isShutDown = true
            for entry in state.heap { entry.call.deadlineSlot = -1 }
            state.heap = []
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
                let (due, next, onExpiry) = state.withLock { state -> ([Entry], Duration?, (@Sendable (SharedCall, Int) -> Void)?) in
                    var due: [Entry] = []
                    while let top = state.heap.first, top.deadline <= now {
                        due.append(top)
                        Self.remove(at: 0, from: &state)
                    }
                    let next = state.heap.first?.deadline
                    state.sleeperDeadline = next
                    if next == nil { state.sleeper = nil }
                    return (due, next, state.onExpiry)
                }
                if let onExpiry { for entry in due { onExpiry(entry.call, entry.attempt) } }
                guard let next else { return }
                wake = next
            }
        }
    }

    // MARK: - Binary min-heap on deadline, each entry's index kept in its call

    private static func push(_ entry: Entry, into state: inout State) {
        state.heap.append(entry)
        entry.call.deadlineSlot = state.heap.count - 1
        siftUp(state.heap.count - 1, &state)
    }

    private static func remove(at position: Int, from state: inout State) {
        let last = state.heap.count - 1
        state.heap[position].call.deadlineSlot = -1
        if position != last {
            state.heap[position] = state.heap[last]
            state.heap[position].call.deadlineSlot = position
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
        state.heap[a].call.deadlineSlot = a
        state.heap[b].call.deadlineSlot = b
    }
}
