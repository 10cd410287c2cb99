import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import ResilienceTesting
import Synchronization
import Testing

/// Faults between the engine and PostgreSQL: each ends in a typed error or a later retry, never in
/// a lost entry or one completed twice.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresFaultTests {
    /// `PostgresQueueStore` with the faults a dropped connection makes: the next `complete` fails
    /// before its statement reaches the server (`.completion`), or the next `claim` is committed by
    /// the server and its answer lost (`.claimAnswer`).
    final class ConnectionDrops: QueueStorage {
        enum Fault { case completion, claimAnswer }
        let base: PostgresQueueStore
        let pending: Mutex<Fault?>
        init(_ base: PostgresQueueStore, _ fault: Fault) {
            self.base = base
            pending = Mutex(fault)
        }

        private func take(_ fault: Fault) -> Bool {
            pending.withLock { pending in
                guard pending == fault else { return false }
                pending = nil
                return true
            }
        }

        var changeFeed: QueueChangeFeed { base.changeFeed }

        static let reset = PostgresQueueStoreError.database(operation: "complete", sqlState: nil, message: "connection reset by peer")

        nonisolated(nonsending) func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws {
            if take(.completion) { throw Self.reset }
            try await base.complete(claim, reason: reason)
        }

        nonisolated(nonsending) func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim] {
            let claims = try await base.claim(upTo: limit, now: now, lease: lease)
            if take(.claimAnswer) { throw Self.reset }
            return claims
        }

        nonisolated(nonsending) func queuedEntries() async throws -> [QueueEntry] { try await base.queuedEntries() }
        nonisolated(nonsending) func queuedCount() async throws -> Int { try await base.queuedCount() }
        nonisolated(nonsending) func queuedEntry(id: UUID) async throws -> QueueEntry? { try await base.queuedEntry(id: id) }
        nonisolated(nonsending) func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool {
            try await base.hasQueuedEntries(orderingKey: orderingKey, coalescingKey: coalescingKey)
        }
        nonisolated(nonsending) func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry { try await base.add(entry, limit: limit) }
        nonisolated(nonsending) func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim {
            try await base.renew(claim, now: now, lease: lease)
        }
        nonisolated(nonsending) func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws { try await base.release(claim, keeping: entry) }
        nonisolated(nonsending) func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws { try await base.deadLetter(claim, entry: entry) }
        nonisolated(nonsending) func cancel(id: UUID) async throws -> Bool { try await base.cancel(id: id) }
        nonisolated(nonsending) func removeAll() async throws { try await base.removeAll() }
        nonisolated(nonsending) func removeExpired(now: Date) async throws -> [QueueEntry] { try await base.removeExpired(now: now) }
        nonisolated(nonsending) func earliestNextAttempt() async throws -> Date? { try await base.earliestNextAttempt() }
    }

    @Test func aCompletionLostAfterTheSendIsReportedAndTheEntryGoesAgainWithTheSameKeyOnceItsLeaseEnds() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/pay", .status(201))
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let failing = ConnectionDrops(store, .completion)
            let (first, _) = PostgresEngineTests.engine(store, clock: clock)
            let replica = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: URLSessionTransport.shared, clock: clock),
                reachabilityMonitor: ManualReachabilityMonitor(),
                store: failing,
                clock: clock
            )
            let request = PostgresEngineTests.post(origin, "/pay", key: "payment-7")
            let id = try #require(try await first.enqueue(request, sending: .onNextDrain).queuedID)

            let cut = await replica.flush()
            #expect(cut.storageError as? PostgresQueueStoreError == .database(operation: "complete", sqlState: nil, message: "connection reset by peer"))
            #expect(cut.delivered.isEmpty)
            #expect(try await store.queuedEntry(id: id) != nil)  // not lost: still queued, still leased
            #expect(await first.flush().results.isEmpty)  // nobody else sends it while the lease runs

            clock.advance(by: .seconds(31))  // the lease (30 s) ran out
            #expect(await first.flush().delivered == [id])
            #expect(origin.requestLog.map { $0.headers["idempotency-key"] } == ["payment-7", "payment-7"])
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aClaimCommittedWhoseAnswerIsLostLeavesTheEntryLeasedUntilItsLeaseEndsThenItGoesOnce() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/pay", .status(201))
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let (first, _) = PostgresEngineTests.engine(store, clock: clock)
            let replica = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: URLSessionTransport.shared, clock: clock),
                reachabilityMonitor: ManualReachabilityMonitor(),
                store: ConnectionDrops(store, .claimAnswer),
                clock: clock
            )
            let id = try #require(try await first.enqueue(PostgresEngineTests.post(origin, "/pay", key: "payment-8"), sending: .onNextDrain).queuedID)

            let cut = await replica.flush()
            #expect(cut.storageError != nil)
            #expect(origin.requestLog.isEmpty)  // the claim's answer never came: nothing was sent
            #expect(try await store.queuedEntry(id: id) != nil)
            #expect(await first.flush().results.isEmpty)  // leased by a claim nobody holds

            clock.advance(by: .seconds(31))
            #expect(await first.flush().delivered == [id])
            #expect(origin.requestLog.map { $0.headers["idempotency-key"] } == ["payment-8"])
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func theDatabaseDownAtStartIsATypedErrorAndNothingIsReportedQueued() async throws {
        let closed = try RefusingPort()
        let reachable = PostgresTestDatabase.configuration
        var configuration = PostgresClient.Configuration(
            host: "127.0.0.1", port: closed.port, username: reachable.username, password: reachable.password, database: reachable.database,
            tls: .disable)
        configuration.options.connectTimeout = .seconds(2)
        let client = PostgresClient(configuration: configuration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            let store = try PostgresQueueStore(client: client, tableName: PostgresTestDatabase.uniqueTableName())
            await #expect(throws: PostgresQueueStoreError.self) { try await store.migrate() }

            let (engine, _) = PostgresEngineTests.engine(store, clock: ManualClock(), connected: false)
            let refused = await #expect(throws: PostgresQueueStoreError.self) {
                try await engine.enqueue(QueuedRequest(method: .post, url: URL(string: "https://api.example.com/a")!))
            }
            guard case .database(let operation, _, _) = refused else { return }
            #expect(operation == "add")
            let report = await engine.flush()
            #expect(report.storageError is PostgresQueueStoreError)
        }
    }
}
