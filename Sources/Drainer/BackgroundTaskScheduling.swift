import Dispatch
import Foundation

#if canImport(BackgroundTasks) && !os(macOS) && !os(watchOS)
import BackgroundTasks
#endif

/// One background task the system granted: what `BackgroundQueueDrainer` needs of a `BGTask`.
///
/// `BGTask` conforms (on iOS, iPadOS, tvOS, visionOS); a test conforms a small class of its own and
/// runs the drainer without a device. The drainer sets `expirationHandler` before it starts any
/// work, and calls `setTaskCompleted(success:)` exactly once, when the drain cycle has ended —
/// from another thread than the one that launched the task, as `BGTask` allows. The system may call
/// `expirationHandler` on any thread.
public protocol BackgroundTaskHandling: AnyObject {
    /// Called when the system takes the background time back; the drainer cancels its cycle here.
    var expirationHandler: (() -> Void)? { get set }
    /// Reports the task's outcome: `true` when the cycle ran to its end without failing.
    func setTaskCompleted(success: Bool)
}

/// What `BackgroundQueueDrainer` needs of `BGTaskScheduler`: registering the launch handler and
/// submitting requests. `SystemBackgroundTaskScheduler.shared` forwards to `BGTaskScheduler.shared`;
/// a test injects its own to see what is registered and submitted, and to launch tasks by hand.
///
/// The drainer calls `register` from its own `register()`, and `submit` from `scheduleNextDrain()` /
/// `schedule()` and — to ask for the next task while entries remain — when a drain cycle ends, on
/// another thread. `BGTaskScheduler` may be called from any thread; a conformance must be too.
public protocol BackgroundTaskScheduling: AnyObject {
    /// Registers `launchHandler` for `identifier`; the system calls it, on `queue` (or a background
    /// queue of its own when `nil`), each time it grants a task with that identifier.
    func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (any BackgroundTaskHandling) -> Void
    )

    /// Asks the system for a task (for the drainer, a `BackgroundProcessingTaskRequest` that needs
    /// the network). Throws when the system refuses (`BGTaskScheduler.Error`: not permitted, too
    /// many pending requests, unavailable).
    func submit(_ taskRequest: BackgroundTaskRequest) throws
}

#if canImport(BackgroundTasks) && !os(macOS) && !os(watchOS)
/// What `BackgroundTaskScheduling.submit(_:)` receives: `BGTaskRequest` itself here, so a
/// conformance written for SwiftResilience (`func submit(_ taskRequest: BGTaskRequest) throws`)
/// still conforms.
public typealias BackgroundTaskRequest = BGTaskRequest
/// The request `BackgroundQueueDrainer` submits: `BGProcessingTaskRequest` here.
public typealias BackgroundProcessingTaskRequest = BGProcessingTaskRequest

extension BGTask: BackgroundTaskHandling {}
#else
/// What `BackgroundTaskScheduling.submit(_:)` receives. Where BackgroundTasks exists this is
/// `BGTaskRequest`; elsewhere (Linux, macOS) a plain stand-in with the same fields, so the
/// protocols, a fake scheduler and the drainer's logic compile — and are tested — everywhere.
open class BackgroundTaskRequest {
    /// The identifier the launch handler was registered for.
    public let identifier: String
    /// The task starts no earlier than this; `nil` means as soon as the system sees fit.
    public var earliestBeginDate: Date?

    public init(identifier: String) {
        self.identifier = identifier
    }
}

/// A request for a processing task (`BGProcessingTaskRequest` where BackgroundTasks exists).
public final class BackgroundProcessingTaskRequest: BackgroundTaskRequest {
    /// Start the task only while the network is up.
    public var requiresNetworkConnectivity = false
    /// Start the task only while the device is charging.
    public var requiresExternalPower = false
}
#endif
