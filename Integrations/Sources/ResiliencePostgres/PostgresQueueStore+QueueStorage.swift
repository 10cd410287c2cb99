import Foundation
import Logging
import OfflineQueue
import PostgresNIO

/// `PostgresQueueStore` as a `QueueStorage`: each requirement is one statement, or one short
/// transaction, so every rule holds whichever replicas run at once (see `PostgresQueueStore`).
extension PostgresQueueStore: QueueStorage {
    nonisolated(nonsending) public func queuedEntries() async throws -> [QueueEntry] {
        try await perform("queuedEntries") {
            let rows = try await client.query("SELECT seq, entry::text FROM \(unescaped: names.queue) ORDER BY priority DESC, seq", logger: logger)
            return try await Self.entries(from: rows)
        }
    }

    nonisolated(nonsending) public func queuedCount() async throws -> Int {
        try await perform("queuedCount") {
            var count: Int64 = 0
            for try await value in try await client.query("SELECT count(*) FROM \(unescaped: names.queue)", logger: logger).decode(Int64.self) {
                count = value
            }
            return Int(count)
        }
    }

    nonisolated(nonsending) public func queuedEntry(id: UUID) async throws -> QueueEntry? {
        try await perform("queuedEntry") {
            let rows = try await client.query("SELECT seq, entry::text FROM \(unescaped: names.queue) WHERE id = \(id)", logger: logger)
            return try await Self.entries(from: rows).first
        }
    }

    nonisolated(nonsending) public func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool {
        guard orderingKey != nil || coalescingKey != nil else { return false }
        return try await perform("hasQueuedEntries") {
            let rows = try await client.query(
                """
                SELECT EXISTS (SELECT 1 FROM \(unescaped: names.queue) WHERE ordering_key = \(orderingKey))
                    OR EXISTS (SELECT 1 FROM \(unescaped: names.queue) WHERE coalescing_key = \(coalescingKey))
                """, logger: logger)
            var found = false
            for try await exists in rows.decode(Bool.self) { found = exists }
            return found
        }
    }

    /// Stores `entry` in a transaction of its own, and notifies the table's channel when it
    /// commits (`arrivals()`).
    ///
    /// The transaction first takes advisory locks on the entry's ordering and coalescing keys, so
    /// entries of one key get their `seq` in the order their transactions commit. With a
    /// `coalescingKey`, the key's newest row is replaced in place (it keeps its `seq`; the row
    /// takes the new entry's id) when it has no lease and the same ordering key as the entry (or
    /// neither has one); otherwise — the row is being sent, its consumer's lease ran out, or it
    /// belongs to another ordering key — it keeps its place and the edit is added behind it. An
    /// entry whose id is queued already is updated in place (its `seq` and any claim kept).
    ///
    /// `limit` bounds the whole table, every replica's entries together: the engine passes its
    /// `maxQueueSize`, so on shared storage that is the most entries all replicas hold at once.
    /// Checking it takes a table-wide advisory lock and counts the rows, so adds with a limit run
    /// one at a time; `nil` or `Int.max` takes neither (the outbox's `enqueue(_:on:)` never has a
    /// limit).
    ///
    /// - Throws: `OfflineQueueError.full` when `limit` rows are queued and the entry needs a new
    ///   one; `.database` when the write failed. Nothing is stored then, with one exception no
    ///   client can rule out: when the connection is lost after the server committed but before
    ///   its answer arrived, the error is thrown for an entry that is stored, and that entry is
    ///   delivered like any other.
    nonisolated(nonsending) public func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry {
        let json = try Self.encodeEntry(entry)
        let (stored, replaced) = try await transaction("add") { [self] connection in
            try await insert(entry, json: json, limit: limit, on: connection)
        }
        changeFeed.publish(.stored(stored, replacing: replaced))
        return stored
    }

