import Foundation
@_spi(ResilienceCore) import ResilienceCore

/// `DiskQueueStore` as a `QueueStorage`: one engine owns a folder (its lock says so), so a claim is
/// an in-memory mark with no lease (`leaseEnds` is `nil`, `renew` only checks it), and a crash
/// drops every claim with the process: the next open finds each entry queued, as on disk.
extension DiskQueueStore: QueueStorage {
    nonisolated(nonsending) public func queuedEntries() async throws -> [QueueEntry] { orderedEntries() }

    nonisolated(nonsending) public func queuedCount() async throws -> Int { entryCount }

    nonisolated(nonsending) public func queuedEntry(id: UUID) async throws -> QueueEntry? { entry(id: id) }

    nonisolated(nonsending) public func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool {
        if let orderingKey, hasEntries(orderingKey: orderingKey) { return true }
        if let coalescingKey, entry(coalescingKey: coalescingKey) != nil { return true }
        return false
    }

    /// True when no entry of either key is queued and, for a coalescing key, every deletion so
    /// far is durable (`makeDeletionsDurable()`; false when the disk refuses).
    nonisolated(nonsending) public func maySendAtOnce(orderingKey: String?, coalescingKey: String?) async -> Bool {
        if let orderingKey, hasEntries(orderingKey: orderingKey) { return false }
        guard let coalescingKey else { return true }
        guard entry(coalescingKey: coalescingKey) == nil else { return false }
        do {
            try await makeDeletionsDurable()
            return true
        } catch {
            return false
        }
    }

    nonisolated(nonsending) public func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry {
        var entry = entry.withStorableHeaders()
        // The holder of the coalescing key is replaced in its place unless it is claimed or of
        // another ordering key (whose line the edit must not jump); while the edit is written the
        // holder is marked, so `claim` does not offer it meanwhile.
        var replaced: QueueEntry?
        if let key = entry.coalescingKey, let holder = self.entry(coalescingKey: key), holder.id != entry.id,
            holder.orderingKey == entry.orderingKey
        {
            replaced = claims.withLock { $0.startReplacing(holder.id) ? holder : nil }
        }
        defer { if let replaced { claims.withLock { $0.replacementEnded(replaced.id) } } }
        if let replaced { entry = entry.replacing(replaced) }
        if entry.coalescingKey != nil { entry = entry.revised(Int(makeSequence())) }
        entry = entry.placed(at: replaced?.sequence ?? makeSequence())
        try await insert(entry, limit: limit, replacing: replaced?.id)
        return entry
    }

