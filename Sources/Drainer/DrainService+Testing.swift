import ResilienceCore

/// Observation for tests (reached with `@testable import Drainer`).
extension DrainService {
    /// A reconnect arrived and its cycle has not begun yet.
    var reconnectIsPending: Bool { reconnectPending }
    /// Cycles (the loop's or `drainNow()`'s) waiting for the one in flight.
    var cycleWaiterCount: Int { cycleGate.waiterCount }
}
