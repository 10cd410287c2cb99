import Drainer
import Foundation
import IntegrationTestSupport
import OfflineQueue
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceServiceLifecycle
import ResilienceTesting
import ServiceLifecycle
import ServiceLifecycleTestKit
import Testing

/// `DrainService` and `OfflineQueueEngine` run as swift-service-lifecycle services, draining over
/// AsyncHTTPClient to LoopbackHTTPServer. The drain service's timers run on a ManualClock that is
/// never advanced, so only the cycle at start runs.
@Suite("Drain and queue services under swift-service-lifecycle", .timeLimit(.minutes(2)))
struct DrainLifecycleServiceTests {
    let server: LoopbackHTTPServer
    let folder: URL
    let queue: OfflineQueueEngine
    let monitor: ManualReachabilityMonitor

    init() throws {
        server = try LoopbackHTTPServer()
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("drain-lifecycle-\(UUID().uuidString)")
        monitor = ManualReachabilityMonitor(isConnected: true)
        queue = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: AsyncHTTPClientSession()),
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: folder)
        )
    }

    func enqueue(_ paths: [String]) async throws {
        for path in paths {
            _ = try await queue.enqueue(Mutation(url: server.url(path)), sending: .onNextDrain)
        }
    }

    @Test func runDrainsAtOnceAndGracefulShutdownStopsTheService() async throws {
        server.route("/items/*", .ok())
        try await enqueue(["/items/1", "/items/2"])
        let drainer = DrainService(queue: queue, interval: .seconds(60), cycleBudget: .seconds(30), clock: ManualClock())
        var reports = await drainer.reports.makeAsyncIterator()
        try await testGracefulShutdown { trigger in
            let running = Task { try await DrainLifecycleService(drainer).run() }
            let first = try #require(await reports.next())
            #expect(first.delivered == 2)
            #expect(await drainer.isRunning)
            trigger.triggerGracefulShutdown()
            try await running.value
        }
        #expect(await drainer.isRunning == false)
        #expect(await queue.pendingCount() == 0)
        #expect(server.hits("/items/*") == 2)
        try? FileManager.default.removeItem(at: folder)
    }

    @Test func cancellationInterruptsTheCycleInFlightAndItsEntryStaysQueued() async throws {
        server.route("/items/*", LoopbackResponse.ok().held())
        try await enqueue(["/items/1"])
        let drainer = DrainService(queue: queue, interval: .seconds(60), cycleBudget: .seconds(3600), clock: ManualClock())
        let running = Task { try await DrainLifecycleService(drainer).run() }
        await server.waitForHits("/items/1", atLeast: 1)  // the cycle is in flight, its response held
        running.cancel()
        try await running.value
        #expect(await drainer.isRunning == false)
        #expect(await queue.pendingCount() == 1)
        await server.waitForOpenConnections(atMost: 0)  // the request in flight was cancelled
        try? FileManager.default.removeItem(at: folder)
    }

    @Test func gracefulShutdownMadeToInterruptCutsTheCycleInFlightAndItsEntryStaysQueued() async throws {
        server.route("/items/*", LoopbackResponse.ok().held())
        try await enqueue(["/items/1"])
        let drainer = DrainService(queue: queue, interval: .seconds(60), cycleBudget: .seconds(3600), clock: ManualClock())
        var reports = await drainer.reports.makeAsyncIterator()
        try await testGracefulShutdown { trigger in
            let running = Task { try await DrainLifecycleService(drainer, onShutdown: .interruptingCycle).run() }
            await server.waitForHits("/items/1", atLeast: 1)  // the cycle is in flight, its response held
            trigger.triggerGracefulShutdown()
            try await running.value  // returns although the response is still held: the cycle was cut
        }
        let report = try #require(await reports.next())
        #expect(report.interrupted)
        #expect(await drainer.isRunning == false)
        #expect(await queue.pendingCount() == 1)
        await server.waitForOpenConnections(atMost: 0)  // the request in flight was cancelled
        try? FileManager.default.removeItem(at: folder)
    }

    @Test func aServiceGroupRunsTheQueueAndStopsItOnGracefulShutdown() async throws {
        server.route("/items/*", .ok())
        try await enqueue(["/items/1"])
        let group = ServiceGroup(
            configuration: .init(services: [.init(service: OfflineQueueLifecycleService(queue))], logger: .init(label: "test"))
        )
        let running = Task { try await group.run() }
        await server.waitForHits("/items/1", atLeast: 1)
        await group.triggerGracefulShutdown()
        try await running.value
        #expect(server.hits("/items/1") == 1)
        try? FileManager.default.removeItem(at: folder)
    }
}

struct Mutation: QueueableRequest {
    let url: URL
    var method: RequestEngine.HTTPMethod { .post }
}
