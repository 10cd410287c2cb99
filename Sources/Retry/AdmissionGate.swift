import Retry

/// At most `limit` holders at once; the rest wait in arrival order. Cancellation-aware: a waiter
/// whose task is cancelled leaves the line at once with `CancellationError`.
///
/// The authenticated engine admits each attempt through this gate and reads the token only once
/// admitted. Without it, thousands of callers would all hand their request — token already in
/// the header — to URLSession before the first 401 came back, and every one of them would be
/// sent with the stale token and rejected. With it, at most `limit` requests carry a token that
/// has since been replaced.
final class AdmissionGate: Sendable {
    private struct Waiter: Sendable {
        let id: UInt64
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State: Sendable {
        var available: Int
        var waiters: [Waiter] = []
        var head = 0  // waiters before `head` were served; compacted lazily
        var nextID: UInt64 = 0
        var cancelledEarly: Set<UInt64> = []
    }

    private let state: Locked<State>

    init(limit: Int) {
        state = Locked(State(available: max(1, limit)))
    }

    /// Waits for a place; call `leave()` exactly once afterwards.
    func enter() async throws {
        let id: UInt64? = state.withLock { state in
            if state.available > 0, state.head == state.waiters.count {
                state.available -= 1
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let cancelled = state.withLock { state -> Bool in
                    if state.cancelledEarly.remove(id) != nil { return true }
                    state.waiters.append(Waiter(id: id, continuation: continuation))
                    return false
                }
                if cancelled { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters[state.head...].firstIndex(where: { $0.id == id }) else {
                    state.cancelledEarly.insert(id)
                    return nil
                }
                return state.waiters.remove(at: index)
            }
            waiter?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Gives the place back, to the longest waiter if there is one.
    func leave() {
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