    /// Reads the index in replay order only as far as it needs: the first claimable entries, each
    /// the head of its ordering and coalescing keys (`QueueIndex.isHead`), so a claim from the
    /// front of the queue costs O(1) rather than a pass over every entry.
    nonisolated(nonsending) public func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim] {
        guard limit > 0 else { return [] }
        let claimed = markClaims(upTo: limit, now: now)
        // An edit of a coalescing key goes out only once every deletion so far is durable, or a
        // crash could bring an older edit's file back to be sent after it (Models/QueueCoalescing.pml).
        guard claimed.contains(where: { $0.entry.coalescingKey != nil }) else { return claimed }
        do {
            try await makeDeletionsDurable()
            return claimed
        } catch {
            claims.withLock { claims in
                for claim in claimed { claims.end(claim.entry.id) }
            }
            throw error
        }
    }

    nonisolated(nonsending) public func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim {
        try checkLive(claim, ending: false)
        return claim
    }

    nonisolated(nonsending) public func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws {
        try checkLive(claim, ending: true)
        discard(id: claim.entry.id, reason: reason)
    }

    /// Keeps the entry as `entry` says — unless a newer edit of its coalescing key was stored
    /// behind it while it was claimed (being sent): the newest edit wins, so the entry is removed
    /// (`superseded`) and the release throws `claimLost` (nothing of it is kept). On a full disk the
    /// file keeps its older state, but the index takes the new count and backoff, so this process
    /// still honours them.
    nonisolated(nonsending) public func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws {
        try checkLive(claim, ending: true)
        if let key = entry.coalescingKey, let newest = self.entry(coalescingKey: key), newest.id != entry.id,
            newest.sequence > entry.sequence
        {
            discard(id: entry.id, reason: .superseded)
            throw OfflineQueueError.claimLost(id: entry.id)
        }
        if entry != claim.entry { try? await update(entry) }
    }

    nonisolated(nonsending) public func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws {
        try checkLive(claim, ending: false)
        // A dead letter that cannot be written keeps the claim: the consumer then releases the
        // entry for a later attempt instead of losing it.
        let moved = try await moveToDeadLetter(entry)
        claims.withLock { $0.end(claim.entry.id) }
        // Cancelled while its dead letter was written: no dead letter is left, and the claim ends
        // as lost (nothing to report).
        guard moved else { throw OfflineQueueError.claimLost(id: claim.entry.id) }
    }

    nonisolated(nonsending) public func cancel(id: UUID) async throws -> Bool {
        guard entry(id: id) != nil else { return false }
        try remove(id: id)
        claims.withLock { $0.end(id) }
        return true
    }

    nonisolated(nonsending) public func removeExpired(now: Date) async throws -> [QueueEntry] {
        let claimed = claims.withLock { $0.busyIDs }
        let expired = orderedEntries().filter { $0.isExpired(at: now) && !claimed.contains($0.id) }
        for entry in expired { discard(id: entry.id, reason: .expired) }
        finishRemovals()
        return expired
    }

    /// The earliest backoff's end among the entries `claim` may offer: the first of each ordering
    /// key and of each coalescing key (an edit waiting behind an earlier one of its key does not
    /// count, whatever its own date).
    nonisolated(nonsending) public func earliestNextAttempt() async throws -> Date? {
        earliestBackoffEnd(coalescingFollowers: false)
    }

    /// One engine owns the folder: every entry comes from its own `enqueue` (or the app's `save`).
    public var othersAddWork: Bool { false }

    /// The pass's deletions wake the I/O thread a batch at a time (`DeferredRemovals`).
    nonisolated(nonsending) public func passBegins() async { startBatchingRemovals() }

    /// The pass's deletions ran beside its sends; when it returns its finished files are gone.
    nonisolated(nonsending) public func passEnded() async {
        stopBatchingRemovals()
        finishRemovals()
    }

    nonisolated(nonsending) public func removalsSettled() async { await settleRemovals() }

    nonisolated(nonsending) public func noteInFlight(_ ids: Set<UUID>) async { await noteSending(ids) }

    /// Throws `claimLost` unless `claim` is its entry's live claim and the entry is queued; with
    /// `ending`, the claim ends here.
    private func checkLive(_ claim: QueueClaim, ending: Bool) throws {
        let id = claim.entry.id
        let live = claims.withLock { claims -> Bool in
            guard claims.isLive(id, token: claim.token) else { return false }
            if ending { claims.end(id) }
            return true
        }
        guard live, entry(id: id) != nil else {
            if live && !ending { claims.withLock { $0.end(id) } }
            throw OfflineQueueError.claimLost(id: id)
        }
    }
}

/// The disk store's claims: which entries are being sent (each with its claim's token) or being
/// replaced by a newer edit of their coalescing key — `QueueEntryLifecycle`'s phases, the value
/// whose transitions the spin model's traces check (`QueueCoalescingModelTests`). Neither is
/// offered by `claim`; an edit does not replace a holder being sent (it is stored behind it).
struct DiskClaims: Sendable {
    private var lifecycle = QueueEntryLifecycle()
    private var tokens: [UUID: UUID] = [:]
    /// Claims so far: each token is this number, as a UUID (unique within the store, which is
    /// all a token needs; no random bytes drawn per entry sent).
    private var issued: UInt64 = 0

    /// Whether `id` is neither being sent nor being replaced.
    func isFree(_ id: UUID) -> Bool { lifecycle.phases[id] == nil }

    /// The entries being sent or replaced.
    var busyIDs: Set<UUID> { Set(lifecycle.phases.keys) }

    /// Claims `id` for a send; returns the claim's token.
    mutating func claim(_ id: UUID) -> UUID {
        lifecycle.replayStarted(id)
        issued += 1
        let n = issued
        let token = UUID(
            uuid: (
                0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, UInt8(truncatingIfNeeded: n >> 40), UInt8(truncatingIfNeeded: n >> 32),
                UInt8(truncatingIfNeeded: n >> 24), UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n)
            ))
        tokens[id] = token
        return token
    }

    /// Whether `token` is `id`'s live claim.
    func isLive(_ id: UUID, token: UUID) -> Bool { tokens[id] == token }

    /// Ends `id`'s claim, if it has one.
    mutating func end(_ id: UUID) {
        tokens[id] = nil
        lifecycle.sendSettled(id)
    }

    /// Whether a newer edit may replace `id` in place (it is not being sent or replaced); if so,
    /// `id` is being replaced until `replacementEnded(_:)`.
    mutating func startReplacing(_ id: UUID) -> Bool { lifecycle.startReplacing(id) }

    mutating func replacementEnded(_ id: UUID) { lifecycle.replacementEnded(id) }
}
