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
        var pending: Set<UInt64> = []  // waiting, but not in `waiters` yet
        var cancelledEarly: Set<UInt64> = []
    }

    private let state: Locked<State>

    package init(limit: Int) {
        state = Locked(State(available: max(1, limit)))
    }

    /// The number of callers waiting for a place.
    package var waiterCount: Int {
        state.withLock { $0.waiters.count - $0.head + $0.pending.count }
    }

    /// Waits for a place; call `leave()` exactly once afterwards. Throws `CancellationError`, with
    /// no place taken, when the caller is cancelled while it waits.
    package func enter() async throws {
        let id: UInt64? = state.withLock { state in
            if state.available > 0, state.head == state.waiters.count {
                state.available -= 1
                return nil
            }
            state.nextID += 1
            state.pending.insert(state.nextID)
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let cancelled = state.withLock { state -> Bool in
                    state.pending.remove(id)
                    if state.cancelledEarly.remove(id) != nil { return true }
                    state.waiters.append(Waiter(id: id, continuation: continuation))
                    return false
                }
                if cancelled { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters[state.head...].firstIndex(where: { $0.id == id }) else {
                    // Not in line: either not yet (remember, so it never joins), or already
                    // served (it holds the place; nothing to remember).
                    if state.pending.contains(id) { state.cancelledEarly.insert(id) }
                    return nil
                }
                return state.waiters.remove(at: index)
            }
            waiter?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Gives the place back, to the longest waiter if there is one.
    package func leave() {
        let next = state.withLock { state -> Waiter? in
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
