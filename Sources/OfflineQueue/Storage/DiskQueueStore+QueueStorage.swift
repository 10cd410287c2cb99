import Foundation
@_spi(ResilienceCore) import ResilienceCore

/// `DiskQueueStore` as a `QueueStorage`: one engine owns a folder (its lock says so), so a claim is
/// an in-memory mark with no lease (`leaseEnds` is `nil`, `renew` only checks it), and a crash
/// drops every claim with the process: the next open finds each entry queued, as on disk.
extension DiskQueueStore: QueueStorage {
    public func queuedEntries() async throws -> [QueueEntry] { orderedEntries() }

    public func queuedCount() async throws -> Int { entryCount }

    public func queuedEntry(id: UUID) async throws -> QueueEntry? { entry(id: id) }

    public func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool {
        if let orderingKey, hasEntries(orderingKey: orderingKey) { return true }
        if let coalescingKey, entry(coalescingKey: coalescingKey) != nil { return true }
        return false
    }

    /// True when no entry of either key is queued and, for a coalescing key, every deletion so
    /// far is durable (`makeDeletionsDurable()`; false when the disk refuses).
    public func maySendAtOnce(orderingKey: String?, coalescingKey: String?) async -> Bool {
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

    public func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry {
        var entry = entry.withStorableHeaders()
        // The holder of the coalescing key is replaced in its place unless it is claimed or of
        // another ordering key (whose line the edit must not jump); while the edit is written the
        // holder is marked, so `claim` does not offer it meanwhile.
        var replaced: QueueEntry?
        if let key = entry.coalescingKey, let holder = self.entry(coalescingKey: key), holder.id != entry.id,
            holder.orderingKey == entry.orderingKey
        {
            replaced = claims.withLock { claims in
                guard claims[holder.id] == nil else { return nil }
                claims[holder.id] = .some(nil)
                return holder
            }
        }
        defer { if let replaced { claims.withLock { _ = $0.removeValue(forKey: replaced.id) } } }
        if entry.coalescingKey != nil { entry = entry.revised(Int(makeSequence())) }
        entry = entry.placed(at: replaced?.sequence ?? makeSequence())
        try await insert(entry, limit: limit, replacing: replaced?.id)
        return entry
    }

    /// Reads the index in replay order only as far as it needs: the first claimable entries, each
    /// the head of its ordering and coalescing keys (`QueueIndex.isHead`), so a claim from the
    /// front of the queue costs O(1) rather than a pass over every entry.
    public func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim] {
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
                for claim in claimed { claims[claim.entry.id] = nil }
            }
            throw error
        }
    }

    public func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim {
        try checkLive(claim, ending: false)
        return claim
    }

    public func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws {
        try checkLive(claim, ending: true)
        discard(id: claim.entry.id, reason: reason)
    }

    public func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws {
        try checkLive(claim, ending: true)
        if entry != claim.entry { try await update(entry) }
    }

    public func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws {
        try checkLive(claim, ending: false)
        // A dead letter that cannot be written keeps the claim: the consumer then releases the
        // entry for a later attempt instead of losing it.
        _ = try await moveToDeadLetter(entry)
        claims.withLock { _ = $0.removeValue(forKey: claim.entry.id) }
    }

    public func cancel(id: UUID) async throws -> Bool {
        guard entry(id: id) != nil else { return false }
        try remove(id: id)
        claims.withLock { _ = $0.removeValue(forKey: id) }
        return true
    }

    public func removeExpired(now: Date) async throws -> [QueueEntry] {
        let claimed = claims.withLock { Set($0.keys) }
        let expired = orderedEntries().filter { $0.isExpired(at: now) && !claimed.contains($0.id) }
        for entry in expired { discard(id: entry.id, reason: .expired) }
        finishRemovals()
        return expired
    }

    /// The earliest backoff's end among the entries `claim` may offer: the first of each ordering
    /// key and of each coalescing key (an edit waiting behind an earlier one of its key does not
    /// count, whatever its own date).
    public func earliestNextAttempt() async throws -> Date? {
        earliestBackoffEnd(coalescingFollowers: false)
    }

    /// Throws `claimLost` unless `claim` is its entry's live claim and the entry is queued; with
    /// `ending`, the claim ends here.
    private func checkLive(_ claim: QueueClaim, ending: Bool) throws {
        let id = claim.entry.id
        let live = claims.withLock { claims -> Bool in
            guard claims[id] == .some(claim.token) else { return false }
            if ending { claims[id] = nil }
            return true
        }
        guard live, entry(id: id) != nil else {
            if live && !ending { claims.withLock { _ = $0.removeValue(forKey: id) } }
            throw OfflineQueueError.claimLost(id: id)
        }
    }
}
