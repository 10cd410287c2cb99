import Foundation
import RequestEngine

/// What happened to one queued entry, as published on `OfflineQueueEngine.results` and collected
/// in a `FlushReport`.
public enum QueueEntryResult: Sendable {
    /// A 2xx reply: the entry was removed.
    case delivered(id: UUID, statusCode: Int)
    /// The server rejected it for good (4xx other than 408/429, 501, or the stored request cannot
    /// be sent): the entry was removed. `statusCode` is `nil` when no response was involved.
    case failedPermanently(id: UUID, statusCode: Int?)
    /// A transient failure (5xx, 408, 429, timeout, transport): the entry stays, with its attempt
    /// count and the time of its next attempt.
    case keptForRetry(id: UUID, error: NetworkError, attempts: Int, nextAttemptAt: Date)
    /// Its TTL ran out before delivery: removed without being sent.
    case expired(id: UUID)
    /// It used up `maxAttempts` (or the retry policy gave up): moved to `dead-letter/`.
    case deadLettered(id: UUID, attempts: Int)

    /// The entry this result is about.
    public var id: UUID {
        switch self {
        case .delivered(let id, _), .failedPermanently(let id, _), .keptForRetry(let id, _, _, _),
            .expired(let id), .deadLettered(let id, _):
            return id
        }
    }
}

/// The outcome of `enqueue`.
public enum EnqueueResult: Sendable, Hashable {
    /// Sent at once and answered 2xx; nothing was queued.
    case sent(statusCode: Int)
    /// Stored durably; it will be replayed. The id names the entry (`cancel(id:)`, results).
    case queued(id: UUID)

    /// The queued entry's id, if it was queued.
    public var queuedID: UUID? {
        if case .queued(let id) = self { return id }
        return nil
    }
}

/// What one drain pass did.
public struct FlushReport: Sendable {
    /// Why the pass ran.
    public enum Trigger: String, Sendable {
        case flush, reconnect, timer, start
    }

    public var trigger: Trigger
    /// Every per-entry result of the pass, in order.
    public var results: [QueueEntryResult] = []
    /// Entries left in the queue when the pass ended.
    public var remaining: Int = 0
    /// The pass ended early because the network was unreachable (or the monitor said so).
    public var endedOffline = false
    /// The pass ended early because its task was cancelled (e.g. a drain budget ran out).
    public var wasCancelled = false
    /// The storage failed during the pass (it could not be read, or a claim could not be taken or
    /// settled), and the pass ended there; `nil` when it did not. An entry whose settlement failed
    /// stays claimed until its lease runs out, then goes again with the same `Idempotency-Key`.
    public var storageError: (any Error)?

    public var delivered: [UUID] { results.compactMap { if case .delivered(let id, _) = $0 { id } else { nil } } }
    public var failed: [UUID] { results.compactMap { if case .failedPermanently(let id, _) = $0 { id } else { nil } } }
    public var kept: [UUID] { results.compactMap { if case .keptForRetry(let id, _, _, _) = $0 { id } else { nil } } }
    public var expired: [UUID] { results.compactMap { if case .expired(let id) = $0 { id } else { nil } } }
    public var deadLettered: [UUID] { results.compactMap { if case .deadLettered(let id, _) = $0 { id } else { nil } } }

    public init(trigger: Trigger) { self.trigger = trigger }
}
