@_spi(ResilienceCore) import ResilienceCore
import Retry

/// Times out attempts at deadlines on an injected clock, with **one** sleeping task per engine
/// instead of a timer per request.
///
/// Each attempt with a timeout registers its call ("attempt N of this call expires at D") and
/// unregisters when it ends. A single sleeper waits for the earliest live deadline. Requests with
/// the same timeout register deadlines in increasing order, so the sleeper is almost never
/// re-armed: a stream of fast requests costs a heap insert and remove each — no task, no timer,
/// and in steady state no allocation. Registrations live in a binary heap and are removed eagerly,
/// so memory stays proportional to attempts in flight. `schedule` hands back a `Registration`
/// whose handle indexes the watchdog's own table of heap positions (`positions`, with a free
/// list), so a cancel finds its entry without a search and the watchdog never writes into the
/// calls it times out.
final class DeadlineWatchdog: Sendable {
    /// What `cancel` needs to find an attempt's entry: kept by whoever scheduled it (the attempt's
    /// task, in a local), never stored in the call.
    struct Registration: Sendable {
        let handle: Int
        let call: ObjectIdentifier
        let attempt: Int
    }

    struct Entry: Sendable {
        let deadline: Duration
        let call: SharedCall
        let attempt: Int
        /// Index into `State.positions`, which holds this entry's place in the heap.
        let handle: Int
    }

    struct State: Sendable {
        var heap: [Entry] = []
        /// Heap position by handle; -1 for a free handle.
        var positions: [Int] = []
        /// Handles free for reuse.
        var freeHandles: [Int] = []
        var sleeper: Task<Void, Never>?
        var sleeperDeadline: Duration?
        var isShutDown = false
        /// Told of each passed deadline (`SharedCall.attemptExpired`, the event to the call whose
        /// attempt it was); set once after init.
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
    /// `cancel(_:)` comes first with the registration returned. A call registers one attempt at a time.
    @discardableResult
    func schedule(_ call: SharedCall, attempt: Int, after delay: Duration) -> Registration {
        let deadline = time.now() + delay
        return state.withLock { state in
            let handle = state.freeHandles.popLast() ?? state.positions.count
            if handle == state.positions.count { state.positions.append(-1) }
            Self.push(Entry(deadline: deadline, call: call, attempt: attempt, handle: handle), into: &state)
            if !state.isShutDown, state.sleeperDeadline.map({ deadline < $0 }) ?? true {
                state.sleeper?.cancel()
                state.sleeperDeadline = deadline
                state.sleeper = startSleeper(until: deadline)
            }
            return Registration(handle: handle, call: ObjectIdentifier(call), attempt: attempt)
        }
    }

    /// Forgets a registration; nothing happens if it has fired already. Its handle may then have
    /// gone to another registration (a successor's, after a timeout), which is left alone: the
    /// entry found must be this call's and this attempt's.
    func cancel(_ registration: Registration) {
        state.withLock { state in
            guard registration.handle < state.positions.count else { return }
            let position = state.positions[registration.handle]
            guard position >= 0,
                ObjectIdentifier(state.heap[position].call) == registration.call,
                state.heap[position].attempt == registration.attempt
            else { return }
            Self.remove(at: position, from: &state)
        }
    }

    /// Stops the sleeper; pending deadlines never fire.
    func shutdown() {
        let sleeper = state.withLock { state -> Task<Void, Never>? in
            state.isShutDown = true
            state.heap = []
            state.positions = []
            state.freeHandles = []
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

    // MARK: - Binary min-heap on deadline, each entry's position kept in `positions`

    private static func push(_ entry: Entry, into state: inout State) {
        state.heap.append(entry)
        state.positions[entry.handle] = state.heap.count - 1
        siftUp(state.heap.count - 1, &state)
    }

    /// Removes the entry at `position` and frees its handle.
    private static func remove(at position: Int, from state: inout State) {
        let last = state.heap.count - 1
        let handle = state.heap[position].handle
        state.positions[handle] = -1
        state.freeHandles.append(handle)
        if position != last {
            state.heap[position] = state.heap[last]
            state.positions[state.heap[position].handle] = position
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
        state.positions[state.heap[a].handle] = a
        state.positions[state.heap[b].handle] = b
    }
}
