import Foundation
import OfflineQueue

/// What one drain cycle did.
public struct DrainCycleReport: Sendable {
    /// Why the cycle ran.
    public enum Trigger: String, Sendable, Hashable {
        /// The first cycle, run by `start()`.
        case start
        /// The regular interval elapsed.
        case interval
        /// The delay after a failed cycle (longer than the interval) elapsed.
        case retry
        /// Connectivity came back.
        case reconnect
        /// `DrainService.drainNow()`.
        case manual
        /// A background task granted by the system (`BackgroundQueueDrainer`).
        case background
    }

    public var trigger: Trigger
    /// When the cycle started and ended, on the queue's clock (comparable with entry dates).
    public var startedAt: Date
    public var endedAt: Date
    /// Entries delivered (2xx).
    public var delivered: Int
    /// Entries removed as permanent failures (4xx other than 408/429, invalid requests).
    public var failed: Int
    /// Entries removed because their TTL ran out; never sent.
    public var expired: Int
    /// Entries that failed transiently (5xx, 408, 429, network) and stay queued with a backoff.
    public var keptForRetry: Int
    /// Entries moved to the dead-letter folder.
    public var deadLettered: Int
    /// Entries still queued when the cycle ended.
    public var remaining: Int
    /// The budget ran out and the cycle was cancelled; the entry in flight, if any, stays queued.
    public var budgetExhausted: Bool
    /// `stop(.interruptingCycle)` or the system (a background task's expiry) cancelled the cycle.
    public var interrupted: Bool
    /// The network was unreachable: the monitor said so, or a send found out.
    public var endedOffline: Bool
    /// Every per-entry result, in the order they happened.
    public var results: [QueueEntryResult]

    /// How long the cycle took.
    public var duration: TimeInterval { endedAt.timeIntervalSince(startedAt) }

    /// A cycle fails when the network was unreachable or an entry failed transiently; the service
    /// then waits longer before the next one (exponential backoff). A cycle cut short by its
    /// budget has not failed: it made what progress it could.
    public var isFailure: Bool { endedOffline || keptForRetry > 0 }

    public init(
        trigger: Trigger,
        startedAt: Date,
        endedAt: Date,
        flush: FlushReport,
        budgetExhausted: Bool,
        interrupted: Bool
    ) {
        self.trigger = trigger
        self.startedAt = startedAt
        self.endedAt = endedAt
        self.delivered = flush.delivered.count
        self.failed = flush.failed.count
        self.expired = flush.expired.count
        self.keptForRetry = flush.kept.count
        self.deadLettered = flush.deadLettered.count
        self.remaining = flush.remaining
        self.budgetExhausted = budgetExhausted
        self.interrupted = interrupted
        self.endedOffline = flush.endedOffline
        self.results = flush.results
    }
}

extension DrainCycleReport: CustomStringConvertible {
    public var description: String {
        var text =
            "\(trigger.rawValue) cycle: delivered \(delivered), failed \(failed), expired \(expired), "
            + "kept \(keptForRetry), remaining \(remaining)"
        if deadLettered > 0 { text += ", dead-lettered \(deadLettered)" }
        if budgetExhausted { text += ", budget ran out" }
        if interrupted { text += ", interrupted" }
        if endedOffline { text += ", offline" }
        return text + String(format: " (%.0f ms)", duration * 1000)
    }
}
