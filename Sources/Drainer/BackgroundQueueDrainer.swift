#if canImport(BackgroundTasks) && !os(macOS) && !os(watchOS)
import BackgroundTasks
import Dispatch
import Foundation
import OfflineQueue

/// Drains an `OfflineQueueEngine` in a `BGProcessingTask` (iOS, iPadOS, tvOS, visionOS), with the
/// same cycle logic as `DrainService`: when the system expires the task, the cycle is cancelled
/// cooperatively, the entry in flight stays queued with its idempotency key, and the task is
/// completed with `success: false`.
///
/// ```swift
/// // AppDelegate
/// let drainer = BackgroundQueueDrainer(taskIdentifier: "com.example.queue-drain", engine: queue)
///
/// func application(_ app: UIApplication, didFinishLaunchingWithOptions …) -> Bool {
///     drainer.register()            // before launching finishes
///     return true
/// }
/// func applicationDidEnterBackground(_ application: UIApplication) {
///     drainer.scheduleNextDrain()   // ask for background time
/// }
/// ```
///
/// The identifier must be listed under `BGTaskSchedulerPermittedIdentifiers` in Info.plist, and
/// `UIBackgroundModes` must include `processing`. Register once, before the app finishes
/// launching: BGTaskScheduler raises an exception (it does not return `false`) for a late or
/// repeated registration. The scheduler is injectable (`BackgroundTaskScheduling`), so a test can
/// launch and expire tasks by hand; the logic behind this thin type is tested on Linux.
public final class BackgroundQueueDrainer: Sendable {
    /// The identifier registered with the scheduler (and listed in Info.plist).
    public let identifier: String
    /// The queue drained by each task.
    public let queue: OfflineQueueEngine
    /// The earliest the system may start a task after a request, in seconds (0: no lower bound).
    public let earliestBeginInterval: TimeInterval
    /// Whether the task may run only while the device is charging.
    public let requiresExternalPower: Bool
    private let handler: BackgroundDrainHandler

    /// The identifier registered with the scheduler — SwiftResilience's name for `identifier`.
    public var taskIdentifier: String { identifier }

    /// SwiftResilience's initializer, with this library's options after it.
    ///
    /// - Parameters:
    ///   - taskIdentifier: the identifier listed in Info.plist.
    ///   - engine: the queue each task drains.
    ///   - scheduler: `SystemBackgroundTaskScheduler.shared` (`BGTaskScheduler.shared`) by default;
    ///     a test passes its own.
    ///   - earliestBeginInterval: seconds from a request before the task may start; 0 (default)
    ///     sets no earliest date, as SwiftResilience did.
    ///   - requiresExternalPower: run only while charging (default `false`).
    ///   - onReport: receives each cycle's report.
    public init(
        taskIdentifier: String,
        engine: OfflineQueueEngine,
        scheduler: any BackgroundTaskScheduling = SystemBackgroundTaskScheduler.shared,
        earliestBeginInterval: TimeInterval = 0,
        requiresExternalPower: Bool = false,
        onReport: (@Sendable (DrainCycleReport) -> Void)? = nil
    ) {
        handler = BackgroundDrainHandler(
            identifier: taskIdentifier,
            queue: engine,
            scheduler: scheduler,
            earliestBeginInterval: earliestBeginInterval,
            requiresExternalPower: requiresExternalPower,
            onReport: onReport
        )
        identifier = taskIdentifier
        queue = engine
        self.earliestBeginInterval = handler.earliestBeginInterval
        self.requiresExternalPower = requiresExternalPower
    }

    /// Like `init(taskIdentifier:engine:…)` on the system scheduler, with a 15-minute
    /// `earliestBeginInterval` by default.
    public convenience init(
        identifier: String,
        queue: OfflineQueueEngine,
        earliestBeginInterval: TimeInterval = 15 * 60,
        requiresExternalPower: Bool = false,
        onReport: (@Sendable (DrainCycleReport) -> Void)? = nil
    ) {
        self.init(
            taskIdentifier: identifier,
            engine: queue,
            earliestBeginInterval: earliestBeginInterval,
            requiresExternalPower: requiresExternalPower,
            onReport: onReport
        )
    }

    /// Registers the launch handler. Call it before the app finishes launching. Returns `false`
    /// when the system scheduler refused the identifier (not in Info.plist); an injected scheduler
    /// reports nothing, and `true` is returned.
    @discardableResult
    public func register() -> Bool {
        if let system = handler.scheduler as? SystemBackgroundTaskScheduler {
            return system.registerReportingAcceptance(forTaskWithIdentifier: identifier, using: nil, launchHandler: handler.launchHandler)
        }
        handler.register()
        return true
    }

    /// Asks the system for a processing task that needs the network; a refusal is ignored (the queue
    /// drains at the next launch instead) — SwiftResilience's call. `schedule()` throws it.
    public func scheduleNextDrain() {
        try? handler.schedule()
    }

    /// Asks the system for a processing task that needs the network (and external power if set),
    /// no earlier than `earliestBeginInterval` from now.
    ///
    /// - Throws: the scheduler's refusal (`BGTaskScheduler.Error`: not permitted, too many pending
    ///   requests, unavailable).
    public func schedule() throws {
        try handler.schedule()
    }
}

/// `BGTaskScheduler.shared` behind `BackgroundTaskScheduling`: the default scheduler of
/// `BackgroundQueueDrainer`.
public final class SystemBackgroundTaskScheduler: BackgroundTaskScheduling, Sendable {
    /// The one instance.
    public static let shared = SystemBackgroundTaskScheduler()

    private init() {}

    public func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (any BackgroundTaskHandling) -> Void
    ) {
        _ = registerReportingAcceptance(forTaskWithIdentifier: identifier, using: queue, launchHandler: launchHandler)
    }

    public func submit(_ taskRequest: BGTaskRequest) throws {
        try BGTaskScheduler.shared.submit(taskRequest)
    }

    /// `register`, returning whether `BGTaskScheduler` accepted the identifier.
    func registerReportingAcceptance(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (any BackgroundTaskHandling) -> Void
    ) -> Bool {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: queue) { task in
            launchHandler(task)
        }
    }
}
#endif
