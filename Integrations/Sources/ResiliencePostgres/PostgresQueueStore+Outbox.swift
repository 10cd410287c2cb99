import Foundation
import OfflineQueue
import PostgresNIO

extension PostgresQueueStore {
    /// Queues `request` inside the transaction open on `connection` — the transactional outbox: the
    /// entry exists if and only if that transaction commits, so a service's own write and the call
    /// it owes a partner are stored together or not at all. Replicas draining the table learn of it
    /// when the transaction commits (`arrivals()`).
    ///
    /// ```swift
    /// try await client.withTransaction(logger: logger) { connection in
    ///     try await connection.query("INSERT INTO orders (id, total) VALUES (\(order.id), \(order.total))", logger: logger)
    ///     try await store.enqueue(NotifyWarehouse(order: order), on: connection)
    /// }
    /// ```
    ///
    /// The request is stored as `OfflineQueueEngine.enqueue` stores it: checked first (an invalid
    /// request, or a deadline that is not positive, is refused), its URL's fragment dropped, URLs
    /// with user-info or secret query or path parameters refused, and the headers `secretPolicy`
    /// calls secret never written (`Authorization`, `Cookie`, `Proxy-Authorization`, API keys…; a
    /// replaying sender adds its credentials at send time). `request.idempotencyKey` is read once
    /// and kept for every attempt. Nothing is sent here: a replica's engine delivers it.
    ///
    /// The store's statements run under a savepoint: when one fails, the caller's transaction is
    /// left as it was before the call (and still usable), and the error is thrown.
    ///
    /// Like `add`, it takes advisory locks on the request's ordering and coalescing keys, held
    /// until the caller's transaction ends: another transaction enqueuing for the same key waits
    /// for it (so a key's entries are claimed in commit order). Transactions that enqueue for one
    /// key therefore run one after another from their enqueue to their commit: give a key to what
    /// must stay in order (one customer, one account), not to a whole kind of request. A
    /// transaction that enqueues for several keys, while others do too, should enqueue them in one
    /// agreed order, or PostgreSQL may end one of them as a deadlock (`.database` with SQLSTATE
    /// `40P01`). It takes no limit: `OfflineQueueEngine.maxQueueSize` does not bound the outbox.
    ///
    /// With a coalescing key, the key's newest row is replaced in place when it has no lease and
    /// the same ordering key, as `add` does; beside a row being sent the edit is added behind it,
    /// and the replica sending that row never waits for the caller's transaction.
    ///
    /// Written for READ COMMITTED, PostgreSQL's default. Under REPEATABLE READ or SERIALIZABLE the
    /// enqueue reads the table as of the transaction's snapshot: ordering keys still keep commit
    /// order, but with a coalescing key it fails with a serialization failure (`.database` with
    /// SQLSTATE `40001`: roll back and retry the transaction) when the row it would replace
    /// changed since the snapshot, and it adds its edit behind one that another transaction
    /// committed since, instead of replacing it (both are delivered, the newest last).
    ///
    /// - Returns: the entry's id.
    /// - Throws: `PostgresQueueStoreError.notInTransaction` when `connection` has no open
    ///   transaction; `NetworkError.invalidRequest` and `OfflineQueueError.credentialsInURL`,
    ///   `.sensitiveQueryParameter`, `.sensitivePathParameter` for a request that may not be
    ///   stored; `.database` when a statement failed.
    public func enqueue(_ request: some QueueableRequest, on connection: PostgresConnection) async throws -> UUID {
        // Checked and stripped by the engine's own rule; the idempotency key is read once, here.
        let entry = try secretPolicy.entry(for: request, id: UUID(), enqueuedAt: Date())
        let json = try Self.encodeEntry(entry)
        let logger = self.logger
        return try await perform("enqueue") {
            do {
                try await connection.query("SAVEPOINT resilience_outbox", logger: logger)
            } catch let error as PSQLError where error.serverInfo?[.sqlState] == "25P01" {
                throw PostgresQueueStoreError.notInTransaction  // no_active_sql_transaction
            }
            do {
                // Not published here: the caller's transaction may roll back. Every feed, this
                // store's too, learns of it from its notice once it commits.
                _ = try await insert(entry, json: json, limit: nil, publishes: false, on: connection)
                try await connection.query("RELEASE SAVEPOINT resilience_outbox", logger: logger)
            } catch {
                _ = try? await connection.query("ROLLBACK TO SAVEPOINT resilience_outbox", logger: logger)
                _ = try? await connection.query("RELEASE SAVEPOINT resilience_outbox", logger: logger)
                throw error
            }
            return entry.id
        }
    }
}
