import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("OfflineQueue through URLSession, LoopbackHTTPServer and real files", .timeLimit(.minutes(2)))
struct OfflineQueueIntegrationTests {
    @Test func offlineThenQueuedThenRestartThenReconnectDrainsWithTheSameKeys() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/orders", [.status(503), .status(201)])
        server.route("/notes", .status(201))
        let directory = TemporaryDirectory()
        let session = URLSession(configuration: .ephemeral)

        // First process: one order reaches a 503 (queued with a backoff), then the network drops
        // and a note is queued without being tried.
        var firstKeys: [String] = []
        do {
            let clock = ManualClock()
            let monitor = ManualReachabilityMonitor(isConnected: true)
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session),
                reachabilityMonitor: monitor,
                store: try DiskQueueStore(directory: directory.url),
                configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 0)),
                clock: clock
            )
            var order = QueuedRequest(method: .post, url: server.url("/orders"), body: Data("{\"sku\":1}".utf8))
            order.idempotencyKey = "order-key"
            #expect(try await engine.enqueue(order).queuedID != nil)
            await monitor.setConnected(false)
            var note = QueuedRequest(method: .post, url: server.url("/notes"), body: Data("hello".utf8), priority: .high)
            note.idempotencyKey = "note-key"
            #expect(try await engine.enqueue(note).queuedID != nil)
            firstKeys = await engine.items.map(\.idempotencyKey)
            #expect(server.hits("/notes") == 0)
        }
        #expect(firstKeys == ["note-key", "order-key"])

        // "Restart": a second engine on the same folder, offline at first, then reconnecting.
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.loaded == 2)
        let engine = OfflineQueueEngine(requestEngine: AsyncRequestEngine(session: session), reachabilityMonitor: monitor, store: store)
        let collector = StreamCollector(await engine.results)
        await engine.start()
        await monitor.setConnected(true)
        await collector.wait(for: 2)
        #expect(collector.items.map(\.name) == ["delivered(201)", "delivered(201)"])
        #expect(await engine.pendingCount() == 0)
        #expect(directory.fileNames.isEmpty)
        let orders = server.requestLog.filter { $0.path == "/orders" }
        #expect(orders.map { $0.header("idempotency-key") } == ["order-key", "order-key"])
        #expect(orders.allSatisfy { $0.body == Data("{\"sku\":1}".utf8) })
        #expect(server.requestLog.filter { $0.path == "/notes" }.map { $0.header("idempotency-key") } == ["note-key"])
        await engine.stop()
    }

    @Test func startTwiceDoesNotDrainTwiceAndStartAfterStopWorks() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/a", LoopbackResponse.ok().held())
        let directory = TemporaryDirectory()
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: .ephemeral)),
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: directory.url)
        )
        _ = try await engine.enqueue(QueuedRequest(method: .post, url: server.url("/a")))
        await engine.start()
        await engine.start()
        await monitor.setConnected(true)
        await server.waitForHits("/a", atLeast: 1)
        #expect(await monitor.subscriberCount == 1)
        server.releaseHeld("/a")
        let collector = StreamCollector(await engine.results)
        await collector.wait(for: 1)
        #expect(server.hits("/a") == 1)

        await engine.stop()
        #expect(!(await engine.isStarted))
        server.route("/b", .ok())
        await monitor.setConnected(false)
        _ = try await engine.enqueue(QueuedRequest(method: .post, url: server.url("/b")))
        await engine.start()
        await monitor.setConnected(true)
        await collector.wait(for: 2)
        #expect(server.hits("/b") == 1)
        await engine.stop()
    }

    @Test func replayHonoursRetryAfterFromTheServer() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/busy", [.status(503, headers: ["Retry-After": "30"]), .ok()])
        let clock = ManualClock()
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: .ephemeral)),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: TemporaryDirectory().url),
            clock: clock
        )
        let id = try #require(try await engine.enqueue(QueuedRequest(method: .put, url: server.url("/busy"))).queuedID)
        #expect(engine.disk?.entry(id: id)?.nextAttemptAt == engine.now.addingTimeInterval(30))
        clock.advance(by: .seconds(29))
        #expect(await engine.flush().results.isEmpty)
        clock.advance(by: .seconds(1))
        #expect(await engine.flush().delivered == [id])
    }
}
