@_spi(ResilienceCore) import ResilienceCore

/// A bulkhead: at most `maxConcurrent` operations run at once, at most `maxWaiting` more wait for
/// a place in arrival order, and anything beyond that is refused at once.
///
/// - A call that finds a free place (and nobody in line) runs at once.
/// - Otherwise it joins the end of the line, unless `maxWaiting` callers are already in it: then it
///   throws `LimiterRejection(reason: .concurrencyLimit(...))` without running.
/// - When an operation ends (returns or throws) its place goes straight to the longest waiter; a
///   newcomer never overtakes the line (first come, first served).
/// - A caller cancelled while it waits leaves the line at once with `CancellationError`, without
///   running and without taking a place. A caller already cancelled when it calls gets
///   `CancellationError` too. A caller cancelled in the instant after its place was handed to it
///   hands the place on to the next waiter and throws `CancellationError`: a place is never lost.
///
/// Lock-based (no actor hop), so callers on any actor or none can share one; the operation runs in
/// the caller's isolation.
public final class ConcurrencyLimiter: Sendable {
    /// Operations allowed to run at once; at least 1.
    public let maxConcurrent: Int
    /// Callers allowed to wait for a place; at least 0 (0: refuse at once when full).
    public let maxWaiting: Int

    private struct State: Sendable {
        var inFlight = 0
        /// Resumed with `true` when handed a place, `false` when cancelled.
        var waiters = WaiterList<Bool, Void>()
    }

    private let state = Locked(State())

    /// - Parameters:
    ///   - maxConcurrent: places; values below 1 become 1.
    ///   - maxWaiting: the length of the wait line; negative values become 0.
    public init(maxConcurrent: Int, maxWaiting: Int) {
        self.maxConcurrent = max(1, maxConcurrent)
        self.maxWaiting = max(0, maxWaiting)
        SimulationPoints.watch(self) { [weak self] in
            guard let self else { return nil }
            let (inFlight, waiting) = state.withLock { ($0.inFlight, $0.waiters.count) }
            return waiting > 0 && inFlight < self.maxConcurrent
                ? "ConcurrencyLimiter: \(waiting) waiting while \(self.maxConcurrent - inFlight) of \(self.maxConcurrent) places are free" : nil
        }
    }

    /// Operations running now (places taken, including one just handed to a waiter that has not
    /// resumed yet).
    public var inFlight: Int {
        state.withLock { $0.inFlight }
    }

    /// Callers in line now.
    public var waiting: Int {
        state.withLock { $0.waiters.count }
    }

    /// Runs `operation` once a place is free and frees the place when it ends.
    ///
    /// Throws `LimiterRejection` (the line is full) or `CancellationError` (cancelled before it got
    /// a place) without running `operation`; otherwise returns or rethrows what `operation` does.
    public func withPermit<T>(
        isolation: isolated (any Actor)? = #isolation,
        _ operation: () async throws -> T
    ) async throws -> T {
        try await acquire()
        defer { release() }
        return try await operation()
    }

    private enum Admission {
        case admitted
        case rejected
        case wait(WaiterList<Bool, Void>.Ticket)
    }

    /// Takes a place, waiting in line for one if needed.
    ///
    /// Races this guards against (the waiter list settles them, as in `AdmissionGate`): a
    /// `release()` between the decision to wait and the suspension hands its place to the pending
    /// waiter, so nobody waits while a place is free; a cancellation in that gap is handed to the
    /// pending waiter too, so it returns at once instead of suspending.
    private func acquire() async throws {
        if Task.isCancelled { throw CancellationError() }
        let maxConcurrent = maxConcurrent
        let maxWaiting = maxWaiting
        let admission = state.withLock { state -> Admission in
            if state.inFlight < maxConcurrent, state.waiters.isEmpty {
                state.inFlight += 1
                return .admitted
            }
            guard state.waiters.count < maxWaiting else { return .rejected }
            return .wait(state.waiters.issue(()))
        }
        let ticket: WaiterList<Bool, Void>.Ticket
        switch admission {
        case .admitted: return
        case .rejected:
            throw LimiterRejection(reason: .concurrencyLimit(maxConcurrent: maxConcurrent, maxWaiting: maxWaiting))
        case .wait(let issued): ticket = issued
        }
        let admitted = await state.wait(for: ticket, on: \.waiters, cancelled: false)
        guard admitted else { throw CancellationError() }
        if Task.isCancelled {
            // Handed a place in the same instant as the cancellation: pass it on, run nothing.
            release()
            throw CancellationError()
        }
    }

    /// Hands the place to the earliest waiter (suspended or on its way to suspend), or frees it.
    private func release() {
        let next = state.withLock { state -> WaiterList<Bool, Void>.Waiter? in
            switch state.waiters.resumeFirst(with: true) {
            case .resume(let waiter)?: return waiter
            case .handedToPending?: return nil
            case nil:
                state.inFlight -= 1
                return nil
            }
        }
        next?.resume(returning: true)
    }
}
