@_spi(ResilienceCore) import ResilienceCore

/// Observation for tests (reached with `@testable import Auth`): the coordinator's state, and
/// waits for a condition on it without polling.
extension TokenRefreshCoordinator {
    /// How many callers wait for the refresh in flight.
    var waiterCount: Int { state.withLock { $0.machine.waiterCount } }

    /// Whether a refresh is in flight.
    var isRefreshing: Bool { state.withLock { $0.machine.isRefreshing } }

    /// The current token's generation (0 before the first token).
    var currentGeneration: UInt64 { state.withLock { $0.machine.currentGeneration } }

    /// Returns once at least `count` callers wait for the refresh in flight (no polling).
    func waitForWaiters(_ count: Int) async {
        await waitUntil { $0.waiterCount >= count }
    }

    /// Returns once no refresh is in flight (no polling).
    func waitUntilIdle() async {
        await waitUntil { !$0.isRefreshing }
    }

    /// Returns once `condition` holds for the state machine (checked after every join, every
    /// refresh's end and every timeout), or when the calling task is cancelled.
    func waitUntil(_ condition: @escaping @Sendable (Machine) -> Bool) async {
        await state.wait(on: \.watchers, tag: condition, cancelled: ()) { state in
            condition(state.machine) ? () : nil
        }
    }
}
