import Drainer
import OfflineQueue
import ServiceLifecycle

/// Runs a `DrainService` as a swift-service-lifecycle `Service`, so a server runs its offline
/// queue's drain cycles in its `ServiceGroup` and stops them with the rest of the service, instead
/// of handling signals itself (`SignalListener`).
///
/// ```swift
/// let drainer = DrainService(queue: queue, interval: .seconds(60), cycleBudget: .seconds(20))
/// let group = ServiceGroup(services: [app, DrainLifecycleService(drainer)], gracefulShutdownSignals: [.sigterm], logger: logger)
/// try await group.run()
/// ```
///
/// - `run()` starts the drain service (a cycle at once, then every interval and on reconnect) and
///   returns once it has stopped.
/// - On **graceful shutdown** it calls `stop()`: no cycle starts after that, and the cycle in
///   flight ends on its own within its `cycleBudget` (or at once when made with
///   `onShutdown: .interruptingCycle`; the request in flight is cancelled and its entry stays
///   queued for the next run).
/// - On **cancellation** of the task running it (a `ServiceGroup` cancels its services when one of
///   them fails, or when the graceful shutdown times out) it stops at once, interrupting the cycle
///   in flight, whose entry stays queued.
/// - `run()` never throws: stopping is how it ends.
public struct DrainLifecycleService: Service {
    /// The drain service this runs.
    public let drainService: DrainService
    /// What a graceful shutdown does with the cycle in flight: lets it finish within its budget
    /// (the default) or interrupts it.
    public let onShutdown: DrainService.StopMode

    public init(_ drainService: DrainService, onShutdown: DrainService.StopMode = .lettingCycleFinish) {
        self.drainService = drainService
        self.onShutdown = onShutdown
    }

    public func run() async throws {
        await drainService.start()
        let mode: DrainService.StopMode
        do {
            try await gracefulShutdown()
            mode = onShutdown
        } catch {
            mode = .interruptingCycle  // cancelled: stop now
        }
        await drainService.stop(mode)
    }
}

/// Runs an `OfflineQueueEngine`'s automatic draining (`start()`: a pass on every reconnect and when
/// a backoff ends) as a swift-service-lifecycle `Service`: started by `run()`, stopped (`stop()`,
/// which waits for the pass in flight; its entry in flight stays queued) on graceful shutdown or
/// cancellation. Use it or `DrainLifecycleService`, whichever way the queue is drained.
public struct OfflineQueueLifecycleService: Service {
    /// The queue this runs.
    public let queue: OfflineQueueEngine

    public init(_ queue: OfflineQueueEngine) {
        self.queue = queue
    }

    public func run() async throws {
        await queue.start()
        try? await gracefulShutdown()
        await queue.stop()
    }
}
