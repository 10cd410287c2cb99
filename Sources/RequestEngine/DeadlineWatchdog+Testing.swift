import ResilienceCore

/// Observation for tests (reached with `@testable import RequestEngine`).
extension DeadlineWatchdog {
    /// The number of registered deadlines.
    var pendingCount: Int { state.withLock { $0.heap.count } }

    /// `call`'s heap slot, read under the lock.
    func slot(of call: SharedCall) -> Int { state.withLock { _ in call.deadlineSlot } }

    /// Whether the heap is ordered and every entry's call knows its slot.
    var isConsistent: Bool {
        state.withLock { state in
            state.heap.indices.allSatisfy { index in
                let entry = state.heap[index]
                return entry.call.deadlineSlot == index
                    && (index == 0 || state.heap[(index - 1) / 2].deadline <= entry.deadline)
            }
        }
    }
}
