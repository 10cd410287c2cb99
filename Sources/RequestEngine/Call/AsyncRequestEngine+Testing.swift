@_spi(ResilienceCore) import ResilienceCore

/// The engine's one testing seam: callbacks a test sets (with `@testable import RequestEngine`)
/// to observe paths that have no other visible effect. Each is read only on its own path.
final class EngineTestHooks: Sendable {
    /// Called after a superseded attempt's late answer has been dropped (its timeout had handed
    /// the request to a new task).
    let droppedLateAnswer = Locked<LockedFunction<@Sendable () -> Void>?>(nil)

    func lateAnswerDropped() {
        droppedLateAnswer.withLock { $0 }?.function()
    }
}
