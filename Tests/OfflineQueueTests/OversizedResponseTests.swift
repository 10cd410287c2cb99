import Foundation
import Testing
import Retry
import RequestEngine
import ResilienceTesting
@testable import OfflineQueue
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A response over the engine's body limit (16 MiB by default) would be just as large on every
/// replay: it is a permanent failure, never kept for retry.
@Suite("OfflineQueueEngine: a response over the engine's body limit")
struct OversizedResponseTests {
    static let oversized = ScriptedNetworkSession.Step.respond(status: 200, body: Data(count: 16 * 1024 * 1024 + 1))

    @Test func onEnqueueItIsThrownAndNothingIsQueued() async throws {
        let h = try QueueHarness([Self.oversized])
        let error = await thrownError { try await h.engine.enqueue(Mutation("/a")) }
        #expect((error as? NetworkError).map { "\($0)" } == "response body larger than 16777216 bytes")
        #expect(await h.engine.pendingCount() == 0)
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func onReplayItIsAPermanentFailure() async throws {
        let h = try QueueHarness([Self.oversized], connected: false)
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.results.map(\.name) == ["failed(nil)"])
        #expect(h.store.entry(id: id) == nil)
        #expect(h.session.callCount == 1)
    }
}
