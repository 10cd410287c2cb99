/// At most `limit` holders at once; the rest wait in arrival order, and `leave()` hands the place
/// straight to the longest waiter. Cancellation-aware: a waiter whose task is cancelled leaves the
/// line at once with `CancellationError`. Lock-based, so callers on any actor or none can share it.
///
/// Users in the package:
/// - Auth's engine admits each attempt through one (opt-in limit) and reads the token only once
///   admitted, so at most `limit` requests carry a token that a refresh has since replaced; a
///   request's deadline bounds its wait (`enter(timeout:on:)`).
/// - The offline queue runs its drain passes one at a time through one with limit 1, and a drain
///   service its cycles; a pass or cycle cancelled while it waits leaves without running.
package final class AdmissionGate: Sendable {
    /// How a wait in line ended.
    private enum Answer: Sendable {
        case admitted, cancelled, timedOut
    }

    private struct State: Sendable {
        var available: Int
        var waiters = WaiterList<Answer, Void>()
    }

    /// `enter(timeout:on:)` gave up: the timeout passed before a place was free. No place is held.
    package struct TimedOut: Error, Sendable {}

    private let state: Locked<State>
    /// For tests: runs between deciding to wait and waiting (the window a lost wakeup needs).
    private let beforeWaiting: (@Sendable () async -> Void)?

    package init(limit: Int, beforeWaiting: (@Sendable () async -> Void)? = nil) {
        state = Locked(State(available: max(1, limit)))
        self.beforeWaiting = beforeWaiting
        SimulationPoints.watch(self) { [weak self] in
            guard let (available, waiting) = self?.state.withLock({ ($0.available, $0.waiters.count) }) else { return nil }
            return waiting > 0 && available > 0 ? "AdmissionGate: \(waiting) waiting while \(available) places are free" : nil
        }
    }

    /// The number of callers waiting for a place.
    package var waiterCount: Int {
        state.withLock { $0.waiters.count }
    }

    /// Waits for a place; call `leave()` exactly once afterwards. Throws `CancellationError`, with
    /// no place taken, when the caller is cancelled while it waits.
    ///
    /// Races this guards against (the waiter list settles both): a `leave()` that runs after a
    /// caller decided to wait but before it suspended hands its place to that caller instead of
    /// freeing it, so the caller cannot be left waiting with a place free; and a newcomer never
    /// takes a free place while anyone is in line, on its way to it included, so the order is
    /// arrival order. A caller cancelled after its place was handed to it keeps the place.
    package func enter() async throws {
        try await enter(expiring: nil)
    }

    /// `enter()`, giving up when `timeout` passes first on `timer`'s clock: throws `TimedOut` (or
    /// `CancellationError`) with no place taken. A place handed over in the instant the timeout
    /// passes is kept: the caller is admitted, and must `leave()`. No task is started per wait.
    package func enter(timeout: Duration, on timer: DeadlineTimer) async throws {
        try await enter(expiring: (timeout, timer))
    }

    /// Both `enter`s: a free place at once when nobody is in line, else a wait in line (ended by
    /// `expiring`'s timer, if given).
    private func enter(expiring: (timeout: Duration, timer: DeadlineTimer)?) async throws {
        let ticket = state.withLock { state -> WaiterList<Answer, Void>.Ticket? in
            if state.available > 0, state.waiters.isEmpty {
                state.available -= 1
                return nil
            }
            return state.waiters.issue(())
        }
        guard let ticket else { return }
        let expiry = expiring.map { expiring in
            expiring.timer.schedule(after: expiring.timeout) { [state] in
                // Taken out of line (or handed `timedOut` on its way to it), unless already admitted.
                state.withLock { $0.waiters.cancel(ticket, with: .timedOut) }?.resume(returning: .timedOut)
            }
        }
        if let beforeWaiting { await beforeWaiting() }
        let answer = await state.wait(for: ticket, on: \.waiters, cancelled: .cancelled)
        if let expiring, let expiry { expiring.timer.cancel(expiry) }
        switch answer {
        case .admitted: return
        case .cancelled: throw CancellationError()
        case .timedOut: throw TimedOut()
        }
    }

    /// Gives the place back to the earliest arrival still waiting — in line, or on its way to it —
    /// or frees it when nobody waits.
    package func leave() {
        let next = state.withLock { state -> WaiterList<Answer, Void>.Waiter? in
            switch state.waiters.resumeFirst(with: .admitted) {
            case .resume(let waiter)?: return waiter
            case .handedToPending?: return nil
            case nil:
                state.available += 1
                return nil
            }
        }
        next?.resume(returning: .admitted)
    }
}
