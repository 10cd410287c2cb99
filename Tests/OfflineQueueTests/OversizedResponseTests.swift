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

/// A response whose body is over the engine's limit still has a status, and the queue never reads
/// a body: the status decides, as for any response. A 201 with a huge body took effect (sending it
/// again would duplicate it); a 503 with a huge error page did not (it is kept for retry).
@Suite("OfflineQueueEngine: a response over the body limit is judged by its status")
struct OversizedResponseTests {
    static func oversized(_ status: Int) -> ScriptedNetworkSession.Step {
        .respond(status: status, body: Data(count: 1_001))
    }

    /// A queue whose engine accepts bodies of at most 1 000 bytes.
    static func harness(_ steps: [ScriptedNetworkSession.Step], connected: Bool = true) throws -> (QueueHarness, OfflineQueueEngine) {
        let h = try QueueHarness(steps, connected: connected)
        h.store.releaseLock()
        let store = try DiskQueueStore(directory: h.directory.url)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: h.session, configuration: .init(maximumResponseBodySize: 1_000), clock: h.clock),
            reachabilityMonitor: h.monitor,
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: h.clock
        )
        return (h, engine)
    }

    @Test func aCreatedResponseWithAHugeBodyOnEnqueueIsSent() async throws {
        let (h, engine) = try Self.harness([Self.oversized(201)])
        #expect(try await engine.enqueue(Mutation("/a")) == .sent(statusCode: 201))
        #expect(await engine.pendingCount() == 0)
        #expect(h.session.callCount == 1)
    }

    @Test func aServerErrorWithAHugeBodyOnEnqueueIsQueuedForRetry() async throws {
        let (h, engine) = try Self.harness([Self.oversized(503)])
        let id = try #require(try await engine.enqueue(Mutation("/a")).queuedID)
        #expect(engine.disk?.entry(id: id)?.attempts == 1)
        #expect(h.session.callCount == 1)
    }

    @Test func aClientErrorWithAHugeBodyOnEnqueueIsThrownWithItsStatus() async throws {
        let (h, engine) = try Self.harness([Self.oversized(422)])
        let error = await thrownError { try await engine.enqueue(Mutation("/a")) }
        #expect((error as? NetworkError)?.statusCode == 422)
        #expect(await engine.pendingCount() == 0)
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func onReplayTheStatusDecidesToo() async throws {
        let (h, engine) = try Self.harness([Self.oversized(503), Self.oversized(200)], connected: false)
        let id = try #require(try await engine.enqueue(Mutation("/a")).queuedID)
        await h.monitor.setConnected(true)
        #expect(await engine.flush().kept == [id])
        h.clock.advance(by: .seconds(10))
        #expect(await engine.flush().delivered == [id])
        #expect(h.session.callCount == 2)
    }

    @Test func aQueuedRequestsOwnBodyLimitIsUsedOnTheFirstAttemptAndEveryReplay() async throws {
        let (h, engine) = try Self.harness([Self.oversized(503), .respond(status: 200, body: Data(count: 1_500))])
        var roomy = Mutation("/a")
        roomy.maximumResponseBodySize = 2_000
        let id = try #require(try await engine.enqueue(roomy).queuedID)  // 503: kept
        #expect(engine.disk?.entry(id: id)?.maximumResponseBodySize == 2_000)
        h.clock.advance(by: .seconds(10))
        let report = await engine.flush()
        #expect(report.delivered == [id])  // 1 500 bytes: within the request's own limit
        engine.disk?.releaseLock()
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(reopened.openReport.loaded == 0)
    }

    @Test func anEntryFileKeepsTheRequestsBodyLimitAcrossARestart() async throws {
        let (h, engine) = try Self.harness([.ok()], connected: false)
        var roomy = Mutation("/a")
        roomy.maximumResponseBodySize = 2_000
        let id = try #require(try await engine.enqueue(roomy).queuedID)
        engine.disk?.releaseLock()
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(reopened.entry(id: id)?.maximumResponseBodySize == 2_000)
        #expect(reopened.openReport.quarantined.isEmpty)
    }
}