    /// One statement: the claimable rows are locked (`FOR UPDATE SKIP LOCKED`, so consumers never
    /// wait for one another nor take the same row) and each gets a fresh lease token and
    /// `lease_until = now + lease`. A row that cannot be read as an entry is left out of the result
    /// (and logged, by id), leased like the others, so it never stops them.
    nonisolated(nonsending) public func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim] {
        guard limit > 0 else { return [] }
        let leaseEnds = now.addingTimeInterval(lease.timeInterval)
        return try await perform("claim") {
            // Claimable: not leased (or its lease ran out), due, alive, and the head of its ordering
            // key and of its coalescing key: no row of the key with a smaller seq, claimed or not.
            // The head rule also keeps a batch to one row per key.
            let rows = try await hotRows(
                """
                WITH claimable AS (
                    SELECT q.id FROM \(unescaped: names.queue) q
                    WHERE (q.lease_token IS NULL OR q.lease_until <= \(now))
                      AND (q.next_attempt_at IS NULL OR q.next_attempt_at <= \(now))
                      AND q.expires_at > \(now)
                      AND (q.ordering_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM \(unescaped: names.queue) o WHERE o.ordering_key = q.ordering_key AND o.seq < q.seq))
                      AND (q.coalescing_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM \(unescaped: names.queue) c WHERE c.coalescing_key = q.coalescing_key AND c.seq < q.seq))
                    ORDER BY q.priority DESC, q.seq
                    LIMIT \(Int64(limit))
                    FOR UPDATE OF q SKIP LOCKED
                )
                UPDATE \(unescaped: names.queue) t
                SET lease_token = gen_random_uuid(), lease_until = \(leaseEnds)
                FROM claimable
                WHERE t.id = claimable.id
                RETURNING t.id, t.priority, t.seq, t.lease_token, t.entry::text
                """)
            var claimed: [(priority: Int32, claim: QueueClaim)] = []
            for row in rows {
                let (id, priority, seq, token, json) = try row.decode((UUID, Int32, Int64, UUID, String).self)
                // A row this library cannot read (written by hand, or by a newer format) is left
                // leased and out of the batch, so it never stops the others; once its lease ends it
                // is tried again (and still holds back the rest of its key).
                guard let entry = try? Self.decodeEntry(json, seq: seq) else {
                    logger.error("unreadable queue entry left in the table", metadata: ["table": "\(names.plain)", "id": "\(id)"])
                    continue
                }
                claimed.append((priority, QueueClaim(entry: entry, token: token, leaseEnds: leaseEnds)))
            }
            // UPDATE … RETURNING keeps no order: the claims go back in claim order.
            claimed.sort { ($0.priority, $1.claim.entry.sequence) > ($1.priority, $0.claim.entry.sequence) }
            batcher.claimed(claimed.map(\.claim))
            return claimed.map(\.claim)
        }
    }

    nonisolated(nonsending) public func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim {
        let leaseEnds = now.addingTimeInterval(lease.timeInterval)
        guard try await changeInBatch(Renewal(id: claim.entry.id, token: claim.token, until: leaseEnds)) else {
            claimFoundLost(claim)  // its consumer stops; nothing will settle it
            throw OfflineQueueError.claimLost(id: claim.entry.id)
        }
        batcher.renewed(claim.token, until: leaseEnds)
        return QueueClaim(entry: claim.entry, token: claim.token, leaseEnds: leaseEnds)
    }

    /// Deletes the claim's row: a delivered entry leaves no row behind.
    /// Settlements — completions, releases, dead letters — of claims in flight at once share one
    /// statement (`ClaimBatcher`): a settlement waits at most `Configuration.completionWindow` for
    /// the others, and not at all when no other claim of this store is out.
    nonisolated(nonsending) public func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws {
        let settlement = Settlement(id: claim.entry.id, token: claim.token, kind: .delete, notice: notice("r", claim.entry.id, reason.notice))
        guard try await changeInBatch(settlement) else { throw OfflineQueueError.claimLost(id: claim.entry.id) }
        changeFeed.publish(.removed(claim.entry, reason: reason))
    }

    /// Writes `entry` (attempts, next attempt time, last error) into the claim's row and clears its
    /// lease; the row keeps its `seq`. Batched with other settlements, as `complete` is.
    nonisolated(nonsending) public func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws {
        let settlement = Settlement(
            id: claim.entry.id, token: claim.token, kind: .release, entryJSON: try encodeSettled(entry, of: claim),
            priority: Int32(clamping: entry.priority), nextAttemptAt: entry.nextAttemptAt, expiresAt: entry.expiresAt,
            notice: notice("u", claim.entry.id))
        guard try await changeInBatch(settlement) else { throw OfflineQueueError.claimLost(id: claim.entry.id) }
        let kept = entry.placed(at: claim.entry.sequence)
        if kept != claim.entry { changeFeed.publish(.updated(kept)) }
    }

    /// Moves the claim's row to `<table>_dead_letter` as `entry`, in one statement (both or
    /// neither). Batched with other settlements, as `complete` is.
    nonisolated(nonsending) public func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws {
        let settlement = Settlement(
            id: claim.entry.id, token: claim.token, kind: .deadLetter, entryJSON: try encodeSettled(entry, of: claim),
            notice: notice("r", claim.entry.id, "l\(entry.attempts)"))
        guard try await changeInBatch(settlement) else { throw OfflineQueueError.claimLost(id: claim.entry.id) }
        changeFeed.publish(.removed(entry.placed(at: claim.entry.sequence), reason: .deadLettered(attempts: entry.attempts)))
    }

    /// `entry`'s JSON for a settlement of `claim`; when it cannot be encoded the claim is given
    /// up (its lease runs out), so no batch waits for it.
    private func encodeSettled(_ entry: QueueEntry, of claim: QueueClaim) throws -> String {
        do {
            return try Self.encodeEntry(entry)
        } catch {
            claimFoundLost(claim)
            throw error
        }
    }

    nonisolated(nonsending) public func cancel(id: UUID) async throws -> Bool {
        let removed = try await perform("cancel") {
            try await Self.entries(
                from: client.query(
                    """
                    WITH gone AS (DELETE FROM \(unescaped: names.queue) WHERE id = \(id) RETURNING id, seq, entry)
                    SELECT gone.seq, gone.entry::text FROM gone,
                        LATERAL (SELECT pg_notify(\(names.plain), \(noticePrefix("r")) || gone.id::text || '|c')) AS notified
                    """, logger: logger))
        }
        for entry in removed { changeFeed.publish(.removed(entry, reason: .cancelled)) }
        return !removed.isEmpty
    }

    /// Deletes every row of the table: every replica's entries, claimed ones included (their
    /// claims then end as lost). The dead letters are kept.
    nonisolated(nonsending) public func removeAll() async throws {
        let removed = try await perform("removeAll") {
            try await Self.entries(
                from: client.query(
                    """
                    WITH gone AS (DELETE FROM \(unescaped: names.queue) RETURNING id, seq, entry)
                    SELECT gone.seq, gone.entry::text FROM gone,
                        LATERAL (SELECT pg_notify(\(names.plain), \(noticePrefix("r")) || gone.id::text || '|c')) AS notified
                    """, logger: logger))
        }
        for entry in removed { changeFeed.publish(.removed(entry, reason: .cancelled)) }
    }

    /// Deletes the rows expired at `now` that nobody holds: unleased, or whose lease ran out (its
    /// consumer is gone, and an expired entry is never claimed again), skipping rows another
    /// consumer has locked at that moment. A deleted row that cannot be read as an entry is left
    /// out of the result and logged by id, so the others' results are not lost with it.
    nonisolated(nonsending) public func removeExpired(now: Date) async throws -> [QueueEntry] {
        try await perform("removeExpired") {
            let rows = try await client.query(
                """
                WITH expired AS (
                    SELECT id FROM \(unescaped: names.queue)
                    WHERE expires_at <= \(now) AND (lease_token IS NULL OR lease_until <= \(now))
                    FOR UPDATE SKIP LOCKED
                ), gone AS (
                    DELETE FROM \(unescaped: names.queue) t USING expired WHERE t.id = expired.id
                    RETURNING t.id, t.priority, t.seq, t.entry)
                SELECT gone.id, gone.priority, gone.seq, gone.entry::text FROM gone,
                    LATERAL (SELECT pg_notify(\(names.plain), \(noticePrefix("r")) || gone.id::text || '|e')) AS notified
                """, logger: logger)
            var removed: [(priority: Int32, entry: QueueEntry)] = []
            for try await (id, priority, seq, json) in rows.decode((UUID, Int32, Int64, String).self) {
                // The row is deleted already: throwing would lose every other row's result.
                guard let entry = try? Self.decodeEntry(json, seq: seq) else {
                    logger.error("unreadable expired queue entry removed", metadata: ["table": "\(names.plain)", "id": "\(id)"])
                    continue
                }
                removed.append((priority, entry))
            }
            removed.sort { ($0.priority, $1.entry.sequence) > ($1.priority, $0.entry.sequence) }
            for (_, entry) in removed { changeFeed.publish(.removed(entry, reason: .expired)) }
            return removed.map(\.entry)
        }
    }

    /// When the next entry that waits may become claimable: the earliest `nextAttemptAt` among
    /// unleased entries, and for a leased one the time its lease ends (another consumer may take
    /// it over then, should its holder have died). Entries behind the head of their ordering or
    /// coalescing key are left out: they cannot go before it. Read with the claim rules, a date
    /// in the past is an entry due now, never one a live lease holds.
    nonisolated(nonsending) public func earliestNextAttempt() async throws -> Date? {
        try await perform("earliestNextAttempt") {
            let rows = try await client.query(
                """
                SELECT min(CASE WHEN q.lease_token IS NULL THEN q.next_attempt_at ELSE q.lease_until END)
                FROM \(unescaped: names.queue) q
                WHERE (q.ordering_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM \(unescaped: names.queue) o WHERE o.ordering_key = q.ordering_key AND o.seq < q.seq))
                  AND (q.coalescing_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM \(unescaped: names.queue) c WHERE c.coalescing_key = q.coalescing_key AND c.seq < q.seq))
                """, logger: logger)
            var earliest: Date?
            for try await date in rows.decode(Date?.self) { earliest = date }
            return earliest
        }
    }
}

