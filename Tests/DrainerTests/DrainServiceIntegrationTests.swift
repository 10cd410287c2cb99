import Foundation
import OfflineQueue
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Drainer

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Real parts: URLSession, LoopbackHTTPServer on 127.0.0.1, a DiskQueueStore on real files.
@Suite("DrainService with a real folder and a real server", .timeLimit(.minutes(1)))
struct DrainServiceIntegrationTests {
    private func makeQueue(_ folder: URL, clock: some Clock<Duration> = ContinuousClock()) throws -> OfflineQueueEngine {
        OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: folder),
            clock: clock
        )
    }

    private func entryFiles(_ folder: URL) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []).filter { $0.hasSuffix(".json") }
    }

    @Test func aCycleDrainsAFolderThroughURLSession() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/sink", .status(201))
        let folder = TemporaryDirectory()
        let queue = try makeQueue(folder.url)
        for index in 0..<25 {
            let request = QueuedRequest(method: .post, url: server.url("/sink"), body: Data("{\"n\":\(index)}".utf8))
            _ = try await queue.enqueue(request, sending: .onNextDrain)
        }
        #expect(entryFiles(folder.url).count == 25)

        let service = DrainService(queue: queue, interval: .seconds(3600), cycleBudget: .seconds(30))
        let reports = StreamCollector(await service.reports)
        await service.start()
        await reports.wait(for: 1)
        await service.stop()

        let report = try #require(reports.items.first)
        #expect(report.trigger == .start)
        #expect(report.delivered == 25 && report.remaining == 0 && !report.budgetExhausted)
        #expect(server.hits("/sink") == 25)
        let keys = Set(server.requestLog.compactMap { $0.headers["idempotency-key"] })
        #expect(keys.count == 25, "every entry carries its own Idempotency-Key")
        #expect(entryFiles(folder.url).isEmpty)
    }

    @Test func anEntryCutByTheBudgetStaysOnDiskAndIsResentWithItsKeyAfterARestart() async throws {
        let server = try LoopbackHTTPServer()
        defer {
            server.releaseHeld()
            server.shutdown()
        }
        server.route("/slow", LoopbackResponse.ok().held())  // never answers until released
        let folder = TemporaryDirectory()
        let id: UUID
        do {
            // The budget runs out on a manual clock, once the request is on the wire.
            let clock = ManualClock()
            let queue = try makeQueue(folder.url, clock: clock)
            id = try #require(try await queue.enqueue(QueuedRequest(method: .post, url: server.url("/slow"), body: Data("x".utf8)), sending: .onNextDrain).queuedID)
            // The budget is what is under test: the server holds the request, so only the budget
            // can end this cycle.
            let service = DrainService(queue: queue, interval: .seconds(3600), cycleBudget: .milliseconds(300), clock: clock)
            let cycle = Task { await service.drainNow() }
            await server.waitForHits("/slow", atLeast: 1)
            await clock.waitForSleepers(1)
            clock.advance(by: .milliseconds(300))
            let report = await cycle.value
            #expect(report.budgetExhausted)
            #expect(report.delivered == 0 && report.remaining == 1)
            #expect(abs(report.duration - 0.3) < 0.001)  // the budget, on the manual clock (Date rounding aside)
            #expect(server.hits("/slow") == 1)
        }

        // "Restart": a new store and queue on the same folder.
        let reopened = try makeQueue(folder.url)
        let entry = try #require(await reopened.items.first)
        #expect(entry.id == id)
        #expect(entry.attempts == 0, "the cut attempt is not counted")
        server.route("/slow", .ok())
        let report = await DrainService(queue: reopened, interval: .seconds(3600), cycleBudget: .seconds(30)).drainNow()
        #expect(report.delivered == 1 && report.remaining == 0)
        let keys = server.requestLog.filter { $0.path == "/slow" }.map { $0.headers["idempotency-key"] }
        try #require(keys.count == 2)  // (indexing fewer would crash the whole test process)
        #expect(keys[0] != nil && keys[0] == keys[1], "at least once, with the same key")
        #expect(entryFiles(folder.url).isEmpty)
    }
}

/// Signals sent to this very process; serialized, each on its own signal number.
@Suite("SignalListener", .serialized, .timeLimit(.minutes(1)))
struct SignalListenerTests {
    @Test func aSignalIsDeliveredToNextAndCancelEndsWaitingWithNil() async throws {
        let listener = SignalListener(signals: [SIGUSR1])
        #expect(listener.isListening)
        kill(getpid(), SIGUSR1)
        #expect(await listener.next() == SIGUSR1)
        let waiting = Task { await listener.next() }
        listener.cancel()
        #expect(await waiting.value == nil)
        #expect(await listener.next() == nil)
    }

    @Test func cancelRestoresTheActionThatWasThereBefore() throws {
        // An inherited or app-chosen SIG_IGN must survive a listener's life, not become SIG_DFL.
        _ = signal(SIGUSR1, SIG_IGN)
        defer { _ = signal(SIGUSR1, SIG_DFL) }
        let listener = SignalListener(signals: [SIGUSR1])
        listener.cancel()
        let restored = signal(SIGUSR1, SIG_IGN)
        #expect(unsafeBitCast(restored, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self))
    }

    @Test func cancellingTheWaitingTaskEndsNextWithNil() async throws {
        let listener = SignalListener(signals: [SIGUSR1])
        defer { listener.cancel() }
        let waiting = Task { await listener.next() }
        waiting.cancel()
        #expect(await waiting.value == nil)
    }

    @Test func cancellingRunUntilSignalledStopsTheService() async throws {
        let h = try await DrainHarness([.ok()], interval: .seconds(60))
        let run = Task { await h.service.runUntilSignalled([SIGUSR2]) }
        await h.reports.wait(for: 1)
        run.cancel()
        #expect(await run.value == nil)
        #expect(await !h.service.isRunning)
        #expect(h.clock.sleeperCount == 0)
    }

    @Test func runUntilSignalledStopsTheServiceCleanly() async throws {
        let h = try await DrainHarness([.ok()], interval: .seconds(60))
        try await h.enqueue(2)
        let run = Task { await h.service.runUntilSignalled([SIGUSR2]) }
        await h.reports.wait(for: 1)  // started: the listener is installed before start()
        kill(getpid(), SIGUSR2)
        #expect(await run.value == SIGUSR2)
        #expect(await !h.service.isRunning)
        #expect(h.reports.items.first?.delivered == 2)
        #expect(h.clock.sleeperCount == 0)
    }
}
