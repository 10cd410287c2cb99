import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// The logic of `BackgroundQueueDrainer`, free of BackgroundTasks so it builds and is tested on
/// every platform with a fake `BackgroundTaskScheduling`: the launch handler it registers, the
/// request it submits, and what a launched task does — one drain cycle, cancelled when the system
/// takes the time back, the task completed exactly once.
final class BackgroundDrainHandler: Sendable {
    /// `@unchecked Sendable`: `BackgroundTaskScheduling` is not `Sendable` (its conformers are plain
    /// classes — the system scheduler's wrapper, a test's fake), but the protocol's contract is that
    /// it may be called from any thread, as `BGTaskScheduler` may. The box only carries the reference.
    private struct SchedulerReference: @unchecked Sendable {
        let scheduler: any BackgroundTaskScheduling
    }

    /// `@unchecked Sendable`: a `BGTask` (or a fake) is not marked `Sendable`. Only two calls are made
    /// on it: `expirationHandler` is set once, in the launch handler, before any work starts; and
    /// `setTaskCompleted(success:)` once, from the task that ran the cycle — calls `BGTask` accepts
    /// from any thread (the protocol asks the same of a fake).
    private struct LaunchedTask: @unchecked Sendable {
        let task: any BackgroundTaskHandling
    }

    /// Cancels the cycle when the system expires the task — also if that happens before the cycle
    /// has been created (the handler is installed first, so no expiry is ever missed).
    private final class Expiry: Sendable {
        private struct State: Sendable {
            var expired = false
            var work: Task<DrainCycleReport, Never>?
        }

        private let state = Locked(State())

        func expire() {
            let work = state.withLock { state -> Task<DrainCycleReport, Never>? in
                state.expired = true
                return state.work
            }
            work?.cancel()
        }

        func attach(_ work: Task<DrainCycleReport, Never>) {
            let expired = state.withLock { state -> Bool in
                state.work = work
                return state.expired
            }
            if expired { work.cancel() }
        }
    }

    let identifier: String
    let queue: OfflineQueueEngine
    let earliestBeginInterval: TimeInterval
    let requiresExternalPower: Bool
    private let onReport: (@Sendable (DrainCycleReport) -> Void)?
    private let reference: SchedulerReference

    var scheduler: any BackgroundTaskScheduling { reference.scheduler }

    init(
        identifier: String,
        queue: OfflineQueueEngine,
        scheduler: any BackgroundTaskScheduling,
        earliestBeginInterval: TimeInterval,
        requiresExternalPower: Bool,
        onReport: (@Sendable (DrainCycleReport) -> Void)?
    ) {
        self.identifier = identifier
        self.queue = queue
        self.reference = SchedulerReference(scheduler: scheduler)
        self.earliestBeginInterval = earliestBeginInterval.isFinite ? max(0, earliestBeginInterval) : 0
        self.requiresExternalPower = requiresExternalPower
        self.onReport = onReport
    }

    /// Registers the launch handler. It holds this handler for good: the system may launch a task
    /// at any time in the process's life, and each must be completed.
    func register() {
        scheduler.register(forTaskWithIdentifier: identifier, using: nil, launchHandler: launchHandler)
    }

    /// The launch handler `register()` registers (also given to the system scheduler directly, which
    /// reports whether it accepted it).
    var launchHandler: (any BackgroundTaskHandling) -> Void {
        { [self] task in self.launched(task) }
    }

    /// Submits a processing-task request that needs the network (and external power if asked),
    /// starting no earlier than `earliestBeginInterval` from now (0: whenever the system likes).
    func schedule() throws {
        let request = BackgroundProcessingTaskRequest(identifier: identifier)
        request.requiresNetworkConnectivity = true
        request.requiresExternalPower = requiresExternalPower
        if earliestBeginInterval > 0 { request.earliestBeginDate = Date(timeIntervalSinceNow: earliestBeginInterval) }
        try scheduler.submit(request)
    }

    /// Runs one drain cycle for a task the system launched. The expiration handler is installed
    /// before the cycle starts and cancels it: the request in flight is cancelled and its entry stays
    /// queued, with its attempt count and idempotency key unchanged. When the cycle ends — at once
    /// after an expiry, since cancellation is cooperative — the report goes to `onReport`, the next
    /// task is requested if entries remain, and the task is completed, exactly once, with `success`
    /// when the cycle neither failed nor was cut short.
    ///
    /// The cycle sends whatever the queue's reachability monitor says: the system launched the task
    /// because the network is up (the request requires it), and a monitor in a process just woken in
    /// the background may not have caught up yet. A send that finds no network ends the cycle.
    ///
    /// - Returns: the task that completes `task`, whose value is the cycle's report (for tests).
    @discardableResult
    func launched(_ task: any BackgroundTaskHandling) -> Task<DrainCycleReport, Never> {
        let expiry = Expiry()
        task.expirationHandler = { expiry.expire() }
        let queue = self.queue
        let work = Task {
            await DrainCycle.run(queue: queue, trigger: .background, budget: nil, time: Self.unusedTime, flushMode: .ignoringReachability)
        }
        expiry.attach(work)
        let launched = LaunchedTask(task: task)
        return Task { [self] in
            let report = await work.value
            onReport?(report)
            if report.remaining > 0 { try? schedule() }
            launched.task.setTaskCompleted(success: !report.isFailure && !report.interrupted)
            return report
        }
    }

    /// No budget of its own (the system's expiry is the budget), so no timer ever runs on it.
    private static let unusedTime = TimeSource(ContinuousClock())
}
