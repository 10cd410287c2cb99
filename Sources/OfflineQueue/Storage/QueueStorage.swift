import Foundation

/// Where an `OfflineQueueEngine` keeps its entries, shaped for more than one consumer: entries are
/// claimed under a lease before they are sent, and a claim ends in exactly one of complete,
/// release (kept for a later attempt) or dead-letter.
///
/// `DiskQueueStore` is the storage of an app: one engine per folder, so its claims are trivial
/// (held in memory, with no lease to run out; a crash drops them with the process).
/// `PostgresQueueStore` (the Integrations package's `ResiliencePostgres`) is the storage of a
/// service with many replicas: claims are rows locked with `FOR UPDATE SKIP LOCKED` under a lease
/// that another replica may take over once it runs out.
///
/// Every conformer keeps the queue's rules, whoever consumes:
/// - **order**: `claim` offers entries by priority (highest first), then FIFO by `sequence`;
/// - **one in flight per ordering key, in order**: an entry with an `orderingKey` is claimable only
///   when no entry of its key with a smaller `sequence` is queued (claimed or not), so a key's
///   entries go one at a time, in the order they were added;
/// - **the newest edit wins**: `add` of an entry with a `coalescingKey` replaces the queued,
///   unclaimed entry of that key in its place when both have the same `orderingKey` (or neither
///   has one); an entry of that key being sent keeps its claim, and an edit that cannot take the
///   holder's place (claimed, or of another ordering key, whose line it must not jump) is queued
///   behind it, claimable once the older one is gone;
/// - **due and alive**: an entry is claimable only once its `nextAttemptAt` has passed and before
///   it expires (`removeExpired(now:)` sweeps the expired);
/// - **at most one live claim per entry**: while a claim's lease runs, nobody else can claim the
///   entry; `complete`, `release` and `deadLetter` of a claim that is no longer the entry's live one
///   change nothing and throw `OfflineQueueError.claimLost(id:)`, so an entry is never completed
///   twice.
///
/// An entry keeps its `idempotencyKey` for life, so every attempt, by whichever consumer, carries
/// the same key.
public protocol QueueStorage: Sendable {
    /// Every queued entry, claimed ones included, in claim order (priority descending, FIFO within
    /// a priority).
    nonisolated(nonsending) func queuedEntries() async throws -> [QueueEntry]

    /// The number of queued entries (expired ones included until they are swept).
    nonisolated(nonsending) func queuedCount() async throws -> Int

    /// The queued entry with this id, claimed or not.
    nonisolated(nonsending) func queuedEntry(id: UUID) async throws -> QueueEntry?

    /// Whether an entry with `orderingKey`, or one with `coalescingKey`, is queued: a new request with
    /// either key must not overtake it (the engine then stores the request instead of sending it).
    nonisolated(nonsending) func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool

    /// Whether a request with these keys may be sent before it is stored (`enqueue` sending at
    /// once, online): only when nothing it must not overtake can be in the storage. The default
    /// answers true only for a request with neither key: on storage many consumers share, another
    /// consumer may add an entry of the key at that moment, and a send outside the storage would
    /// overtake it (the request is stored, and a pass claims it). `DiskQueueStore`, the only
    /// consumer of its folder, answers from its index — no entry of either key is queued — and,
    /// for a coalescing key, once every older edit's deletion is durable (an older edit's file
    /// must not come back after a crash and be sent after this one).
    nonisolated(nonsending) func maySendAtOnce(orderingKey: String?, coalescingKey: String?) async -> Bool

    /// Stores `entry`, returning it as stored (with the `sequence` that places it).
    ///
    /// With a `coalescingKey`, the queued and unclaimed entry of that key with the same
    /// `orderingKey` is replaced, the new edit taking its place; otherwise (claimed, or of another
    /// ordering key) the edit is stored behind it.
    ///
    /// - Throws: `OfflineQueueError.full` when `limit` entries are queued already (a replacement
    ///   does not count), and the storage's own error when it cannot write: nothing is stored then,
    ///   unless the storage committed and only its answer was lost (a database connection dropped
    ///   at that moment), in which case the entry is stored and will be delivered.
    nonisolated(nonsending) func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry

