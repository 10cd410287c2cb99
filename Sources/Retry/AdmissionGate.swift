/// At most `limit` holders at once; the rest wait in arrival order, and `leave()` hands the place
/// straight to the longest waiter. Cancellation-aware: a waiter whose task is cancelled leaves the
/// line at once with `CancellationError`. Lock-based, so callers on any actor or none can share it.
///
/// Users in the package:
/// - Auth's engine admits each attempt through one (opt-in limit) and reads the token only once
///   admitted, so at most `limit` requests carry a token that a refresh has since replaced.
/// - The offline queue runs its drain passes one at a time through one with limit 1, and a drain
///   service its cycles; a pass or cycle cancelled while it waits leaves without running.
package final class AdmissionGate: Sendable {
    private struct Waiter: Sendable {
        let id: UInt64
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State: Sendable {
        var available: Int
        var waiters: [Waiter] = []
        var head = 0  // waiters before `head` were served; compacted lazily
        var nextID: UInt64 = 0
        /// Decided to wait, not suspended yet (between `enter`'s two critical sections).
        var pending: Set<UInt64> = []
        /// Pending callers a `leave()` has already handed its place to.
        var granted: Set<UInt64> = []
        var cancelledEarly: Set<UInt64> = []
    }

    private let state: Locked<State>
    /// For tests: runs between deciding to wait and waiting (the window a lost wakeup needs).
    private let beforeWaiting: (@Sendable () async -> Void)?

    package init(limit: Int, beforeWaiting: (@Sendable () async -> Void)? = nil) {
        state = Locked(State(available: max(1, limit)))
        self.beforeWaiting = beforeWaiting
    }

    /// The number of callers waiting for a place.
    package var waiterCount: Int {
        state.withLock { $0.waiters.count - $0.head + $0.pending.count }
    }

    /// Waits for a place; call `leave()` exactly once afterwards. Throws `CancellationError`, with
    /// no place taken, when the caller is cancelled while it waits.
    ///
    /// Races this guards against: a `leave()` that runs after a caller decided to wait but before
    /// it suspended hands its place to that caller (`granted`) instead of freeing it, so the caller
    /// cannot be left waiting with a place free; and a newcomer never takes a free place while an
    /// earlier caller is still on its way to the line (`pending`), so the order is arrival order.
    package func enter() async throws {
        let id: UInt64? = state.withLock { state in
            if state.available > 0, state.head == state.waiters.count, state.pending.isEmpty {
                state.available -= 1
                return nil
            }
            state.nextID += 1
            state.pending.insert(state.nextID)
            return state.nextID
        }
        guard let id else { return }
        if let beforeWaiting { await beforeWaiting() }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                enum Next { case admitted, cancelled, waiting }
                let next = state.withLock { state -> Next in
                    state.pending.remove(id)
                    if state.granted.remove(id) != nil { return .admitted }
                    if state.cancelledEarly.remove(id) != nil { return .cancelled }
                    // In id (arrival) order: a later caller may reach the line first.
                    var position = state.waiters.count
                    while position > state.head, state.waiters[position - 1].id > id { position -= 1 }
                    state.waiters.insert(Waiter(id: id, continuation: continuation), at: position)
                    return .waiting
                }
                switch next {
                case .admitted: continuation.resume()
                case .cancelled: continuation.resume(throwing: CancellationError())
                case .waiting: break
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters[state.head...].firstIndex(where: { $0.id == id }) else {
                    // Not in line yet: it must never join (and a place handed to it stays its own,
                    // as for a caller already served). Already served: nothing to do.
                    if state.pending.contains(id), !state.granted.contains(id) {
                        state.pending.remove(id)
                        state.cancelledEarly.insert(id)
                    }
                    return nil
                }
                return state.waiters.remove(at: index)
            }
            waiter?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Gives the place back to the earliest arrival still waiting — in line, or on its way to it —
    /// or frees it when nobody waits.
    package func leave() {
        let next = state.withLock { state -> Waiter? in
            let earliestPending = state.pending.min()
            if let earliestPending, state.head == state.waiters.count || earliestPending < state.waiters[state.head].id {
                // The earliest arrival is still on its way to the line: the place is its own.
                state.pending.remove(earliestPending)
                state.granted.insert(earliestPending)
                return nil
            }
            guard state.head < state.waiters.count else {
                state.available += 1
                return nil
            }
            let waiter = state.waiters[state.head]
            state.head += 1
            if state.head > 1024, state.head * 2 > state.waiters.count {
                state.waiters.removeFirst(state.head)
                state.head = 0
            }
            return waiter
        }
        next?.continuation.resume()
    }
}
