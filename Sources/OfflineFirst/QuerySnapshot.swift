import Foundation
import OfflineQueue
import RequestEngine
import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What a screen shows for one read at one moment: the stored or fetched body with the overlays
/// of every matching pending write applied, and everything the screen needs to say about it.
public struct QuerySnapshot: Sendable {
    /// Where the body came from, before overlays.
    public enum Source: Sendable, Hashable {
        /// The response cache (fresh or stale, see `isStale`).
        case cache
        /// The network, just now.
        case network
        /// Nothing stored or fetched yet: the body, if any, is made by overlays alone.
        case overlayOnly
    }

    /// The body to show: the base body with every applied overlay (`nil` when there is neither).
    public let data: Data?
    /// The HTTP response the base body came with, when there is one.
    public let response: HTTPURLResponse?
    public let source: Source
    /// Whether the base body is older than its freshness allows (or was made stale by a delivered
    /// write and is being refetched).
    public let isStale: Bool
    /// Whether writes not yet confirmed by the server are applied (Firestore's `hasPendingWrites`).
    public var hasPendingWrites: Bool { !pendingEntryIDs.isEmpty }
    /// The queue entries applied as overlays that the server has not confirmed, in replay order.
    public let pendingEntryIDs: [UUID]
    /// The pending entries applied here that are in conflict (the server refused them with
    /// `412`/`428`; `QueueEntry.conflict`): the body is the server's newest with them on top
    /// until the queue's `ConflictResolver` answers — a rebased write then overlays its new body,
    /// a discarded one moves to `rejectedWrites`.
    public let conflictedEntryIDs: [UUID]
    /// Delivered entries still applied because the read's refetch has not landed yet (so the
    /// screen never shows the server's state from before the write in between).
    public let settlingEntryIDs: [UUID]
    /// Writes this read was showing that failed for good (rejected, expired, dead-lettered,
    /// cancelled), most recent last: they are no longer applied.
    public let rejectedWrites: [RejectedWrite]
    /// Overlays skipped because their `apply` threw.
    public let overlayFailures: [OverlayFailure]
    /// Waiting for connectivity to fetch (the body shown is what the device has).
    public let isPaused: Bool
    /// A fetch is in flight.
    public let isFetching: Bool
    /// Why the last fetch failed, if it did (the snapshot keeps showing what it had).
    public let lastFetchError: NetworkError?
}

/// A write that will not reach the server, as a screen reports it.
public struct RejectedWrite: Sendable, Equatable, Identifiable {
    /// The queue entry's id.
    public let id: UUID
    /// The server's status when it rejected the write (`nil` when no response was involved).
    public let statusCode: Int?
    /// Why it left the queue (rejected, expired, dead-lettered, cancelled, not stored).
    public let reason: QueueRemovalReason
    /// The write itself.
    public let entry: QueueEntry
}

/// An overlay that could not be applied: its `apply` threw.
public struct OverlayFailure: Sendable, Equatable {
    /// The queue entry whose overlay was skipped.
    public let entryID: UUID
    /// What `apply` threw, described.
    public let message: String
}

/// One pending write and where it stands, for a list of pending writes (WorkManager's
/// `WorkInfo`, for HTTP).
public struct PendingWrite: Sendable, Equatable, Identifiable {
    public enum State: Sendable, Equatable {
        /// Waiting for its turn (or for connectivity); never tried yet.
        case waiting
        /// Being sent now.
        case sending
        /// Tried and failed transiently: `attempts` so far, not before `nextAttemptAt`.
        case retrying(attempts: Int, nextAttemptAt: Date?, lastError: String?)
        /// Refused because the server's version moved on (`412`, `428`), waiting for the queue's
        /// `ConflictResolver` (see `QueueEntry.conflict`).
        case conflicted(statusCode: Int)
    }

    public var id: UUID { entry.id }
    public let entry: QueueEntry
    public let state: State
}
