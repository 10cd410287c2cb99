@_spi(ResilienceCore) import ResilienceCore

/// Observation for tests (reached with `@testable import RequestEngine`).
extension DeadlineWatchdog {
    /// The number of registered deadlines.
    var pendingCount: Int { state.withLock { $0.heap.count } }

    /// Where `registration`'s entry sits in the heap, or -1 when it is no longer registered (its
    /// handle free, or reused by another call's or attempt's registration).
    func position(of registration: Registration) -> Int {
        state.withLock { state in
            guard registration.handle < state.positions.count else { return -1 }
            let position = state.positions[registration.handle]
            guard position >= 0,
                ObjectIdentifier(state.heap[position].call) == registration.call,
                state.heap[position].attempt == registration.attempt
            else { return -1 }
            return position
        }
    }

    /// Whether the heap is ordered, every entry's handle maps to its position, and every other
    /// handle is free.
    var isConsistent: Bool {
        state.withLock { state in
            let ordered = state.heap.indices.allSatisfy { index in
                state.positions[state.heap[index].handle] == index
                    && (index == 0 || state.heap[(index - 1) / 2].deadline <= state.heap[index].deadline)
            }
            let free = Set(state.freeHandles)
            let accounted = state.positions.indices.allSatisfy { handle in
                (state.positions[handle] == -1) == free.contains(handle)
            }
            return ordered && accounted && free.count == state.freeHandles.count
                && state.heap.count + free.count == state.positions.count
        }
    }
}
