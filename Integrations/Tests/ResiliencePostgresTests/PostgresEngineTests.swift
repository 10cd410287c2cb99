import Foundation
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import ResilienceTesting
import Testing

/// `OfflineQueueEngine` on `PostgresQueueStore`: the queue's rules through the engine, with a real
/// PostgreSQL, real URLSession sends to a loopback origin, and a manual clock for backoffs, TTLs and
/// leases (the store takes every time from the engine).
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresEngineTests {
    /// An engine on `store`, sending to `origin` through URLSession, on `clock`.
    static func engine(
        _ store: PostgresQueueStore, clock: ManualClock, connected: Bool = true, maxAttempts: Int? = nil
    ) -> (OfflineQueueEngine, ManualReachabilityMonitor) {
        let monitor = ManualReachabilityMonitor(isConnected: connected)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: URLSessionTransport.shared, clock: clock),
            reachabilityMonitor: monitor,
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), maxAttempts: maxAttempts),
            clock: clock
        )
        return (engine, monitor)
    }

    static func post(
        _ origin: LoopbackHTTPServer, _ path: String, priority: QueuePriority = .normal, key: String = UUID().uuidString
    )
        -> QueuedRequest
    {
        QueuedRequest(method: .post, url: origin.url(path), body: Data(path.utf8), priority: priority, idempotencyKey: key)
    }

    @Test func anEntryQueuedOfflineGoesOutByPriorityThenFIFOAndLeavesTheTable() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/*", .status(201))
        try await PostgresTestDatabase.withStore { store, _ in
            let (engine, monitor) = Self.engine(store, clock: ManualClock(), connected: false)
            for (path, priority) in [("/n1", QueuePriority.normal), ("/c", .critical), ("/n2", .normal), ("/h", .high)] {
                _ = try await engine.enqueue(Self.post(origin, path, priority: priority))
            }
            #expect(await engine.pendingCount() == 4)
            #expect(await engine.items.map(\.url.path) == ["/c", "/h", "/n1", "/n2"])
            await monitor.setConnected(true)
            let report = await engine.flush()
            #expect(report.delivered.count == 4)
            #expect(origin.requestLog.map(\.path) == ["/c", "/h", "/n1", "/n2"])
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aFailedAttemptIsKeptWithItsBackoffAndEveryAttemptCarriesTheSameKey() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/flaky", [.status(503), .status(503), .status(201)])
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let (engine, _) = Self.engine(store, clock: clock)
            let id = try #require(try await engine.enqueue(Self.post(origin, "/flaky", key: "one-key")).queuedID)
            let stored = try #require(try await store.queuedEntry(id: id))
            #expect(stored.attempts == 1)
            #expect(stored.nextAttemptAt == engine.now.addingTimeInterval(10))
            #expect(await engine.flush().results.isEmpty)  // not due yet

            clock.advance(by: .seconds(10))
            #expect(await engine.flush().kept == [id])
            #expect(try await store.queuedEntry(id: id)?.attempts == 2)
            clock.advance(by: .seconds(10))
            #expect(await engine.flush().delivered == [id])
            #expect(origin.requestLog.map { $0.headers["idempotency-key"] } == ["one-key", "one-key", "one-key"])
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func maxAttemptsMovesTheEntryToTheDeadLetterTable() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/down", .status(503))
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let (engine, _) = Self.engine(store, clock: clock, maxAttempts: 2)
            let id = try #require(try await engine.enqueue(Self.post(origin, "/down")).queuedID)
            clock.advance(by: .seconds(10))
            #expect(await engine.flush().deadLettered == [id])
            #expect(try await store.queuedCount() == 0)
            #expect(try await store.deadLetters().map(\.id) == [id])
        }
    }

    @Test func anExpiredEntryIsSweptUnsent() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let (engine, monitor) = Self.engine(store, clock: clock, connected: false)
            var request = Self.post(origin, "/late")
            request.ttl = 60
            let id = try #require(try await engine.enqueue(request).queuedID)
            clock.advance(by: .seconds(61))
            await monitor.setConnected(true)
            #expect(await engine.flush().expired == [id])
            #expect(origin.requestLog.isEmpty)
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func editsOfACoalescingKeyQueuedOfflineSendOnlyTheNewest() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/*", .status(200))
        try await PostgresTestDatabase.withStore { store, _ in
            let (engine, monitor) = Self.engine(store, clock: ManualClock(), connected: false)
            for version in 1...3 {
                var request = Self.post(origin, "/doc/v\(version)")
                request.coalescingKey = "doc"
                _ = try await engine.enqueue(request)
            }
            #expect(await engine.pendingCount() == 1)
            await monitor.setConnected(true)
            #expect(await engine.flush().delivered.count == 1)
            #expect(origin.requestLog.map(\.path) == ["/doc/v3"])
        }
    }

    @Test func twoEnginesOnOneTableDeliverEveryEntryOnceAndEachKeyInOrder() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route("/*", .status(201))
        let total = 200
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let clock = ManualClock()
                let (first, _) = Self.engine(store, clock: clock)
                let (second, _) = Self.engine(try PostgresQueueStore(client: otherClient, tableName: store.tableName), clock: clock)
                for number in 0..<total {
                    var request = Self.post(origin, "/k\(number % 20)/\(number / 20)", key: "entry-\(number)")
                    request.orderingKey = "k\(number % 20)"
                    _ = try await first.enqueue(request, sending: .onNextDrain)
                }
                let passes = [first, second].map { engine in Task { await engine.flush() } }
                var reports: [FlushReport] = []
                for pass in passes { reports.append(await pass.value) }
                // A pass ends when nothing is claimable at that moment; passes until the table is empty.
                var delivered = reports.map(\.delivered.count).reduce(0, +)
                while try await store.queuedCount() > 0 {
                    delivered += await first.flush().delivered.count
                }
                #expect(delivered == total)
                let keys = origin.requestLog.compactMap { $0.headers["idempotency-key"] }
                #expect(keys.count == total)
                #expect(Set(keys).count == total)  // each entry once
                var next: [String: Int] = [:]
                for request in origin.requestLog {
                    let parts = request.path.split(separator: "/").map(String.init)
                    #expect(Int(parts[1]) == next[parts[0], default: 0], "\(parts[0]) out of order")
                    next[parts[0], default: 0] += 1
                }
            }
        }
    }
}