    /// Claims up to `limit` entries that may be sent at `now` under the rules above, for `lease`.
    /// At most one entry of each ordering key is in the result.
    nonisolated(nonsending) func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim]

    /// Extends a live claim's lease to `now + lease`.
    ///
    /// - Throws: `OfflineQueueError.claimLost(id:)` when the claim is no longer the entry's live
    ///   one (its lease ran out and another consumer claimed it, or the entry was cancelled): the
    ///   delivery it covers must stop.
    nonisolated(nonsending) func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim

    /// Removes a claimed entry for good (delivered, rejected, superseded) with `reason`.
    nonisolated(nonsending) func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws

    /// Ends a claim and keeps the entry queued as `entry` says (its attempts, next attempt time and
    /// last error; the claimed entry unchanged when the attempt did not count).
    nonisolated(nonsending) func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws

    /// Moves a claimed entry to the dead letters, as `entry` says (its final attempt count).
    nonisolated(nonsending) func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws

    /// Removes a queued entry without sending it; `false` when it was not queued. A claim on it
    /// then ends as lost.
    nonisolated(nonsending) func cancel(id: UUID) async throws -> Bool

    /// Removes every queued entry.
    nonisolated(nonsending) func removeAll() async throws

    /// Removes the entries expired at `now` that nobody has claimed, returning them.
    nonisolated(nonsending) func removeExpired(now: Date) async throws -> [QueueEntry]

    /// The earliest time an entry may next become claimable, or `nil` when none is waiting: the
    /// earliest `nextAttemptAt` (a backoff's end); storage with leases may also count a claimed
    /// entry at its lease's end, and leave out entries waiting behind the head of their key. A
    /// started engine runs its next pass then (or at its poll interval, if sooner).
    nonisolated(nonsending) func earliestNextAttempt() async throws -> Date?

    /// A new stream for each call that yields when another consumer (a replica, a transaction's
    /// outbox enqueue) may have added claimable work, so an idle engine starts on it at once rather
    /// than at its next poll. The default never yields: an engine on storage it alone writes learns
    /// of every entry from its own `enqueue`.
    func arrivals() -> AsyncStream<Void>

    /// What the storage holds, change by change: the storage publishes each change it makes
    /// (`stored`, `updated`, `removed` and why) in the step that makes it, and the changes other
    /// consumers make as they come to be known (`QueueChangeFeed.publishFromElsewhere(_:)`); the
    /// engine adds its own (`offered`, attempts starting and ending). `OfflineQueueEngine`'s
    /// `changes` and `pendingCounts`, and `OfflineFirstClient`, follow it. Return the same feed on
    /// every access.
    var changeFeed: QueueChangeFeed { get }

    /// Whether consumers other than this engine may add work (a replica, an outbox insert): then a
    /// started engine also looks for work every `storagePollInterval`, besides `arrivals()`. The
    /// default is true; `DiskQueueStore`, whose folder one engine owns, says false.
    var othersAddWork: Bool { get }

    /// A pass begins: storage that batches its removals may start now (`DiskQueueStore` wakes its
    /// I/O thread a batch of deletions at a time). The default does nothing.
    nonisolated(nonsending) func passBegins() async

    /// The pass ended: every removal it made is done when this returns (`DiskQueueStore`: every
    /// completed entry's file is deleted). The default does nothing.
    nonisolated(nonsending) func passEnded() async

    /// Returns once the removals made so far are done, not batched for later: the engine calls it
    /// after completing a delivery a layer above observes (OfflineFirst), so that no read stored
    /// from then on can meet the delivered entry again after a relaunch. The default does nothing.
    nonisolated(nonsending) func removalsSettled() async

    /// Notes, for the next process on this storage, which entries may be in the server's state
    /// (sent without an answer that says they were not), when a layer above observes the sends
    /// (OfflineFirst: `QueueChangeFeed.sendingAtOpen` at the next open). The default does nothing.
    nonisolated(nonsending) func noteInFlight(_ ids: Set<UUID>) async

    /// Lets go of what this process holds of the storage (`DiskQueueStore`: its folder's lock), so
    /// another owner can take it at once; afterwards the storage writes nothing. The default does
    /// nothing: storage many consumers share has nothing to let go of.
    nonisolated(nonsending) func close() async
}

extension QueueStorage {
    nonisolated(nonsending) public func maySendAtOnce(orderingKey: String?, coalescingKey: String?) async -> Bool {
        orderingKey == nil && coalescingKey == nil
    }

    public func arrivals() -> AsyncStream<Void> { AsyncStream { _ in } }

    public var othersAddWork: Bool { true }

    nonisolated(nonsending) public func passBegins() async {}

    nonisolated(nonsending) public func passEnded() async {}

    nonisolated(nonsending) public func removalsSettled() async {}

    nonisolated(nonsending) public func noteInFlight(_ ids: Set<UUID>) async {}

    /// The queued entries that have not expired by the system clock, in claim order; none when
    /// the storage cannot be read (SwiftResilience's `store.load()`; `queuedEntries()` throws).
    nonisolated(nonsending) public func load() async -> [QueueEntry] {
        let now = Date()
        return ((try? await queuedEntries()) ?? []).filter { !$0.isExpired(at: now) }
    }

    /// The number of queued entries; 0 when the storage cannot be read (SwiftResilience's
    /// `store.count()`; `queuedCount()` throws).
    nonisolated(nonsending) public func count() async -> Int { (try? await queuedCount()) ?? 0 }

    nonisolated(nonsending) public func close() async {}
}

/// An entry held by one consumer until its lease ends: what `QueueStorage.claim(upTo:now:lease:)`
/// returns, and what that consumer hands back to complete, release or dead-letter the entry.
public struct QueueClaim: Sendable, Equatable {
    /// The entry as it was when claimed.
    public let entry: QueueEntry
    /// Names this claim: the storage accepts a settlement only from the entry's live claim.
    public let token: UUID
    /// When the lease ends if not renewed; `nil` for a claim that holds until it is settled (a
    /// storage with one consumer, such as `DiskQueueStore`).
    public let leaseEnds: Date?

    public init(entry: QueueEntry, token: UUID, leaseEnds: Date?) {
        self.entry = entry
        self.token = token
        self.leaseEnds = leaseEnds
    }
}
