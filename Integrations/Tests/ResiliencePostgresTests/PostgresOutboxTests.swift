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

    /// The change feed learns of an outbox enqueue from its notice, once the transaction commits
    /// (the store does not publish it itself: the transaction might roll back); a rolled-back one
    /// never shows.
    @Test func anOutboxEnqueueShowsOnTheChangeFeedOnlyOnceCommitted() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let logger = self.logger
            var changes = store.changeFeed.changes.makeAsyncIterator()  // starts following the table
            await #expect(throws: PostgresTransactionError.self) {
                try await client.withTransaction(logger: logger) { connection in
                    _ = try await store.enqueue(request("/rolled-back"), on: connection)
                    throw RolledBack()
                }
            }
            let id = try await client.withTransaction(logger: logger) { connection in
                try await store.enqueue(request("/committed"), on: connection)
            }
            guard case .stored(let entry, nil) = await changes.next() else {
                Issue.record("no stored change")
                return
            }
            #expect(entry.id == id && entry.url.path == "/committed")
            #expect(store.changeFeed.entries().map(\.id) == [id])
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

    @Test func anOpenOutboxTransactionBesideALeasedHolderNeverHoldsUpItsReplica() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let holder = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v1"), enqueuedAt: Date()), limit: nil)
            let claim = try #require(try await store.claim(upTo: 1, now: Date(), lease: .seconds(30)).first)
            #expect(claim.entry.id == holder.id)

            // A request handler's transaction queues an edit beside the holder being sent, and
            // goes on working: its transaction stays open.
            let handler = try await OpenTransaction.begin(on: client) { connection in
                try await store.enqueue(request("/profile", coalescingKey: "profile", body: "v2"), on: connection)
            }
            // Meanwhile the replica sending the holder renews its lease, releases it after a
            // failed attempt, claims it again and completes it: none of it waits for the handler.
            let settled = try await within(.seconds(10)) {
                let renewed = try await store.renew(claim, now: Date(), lease: .seconds(30))
                try await store.release(renewed, keeping: renewed.entry)
                let again = try #require(try await store.claim(upTo: 1, now: Date(), lease: .seconds(30)).first)
                try await store.complete(again, reason: .delivered(statusCode: 200))
                return again.entry.id
            }
            try await handler.commit()
            #expect(settled == holder.id, "the holder's renew, release or complete waited for the open outbox transaction")

            let next = try await store.claim(upTo: 10, now: Date(), lease: .seconds(30))
            #expect(next.map(\.entry.id) == [handler.value])
            #expect(next.first?.entry.body == Data("v2".utf8))
        }
    }

    @Test func outboxEnqueuesOfOneKeyWaitInTurnAndAreClaimedInCommitOrder() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let first = try await OpenTransaction.begin(on: client) { connection in
                try await store.enqueue(request("/first", orderingKey: "K"), on: connection)
            }
            // A second transaction enqueuing for K waits for the first's key lock.
            let second = Task {
                try await OpenTransaction.begin(on: client) { connection in
                    try await store.enqueue(request("/second", orderingKey: "K"), on: connection)
                }
            }
            try await client.untilSomeoneWaits(forAdvisoryLock: "\(store.tableName):o:K")
            #expect(try await store.claim(upTo: 10, now: Date(), lease: .seconds(30)).isEmpty)  // neither committed

            try await first.commit()
            let secondOpen = try await second.value  // its enqueue returns once the first committed
            let head = try await store.claim(upTo: 10, now: Date(), lease: .seconds(30))
            #expect(head.map(\.entry.id) == [first.value])
            try await secondOpen.commit()
            #expect(try await store.claim(upTo: 10, now: Date(), lease: .seconds(30)).isEmpty)  // behind the head in flight

            try await store.complete(try #require(head.first), reason: .delivered(statusCode: 200))
            #expect(try await store.claim(upTo: 10, now: Date(), lease: .seconds(30)).map(\.entry.id) == [secondOpen.value])
        }
    }

    /// The outbox is written for READ COMMITTED: a stricter level reads the queue as of the
    /// caller's snapshot, which the guide's outbox section tells.
    @Test(arguments: ["REPEATABLE READ", "SERIALIZABLE"])
    func underAStricterIsolationACoalescingEnqueueReadsItsSnapshot(level: String) async throws {
        try await PostgresTestDatabase.withStore { store, client in
            /// Enqueues `body` for coalescing key `key` in a transaction at `level` whose snapshot
            /// was taken before another transaction enqueued (and committed) an edit of that key.
            @Sendable func enqueueAfterAnotherCommitted(_ key: String, _ body: String) async throws {
                try await client.withConnection { connection in
                    try await connection.query(PostgresQuery(unsafeSQL: "BEGIN ISOLATION LEVEL \(level)"), logger: testLogger)
                    try await connection.query("SELECT 1", logger: testLogger)  // the snapshot
                    try await client.withTransaction(logger: testLogger) { other in
                        _ = try await store.enqueue(request("/\(key)", coalescingKey: key, body: "other"), on: other)
                    }
                    do {
                        _ = try await store.enqueue(request("/\(key)", coalescingKey: key, body: body), on: connection)
                        try await connection.query("COMMIT", logger: testLogger)
                    } catch {
                        _ = try? await connection.query("ROLLBACK", logger: testLogger)
                        throw error
                    }
                }
            }
            // The row it would replace changed since its snapshot: a serialization failure, for
            // the caller to retry.
            _ = try await store.add(entry(request("/unleased", coalescingKey: "unleased", body: "v1"), enqueuedAt: Date()), limit: nil)
            do {
                try await enqueueAfterAnotherCommitted("unleased", "v3")
                Issue.record("the enqueue replaced a row changed since its snapshot")
            } catch let error as PostgresQueueStoreError {
                guard case .database(_, let sqlState, _) = error else { throw error }
                #expect(sqlState == "40001")  // serialization_failure
            }
            #expect(try await store.queuedEntries().map(\.body) == [Data("other".utf8)])

            // Beside a leased holder, the other transaction's edit is not in its snapshot: its
            // own is queued behind that edit rather than replacing it, and both are delivered.
            let holder = try await store.add(entry(request("/leased", coalescingKey: "leased", body: "v1"), enqueuedAt: Date()), limit: nil)
            let claims = try await store.claim(upTo: 10, now: Date(), lease: .seconds(30))
            #expect(claims.map(\.entry.id).contains(holder.id))
            try await enqueueAfterAnotherCommitted("leased", "v3")
            let leasedKey = try await store.queuedEntries().filter { $0.coalescingKey == "leased" }.map(\.body)
            #expect(leasedKey == [Data("v1".utf8), Data("other".utf8), Data("v3".utf8)])
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