// MARK: - Adding, shared with the outbox

extension PostgresQueueStore {
    /// Adds `entry` (as `json`) inside the transaction open on `connection`: the key locks, the
    /// coalescing replacement or the limit check, the insert, and the notification (sent when the
    /// transaction commits).
    func insert(
        _ entry: QueueEntry, json: String, limit: Int?, publishes: Bool = true, on connection: PostgresConnection
    ) async throws -> (QueueEntry, replaced: UUID?) {
        // A limit of `Int.max` bounds nothing: no count, and no table-wide lock.
        let limit = limit == Int.max ? nil : limit
        // Advisory locks, held to the end of the transaction, in one order for every transaction
        // (sorted by their hash) so that two adds never wait for each other in a cycle.
        var locks: [String] = []
        if let key = entry.orderingKey { locks.append("\(names.plain):o:\(key)") }
        if let key = entry.coalescingKey { locks.append("\(names.plain):c:\(key)") }
        if limit != nil { locks.append("\(names.plain):count") }
        if !locks.isEmpty {
            try await connection.query(
                """
                SELECT pg_advisory_xact_lock(h)
                FROM (SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest(\(locks)::text[]) AS k ORDER BY h) AS locks
                """, logger: logger)
        }

        if let key = entry.coalescingKey, let (placed, holder, stored) = try await replaceHolder(of: key, with: entry, json: json, on: connection) {
            try await notify(notice("s", entry.id, holder.uuidString, fromHere: publishes), on: connection)
            // As stored: with the holder's base, when it had one (`QueueEntry.replacing(_:)`).
            let replacing = (try? Self.decodeEntry(stored, seq: placed)) ?? entry.placed(at: UInt64(placed))
            return (replacing, holder)
        }

        if let limit {
            var queued: Int64 = 0
            var present = false
            let counts = try await connection.query(
                "SELECT count(*), coalesce(bool_or(id = \(entry.id)), false) FROM \(unescaped: names.queue)", logger: logger)
            for try await (count, isPresent) in counts.decode((Int64, Bool).self) { (queued, present) = (count, isPresent) }
            if !present && queued >= Int64(limit) { throw OfflineQueueError.full }
        }

        let rows = try await connection.query(
            """
            WITH added AS (
                INSERT INTO \(unescaped: names.queue) (id, seq, priority, ordering_key, coalescing_key, next_attempt_at, expires_at, entry)
                VALUES (
                    \(entry.id), nextval(\(unescaped: names.sequenceLiteral)), \(Int32(clamping: entry.priority)), \(entry.orderingKey),
                    \(entry.coalescingKey), \(entry.nextAttemptAt), \(entry.expiresAt), \(json)::jsonb)
                ON CONFLICT (id) DO UPDATE SET
                    priority = EXCLUDED.priority, ordering_key = EXCLUDED.ordering_key, coalescing_key = EXCLUDED.coalescing_key,
                    next_attempt_at = EXCLUDED.next_attempt_at, expires_at = EXCLUDED.expires_at, entry = EXCLUDED.entry
                RETURNING seq
            )
            SELECT added.seq FROM added, LATERAL (SELECT pg_notify(\(names.plain), \(notice("s", entry.id, fromHere: publishes)))) AS notified
            """, logger: logger)
        var placed: Int64?
        for try await seq in rows.decode(Int64.self) { placed = seq }
        guard let placed else {
            throw PostgresQueueStoreError.database(operation: "add", sqlState: nil, message: "the insert returned no row")
        }
        return (entry.placed(at: UInt64(placed)), nil)
    }

