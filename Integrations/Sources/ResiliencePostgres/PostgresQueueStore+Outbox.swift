import Foundation
import OfflineQueue
import PostgresNIO
import RequestEngine

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
    /// for it (so a key's entries are claimed in commit order). A transaction that enqueues for
    /// several keys, while others do too, should enqueue them in one agreed order, or PostgreSQL
    /// may end one of them as a deadlock (`.database` with SQLSTATE `40P01`).
    ///
    /// - Returns: the entry's id.
    /// - Throws: `PostgresQueueStoreError.notInTransaction` when `connection` has no open
    ///   transaction; `NetworkError.invalidRequest` and `OfflineQueueError.credentialsInURL`,
    ///   `.sensitiveQueryParameter`, `.sensitivePathParameter` for a request that may not be
    ///   stored; `.database` when a statement failed.
    public func enqueue(_ request: some QueueableRequest, on connection: PostgresConnection) async throws -> UUID {
        _ = try request.makeURLRequest()  // invalid requests are thrown, never stored
        if let deadline = request.deadline, deadline <= .zero {
            throw NetworkError.invalidRequest(reason: "a queued request's deadline must be positive")
        }
        let storable = try OutboxRequest(request, policy: secretPolicy)
        let entry = QueueEntry(storable, id: UUID(), enqueuedAt: Date())  // reads the idempotency key once
        let json = try Self.encodeEntry(entry)
        let logger = self.logger
        return try await perform("enqueue") {
            do {
                try await connection.query("SAVEPOINT resilience_outbox", logger: logger)
            } catch let error as PSQLError where error.serverInfo?[.sqlState] == "25P01" {
                throw PostgresQueueStoreError.notInTransaction  // no_active_sql_transaction
            }
            do {
                _ = try await insert(entry, json: json, limit: nil, on: connection)
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

/// A request as the outbox stores it: `QueueSecretPolicy` applied the way the engine's enqueue
/// applies it (the URL's fragment dropped, secret headers left out; URLs carrying credentials
/// refused). `QueueEntry`'s initializer then drops the always-secret headers and `Idempotency-Key`.
struct OutboxRequest<Base: QueueableRequest>: QueueableRequest {
    let base: Base
    let url: URL
    let headers: [String: String]

    init(_ base: Base, policy: QueueSecretPolicy) throws {
        let url = base.url
        if !(url.user ?? "").isEmpty || !(url.password ?? "").isEmpty {
            throw OfflineQueueError.credentialsInURL
        }
        let components = URLComponents(url: url, resolvingAgainstBaseURL: true)
        if let name = components?.queryItems?.first(where: { policy.isSecretParameter($0.name) })?.name {
            throw OfflineQueueError.sensitiveQueryParameter(name)
        }
        if let name = components.flatMap({ Self.secretPathParameter(in: $0, policy: policy) }) {
            throw OfflineQueueError.sensitivePathParameter(name)
        }
        self.base = base
        self.url = Self.removingFragment(from: url)
        self.headers = base.headers.filter { name, _ in !policy.isSecretHeader(name) }
    }

    var method: HTTPMethod { base.method }
    var body: Data? { base.body }
    var timeout: TimeInterval { base.timeout }
    var ttl: TimeInterval { base.ttl }
    var priority: QueuePriority { base.priority }
    /// Read through: the caller's default is a fresh UUID per read, and the entry reads it once.
    var idempotencyKey: String { base.idempotencyKey }
    var orderingKey: String? { base.orderingKey }
    var coalescingKey: String? { base.coalescingKey }
    var maximumResponseBodySize: Int? { base.maximumResponseBodySize }
    var deadline: Duration? { base.deadline }
    var requestPriority: RequestPriority { base.requestPriority }

    /// The first path parameter (`;name=value` in a path segment) whose name is secret.
    static func secretPathParameter(in components: URLComponents, policy: QueueSecretPolicy) -> String? {
        let path = components.percentEncodedPath
        guard path.contains(";") else { return nil }
        for segment in path.split(separator: "/") {
            for parameter in segment.split(separator: ";", omittingEmptySubsequences: false).dropFirst() {
                let encoded = String(parameter.prefix { $0 != "=" })
                let name = encoded.removingPercentEncoding ?? encoded
                if policy.isSecretParameter(name) { return name }
            }
        }
        return nil
    }

    /// `url` without its fragment (HTTP never sends it; it may hold a token).
    static func removingFragment(from url: URL) -> URL {
        guard url.fragment != nil else { return url }
        let absolute = url.absoluteString
        guard let hash = absolute.firstIndex(of: "#"), let stripped = URL(string: String(absolute[..<hash])) else { return url }
        return stripped
    }
}
