import Foundation
import OfflineQueue
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineFirst

/// The state table of Sources/OfflineFirst/OfflineFirst.docc/OfflineFirstGuide.md, one test per cell, each on a `ScriptedNetworkSession`
/// that plays the exchanges in order (and records what was sent), a `ManualClock` and a
/// `ManualReachabilityMonitor`. (OfflineFirstClientTests covers the same ground, and the races
/// around it, against a stateful notes origin.)
@Suite("OfflineFirst state table, cell by cell, on a scripted session", .timeLimit(.minutes(1)))
struct StateTableTests {
    static let list: [String: String] = ["Cache-Control": "max-age=60", "Content-Type": "application/json"]

    static func notes(_ notes: [String]) -> ScriptedNetworkSession.Step {
        .respond(status: 200, headers: list, body: Notes.encode(notes))
    }

    /// Once the note was shown, no later snapshot may show the list without it.
    static func neverFlickers(_ reader: SnapshotReader, sourceLocation: SourceLocation = #_sourceLocation) {
        let notes = reader.notes
        guard let shown = notes.firstIndex(where: { $0.contains("b") }) else {
            Issue.record("the note was never shown: \(notes)", sourceLocation: sourceLocation)
            return
        }
        #expect(notes[shown...].allSatisfy { $0.contains("b") }, "\(notes)", sourceLocation: sourceLocation)
    }

    // MARK: Pending

    @Test func pendingOnlineTheWriteRetryingIsOverlaidAndNothingIsPaused() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"]), .status(503)])
        let h = try OfflineFirstHarness(session: session)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)  // tried at once: 503, kept
        let shown = await reader.waitFor { $0.pendingEntryIDs == [id] }
        #expect(Notes.decode(shown.data) == ["a", "b"] && shown.hasPendingWrites && !shown.isPaused && shown.settlingEntryIDs.isEmpty)
        #expect(session.requests.map(\.httpMethod) == ["GET", "POST"])
        Self.neverFlickers(reader)
        await reader.cancel()
    }

    @Test func pendingOfflineTheStoredWriteIsOverlaidOnTheStoredListAndNothingIsSent() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"])])
        let h = try OfflineFirstHarness(session: session)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)
        let fresh = try await h.client.snapshot(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        #expect(Notes.decode(fresh.data) == ["a", "b"] && fresh.pendingEntryIDs == [id] && fresh.source == .cache && !fresh.isPaused)
        // A read that wants the network (the list is stale for it) says it waits for it.
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .zero))
        let paused = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(paused.data) == ["a", "b"] && paused.isPaused && paused.isStale)
        #expect(session.callCount == 1)
        await reader.cancel()
    }

    // MARK: Delivered: refetching, then settled

    @Test func deliveredOnlineTheWriteStaysOverlaidWhileTheRefetchIsInFlightThenTheServersListShowsIt() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"]), .status(201), .held(Self.notes(["a", "b"]))])
        let h = try OfflineFirstHarness(session: session)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        #expect(try await h.client.mutate(CreateNote("b")) == .sent(statusCode: 201))
        let refetching = await reader.waitFor { $0.settlingEntryIDs.count == 1 && $0.isFetching }
        #expect(Notes.decode(refetching.data) == ["a", "b"] && refetching.isStale && !refetching.hasPendingWrites)
        await session.waitForCalls(3)
        session.releaseHeld()
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching }
        #expect(Notes.decode(settled.data) == ["a", "b"] && settled.source == .network && !settled.isStale)
        // The refetch went to the origin, past any cache on the way.
        #expect(session.requests.map(\.httpMethod) == ["GET", "POST", "GET"])
        #expect(session.requests[2].value(forHTTPHeaderField: "Cache-Control") == "no-cache")
        Self.neverFlickers(reader)
        await reader.cancel()
    }

    @Test func deliveredOfflineTheWriteStaysOverlaidAndTheReadWaitsForTheNetworkToSettle() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"]), .status(201), Self.notes(["a", "b"])])
        let h = try OfflineFirstHarness(session: session)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { $0.hasPendingWrites }
        _ = await h.queue.flush(.ignoringReachability)  // delivered; the monitor still says offline
        let paused = await reader.waitFor { $0.settlingEntryIDs.count == 1 }
        #expect(Notes.decode(paused.data) == ["a", "b"] && paused.isPaused && paused.isStale && !paused.isFetching)
        #expect(session.callCount == 2)  // no refetch while offline: it would only fail
        await h.monitor.setConnected(true)
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.source == .network }
        #expect(Notes.decode(settled.data) == ["a", "b"] && !settled.isPaused)
        Self.neverFlickers(reader)
        await reader.cancel()
    }

    // MARK: Rejected

    @Test func rejectedOnlineTheOverlayGoesAtOnceAndTheRejectionIsReported() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"]), .status(422)])
        let h = try OfflineFirstHarness(session: session)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        await #expect(throws: NetworkError.self) { try await h.client.mutate(CreateNote("b")) }
        let rolledBack = await reader.waitFor { !$0.rejectedWrites.isEmpty }
        #expect(Notes.decode(rolledBack.data) == ["a"] && !rolledBack.hasPendingWrites && rolledBack.settlingEntryIDs.isEmpty)
        #expect(rolledBack.rejectedWrites.first?.statusCode == 422)
        #expect(session.callCount == 2)  // a rejection changes nothing on the server: no refetch
        await reader.cancel()
    }

    @Test func rejectedOfflineACancelledWriteStopsOverlayingWithoutTheNetwork() async throws {
        let session = ScriptedNetworkSession([Self.notes(["a"])])
        let h = try OfflineFirstHarness(session: session)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { $0.pendingEntryIDs == [id] }
        #expect(await h.queue.cancel(id: id))
        let rolledBack = await reader.waitFor { !$0.rejectedWrites.isEmpty }
        #expect(Notes.decode(rolledBack.data) == ["a"] && !rolledBack.hasPendingWrites)
        #expect(rolledBack.rejectedWrites.map(\.id) == [id] && rolledBack.rejectedWrites[0].statusCode == nil)
        #expect(session.callCount == 1)
        await reader.cancel()
    }
}
