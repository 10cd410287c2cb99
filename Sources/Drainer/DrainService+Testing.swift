@_spi(ResilienceCore) import ResilienceCore

/// Observation for tests (reached with `@testable import Drainer`).
extension DrainService {
    /// A reconnect arrived and its cycle has not begun yet.
    var reconnectIsPending: Bool { machine.reconnectPending }
    /// The lifecycle phase (and the loop's position while running).
    var phase: DrainServiceStateMachine.Phase { machine.phase }
    /// Cycles (the loop's or `drainNow()`'s) waiting for the one in flight.
    var cycleWaiterCount: Int { cycleGate.waiterCount }
}
