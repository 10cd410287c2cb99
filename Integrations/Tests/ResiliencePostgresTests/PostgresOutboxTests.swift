import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import Testing

/// The outbox enqueue inside the caller's transaction, what never reaches the table, and
/// `arrivals()`.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresOutboxTests {
    struct RolledBack: Error {}

    let logger = Logger(label: "PostgresOutboxTests")

    @Test func anOutboxEnqueueRollsBackWithItsTransaction() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let logger = self.logger
            await #expect(throws: PostgresTransactionError.self) {
                try await client.withTransaction(logger: logger) { connection in
                    _ = try await store.enqueue(request("/rolled-back"), on: connection)
                    throw RolledBack()
                }
            }
            #expect(try await store.queuedCount() == 0)

            let id = try await client.withTransaction(logger: logger) { connection in
                try await store.enqueue(request("/committed", idempotencyKey: "outbox-key"), on: connection)
            }
            #expect(try await store.queuedCount() == 1)
            let stored = try #require(try await store.queuedEntry(id: id))
            #expect(stored.url.path == "/committed" && stored.idempotencyKey == "outbox-key")
            #expect(try await store.claim(upTo: 1, now: Date(), lease: .seconds(30)).map(\.entry.id) == [id])
        }
    }

    @Test func anOutboxEnqueueNeedsATransaction() async throws {
        try await PostgresTestDatabase.withStore { store, client async throws in
            let outsideATransaction: @Sendable () async throws -> Void = {
                try await client.withConnection { connection in
                    _ = try await store.enqueue(request(), on: connection)
                }
            }
            await #expect(throws: PostgresQueueStoreError.notInTransaction) { try await outsideATransaction() }
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aFailedOutboxEnqueueLeavesTheCallersTransactionUsable() async throws {
        try await PostgresTestDatabase.withClient { client in
            // Never migrated: the enqueue's insert fails, under its savepoint.
            let store = try PostgresQueueStore(client: client, tableName: PostgresTestDatabase.uniqueTableName("missing"))
            let logger = self.logger
            let answer = try await client.withTransaction(logger: logger) { connection in
                await #expect(throws: PostgresQueueStoreError.self) { _ = try await store.enqueue(request(), on: connection) }
                var value: Int32 = 0
                for try await number in try await connection.query("SELECT 42", logger: logger).decode(Int32.self) { value = number }
                return value
            }
            #expect(answer == 42)
        }
    }

    @Test func secretHeadersNeverReachTheTable() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            // Never stored, whoever made the entry.
            let alwaysSecret = [
                "Authorization": "Bearer secret-token-1", "Cookie": "session=secret-cookie-2",
                "Proxy-Authorization": "Basic secret-proxy-3", "Idempotency-Key": "secret-idem-4",
            ]
            // Secret by the store's `secretPolicy` (the engine's default), which the outbox applies.
            let policySecret = ["X-Api-Key": "secret-api-5", "X-Refresh-Token": "secret-refresh-6"]
            let visible = ["X-Trace": "trace-visible"]
            let headers = alwaysSecret.merging(policySecret) { $1 }.merging(visible) { $1 }
            let logger = self.logger
            let outboxID = try await client.withTransaction(logger: logger) { connection in
                try await store.enqueue(request("/outbox", headers: headers, idempotencyKey: "kept-key"), on: connection)
            }
            // `add` of an entry carrying the always-secret headers (decoded by a caller, say).
            let handMade = try entry(request("/add", idempotencyKey: "add-key")).withRawHeaders(alwaysSecret.merging(visible) { $1 })
            let added = try await store.add(handMade, limit: nil)

            let outboxRow = try await client.strings(PostgresQuery(unsafeSQL: "SELECT entry::text FROM \"\(store.tableName)\" WHERE id = '\(outboxID)'"))
            let addedRow = try await client.strings(PostgresQuery(unsafeSQL: "SELECT entry::text FROM \"\(store.tableName)\" WHERE id = '\(added.id)'"))
            for (row, secrets) in [(outboxRow.first ?? "", alwaysSecret.merging(policySecret) { $1 }), (addedRow.first ?? "", alwaysSecret)] {
                for (name, value) in secrets {
                    #expect(!row.contains(value), "\(name)'s value reached the table")
                    #expect(!row.lowercased().contains("\"\(name.lowercased())\""), "\(name) reached the table")
                }
                #expect(row.contains("trace-visible"))
            }
            #expect(try await store.queuedEntry(id: outboxID)?.headers == visible)
            #expect(try await store.queuedEntry(id: outboxID)?.idempotencyKey == "kept-key")
            #expect(try await store.queuedEntry(id: added.id)?.headers == visible)
            #expect(try await store.queuedEntry(id: added.id)?.idempotencyKey == "add-key")
        }
    }

    @Test func theOutboxRefusesURLsWithCredentialsAndDropsTheFragment() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let logger = self.logger
            func enqueue(_ url: String) async throws -> UUID {
                do {
                    return try await client.withTransaction(logger: logger) { connection in
                        try await store.enqueue(QueuedRequest(method: .post, url: URL(string: url)!), on: connection)
                    }
                } catch let error as PostgresTransactionError {
                    throw error.closureError ?? error
                }
            }
            await #expect(throws: OfflineQueueError.credentialsInURL) { _ = try await enqueue("https://user:pw@api.example.com/x") }
            await #expect(throws: OfflineQueueError.sensitiveQueryParameter("access_token")) {
                _ = try await enqueue("https://api.example.com/x?access_token=abc")
            }
            await #expect(throws: OfflineQueueError.sensitivePathParameter("jsessionid")) {
                _ = try await enqueue("https://api.example.com/cart;jsessionid=abc")
            }
            var noTimeLeft = request()
            noTimeLeft.deadline = .zero
            let invalid = noTimeLeft
            await #expect(throws: NetworkError.self) {
                do {
                    try await client.withTransaction(logger: logger) { connection in _ = try await store.enqueue(invalid, on: connection) }
                } catch let error as PostgresTransactionError {
                    throw error.closureError ?? error
                }
            }
            #expect(try await store.queuedCount() == 0)
            let id = try await enqueue("https://api.example.com/x?page=2#access_token=abc")
            #expect(try await store.queuedEntry(id: id)?.url.absoluteString == "https://api.example.com/x?page=2")
        }
    }

    @Test func arrivalsListensAgainAfterItsConnectionIsLost() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let listener = try PostgresQueueStore(client: client, tableName: store.tableName, reconnectDelay: .milliseconds(10))
            var arrivals = listener.arrivals().makeAsyncIterator()
            #expect(await arrivals.next() != nil)
            // The server ends the listening connection (a failover, an idle timeout, …).
            let terminated = try await client.integer(
                PostgresQuery(
                    unsafeSQL: """
                        SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                        WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN "\(store.tableName)"%'
                        """))
            #expect(terminated == 1)
            #expect(await arrivals.next() != nil)  // listening again, on another connection

            _ = try await store.add(entry(request()), limit: nil)
            #expect(await arrivals.next() != nil)
        }
    }

    @Test func arrivalsYieldsAfterAnotherClientsAdd() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, client in
                let writer = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                var arrivals = store.arrivals().makeAsyncIterator()
                #expect(await arrivals.next() != nil)  // listening: anything before is the caller's to look for

                _ = try await writer.add(entry(request("/from-the-other-replica")), limit: nil)
                #expect(await arrivals.next() != nil)

                let logger = self.logger
                _ = try await otherClient.withTransaction(logger: logger) { connection in
                    try await writer.enqueue(request("/outbox"), on: connection)
                }
                #expect(await arrivals.next() != nil)
                _ = client
            }
        }
    }
}
