#if canImport(BackgroundTasks) && !os(macOS) && !os(watchOS)
import BackgroundTasks
import Foundation
import OfflineQueue
import Retry

/// Drains an `OfflineQueueEngine` in a `BGProcessingTask` (iOS, iPadOS, tvOS, visionOS), with the
/// same cycle logic as `DrainService`: when the system expires the task, the pass is cancelled
/// cooperatively and the entry in flight stays queued with its idempotency key.
///
/// ```swift
/// // In application(_:didFinishLaunchingWithOptions:), before it returns:
/// let drainer = BackgroundQueueDrainer(identifier: "com.example.drain", queue: queue)
/// drainer.register()
/// // When entries are queued, or when the app moves to the background:
/// try? drainer.schedule()
/// ```
///
/// The identifier must be listed under `BGTaskSchedulerPermittedIdentifiers` in Info.plist, and
/// `UIBackgroundModes` must include `processing`. Register once, before the app finishes
/// launching: BGTaskScheduler raises an exception (it does not return `false`) for a late or
/// repeated registration.
/// This type is thin on purpose: the cycle itself is `DrainService`'s, tested on Linux.
public final class BackgroundQueueDrainer: Sendable {
    /// A `BGTask` crosses from its launch handler to the task that completes it. Unchecked because
    /// BackgroundTasks does not mark it `Sendable`; it is safe because the only calls made on it
    /// (`expirationHandler =`, then `setTaskCompleted(success:)` exactly once) are ones the system
    /// itself makes and expects from arbitrary threads.
    private struct TaskHandle: @unchecked Sendable {
        let task: BGTask
    }

    public let identifier: String
    public let queue: OfflineQueueEngine
    /// The earliest the system may start the next task after `schedule()`.
    public let earliestBeginInterval: TimeInterval
    /// Whether the task may run only while the device is charging.
    public let requiresExternalPower: Bool
    private let onReport: (@Sendable (DrainCycleReport) -> Void)?

    public init(
        identifier: String,
        queue: OfflineQueueEngine,
        earliestBeginInterval: TimeInterval = 15 * 60,
        requiresExternalPower: Bool = false,
        onReport: (@Sendable (DrainCycleReport) -> Void)? = nil
    ) {
        self.identifier = identifier
        self.queue = queue
        self.earliestBeginInterval = max(0, earliestBeginInterval)
        self.requiresExternalPower = requiresExternalPower
        self.onReport = onReport
    }

    /// Registers the launch handler. Call it before the app finishes launching; returns `false`
    /// when the identifier is not permitted by Info.plist.
    @discardableResult
    public func register() -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: nil) { [self] task in
            self.handle(TaskHandle(task: task))
        }
    }

    /// Asks the system for a processing task that needs the network.
    public func schedule() throws {
        let request = BGProcessingTaskRequest(identifier: identifier)
        request.requiresNetworkConnectivity = true
        request.requiresExternalPower = requiresExternalPower
        request.earliestBeginDate = Date(timeIntervalSinceNow: earliestBeginInterval)
        try BGTaskScheduler.shared.submit(request)
    }

    /// No budget of its own (the system's expiration is the budget), so no timer ever runs on it.
    private static let unusedTime = TimeSource(ContinuousClock())

    private func handle(_ handle: TaskHandle) {
        let queue = self.queue
        let onReport = self.onReport
        let work = Task {
            await DrainCycle.run(queue: queue, trigger: .background, budget: nil, time: Self.unusedTime)
        }
        handle.task.expirationHandler = { work.cancel() }
        Task { [self] in
            let report = await work.value
            onReport?(report)
            if report.remaining > 0 { try? self.schedule() }
            handle.task.setTaskCompleted(success: !report.isFailure && !report.interrupted)
        }
    }
}
#endif