    /// Replaces the newest row of coalescing key `key` with `entry`, in its place (its `seq`), and
    /// returns that `seq`; `nil` when there is no such row, or it may not be replaced: it is leased
    /// (being sent, or its consumer's lease ran out), or its ordering key differs from the entry's
    /// (keeping its `seq` would move the edit ahead of its own key's earlier entries). An entry
    /// whose id is queued already is never a replacement (`insert` updates its row).
    ///
    /// One statement: the holder is found by a sub-select, which takes no row lock, and replaced by
    /// an `UPDATE` whose condition holds the checks. A lock taken on a leased row would be held
    /// until the transaction commits — an outbox's, for as long as its caller keeps it open — and
    /// the replica sending that row would wait for it to renew, complete or release its claim. The
    /// `UPDATE` locks only a row it changes (an unleased one); should a claim take the row
    /// meanwhile, it waits for that claim's statement, then sees the lease and changes nothing.
    ///
    /// The edit keeps the holder's base (`baseETag`, `baseLastModified`) when the holder has one:
    /// the version the user saw before the first of the edits (`QueueEntry.replacing(_:)`). The
    /// row's entry as stored is returned with its `seq` and the holder's id.
    private func replaceHolder(of key: String, with entry: QueueEntry, json: String, on connection: PostgresConnection) async throws -> (Int64, UUID, String)? {
        var placed: (Int64, UUID, String)?
        let replaced = try await connection.query(
            """
            WITH holder AS (
                SELECT id FROM \(unescaped: names.queue)
                WHERE coalescing_key = \(key) AND id <> \(entry.id)
                ORDER BY seq DESC LIMIT 1)
            UPDATE \(unescaped: names.queue) AS t
            SET id = \(entry.id), priority = \(Int32(clamping: entry.priority)), ordering_key = \(entry.orderingKey),
                coalescing_key = \(entry.coalescingKey), next_attempt_at = \(entry.nextAttemptAt), expires_at = \(entry.expiresAt),
                lease_token = NULL, lease_until = NULL,
                entry = CASE WHEN t.entry ?| array['baseETag', 'baseLastModified']
                    THEN (\(json)::jsonb - 'baseETag' - 'baseLastModified')
                        || jsonb_strip_nulls(jsonb_build_object('baseETag', t.entry -> 'baseETag', 'baseLastModified', t.entry -> 'baseLastModified'))
                    ELSE \(json)::jsonb END
            FROM holder
            WHERE t.id = holder.id
                AND t.lease_token IS NULL AND t.ordering_key IS NOT DISTINCT FROM \(entry.orderingKey)
                AND NOT EXISTS (SELECT 1 FROM \(unescaped: names.queue) x WHERE x.id = \(entry.id))
            RETURNING t.seq, holder.id, t.entry::text
            """, logger: logger)
        for try await (seq, holder, stored) in replaced.decode((Int64, UUID, String).self) { placed = (seq, holder, stored) }
        return placed
    }

    /// `NOTIFY` on the table's channel with `payload`, delivered when the transaction commits.
    private func notify(_ payload: String, on connection: PostgresConnection) async throws {
        try await connection.query("SELECT pg_notify(\(names.plain), \(payload))", logger: logger)
    }
}
