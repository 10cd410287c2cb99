import Foundation

/// One change to what a queue holds, published on `DiskQueueStore.changes` (and
/// `OfflineQueueEngine.changes`) in the order the changes happened: what a screen that shows
/// pending writes, or overlays them on what it reads, follows.
public enum QueueChange: Sendable, Equatable {
    /// `enqueue` is sending this request at once, before storing it (the network is up). Then
    /// comes `stored` with the same id (the attempt failed transiently, or found no network), or
    /// `removed` (delivered, rejected, cancelled, or not stored: the enqueue threw). Its
    /// `sequence` is 0 until it is stored.
    case offered(QueueEntry)
    /// An entry was stored durably: a new one, or a newer edit of a coalescing key, which then
    /// replaced the entry named by `replacing` in the same step (the count never blips).
    case stored(QueueEntry, replacing: UUID?)
    /// A queued entry's attempt count, next attempt time or last error changed (a transient
    /// failure was counted).
    case updated(QueueEntry)
    /// The queue began sending this stored entry. (An enqueue's first attempt, made before the
    /// request is stored, is not an entry yet.)
    case attemptStarted(id: UUID)
    /// That attempt ended; if it settled the entry, `removed` or `updated` came first.
    case attemptEnded(id: UUID)
    /// An entry left the queue, and why.
    case removed(QueueEntry, reason: QueueRemovalReason)

    /// The entry the change is about.
    public var entryID: UUID {
        switch self {
        case .offered(let entry), .stored(let entry, _), .updated(let entry), .removed(let entry, _): entry.id
        case .attemptStarted(let id), .attemptEnded(let id): id
        }
    }
}

/// Why an entry left the queue.
public enum QueueRemovalReason: Sendable, Equatable {
    /// Sent and answered 2xx.
    case delivered(statusCode: Int)
    /// Rejected for good (4xx other than 408/429, 501, or a stored request that cannot be sent).
    case rejected(statusCode: Int?)
    /// Its TTL ran out before it could be delivered.
    case expired
    /// It used up its attempts and was moved to the dead-letter folder.
    case deadLettered(attempts: Int)
    /// Removed by the app (`cancel(id:)`, `clear()`, `DiskQueueStore.delete(id:)`).
    case cancelled
    /// A newer edit of its coalescing key replaced it while it was being sent.
    case superseded
    /// The server refused it because its version moved on (`412`, `428`), and the queue's
    /// `ConflictResolver` answered `discard`: the server's version stands.
    case conflict(statusCode: Int)
    /// An offered request could not be stored after its first attempt (the queue was full, the
    /// disk failed): `enqueue` threw, and the caller has the error.
    case notStored

    /// Whether the write reached the server: only `delivered`.
    public var isDelivered: Bool {
        if case .delivered = self { return true }
        return false
    }
}
