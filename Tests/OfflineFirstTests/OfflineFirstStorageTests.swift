import Foundation
import OfflineQueue
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineFirst

/// `OfflineFirstClient` over a `QueueStorage` other than the disk store: it follows the storage's
/// `changeFeed`, so the state table's rows hold on any storage (the rejected row runs over both in
/// `OfflineFirstClientTests`). `InMemoryQueueStorage` stands in
/// for storage several consumers share (the Integrations package runs the same over
/// `PostgresQueueStore`, with a second replica).
@Suite("OfflineFirstClient over in-memory storage", .timeLimit(.minutes(1)))
struct OfflineFirstStorageTests {
    /// Back online, the read's refetch is asked for while the replay of "b" has its turn: the
    /// fetch waits for the send, and brings a body that holds "b". Its landing settles "b" (it was
    /// delivered before the request went); overlaying "b" again showed it twice (["a", "b", "b"])
    /// until the next fetch, on the disk store as on any other.
    @Test(arguments: [false, true]) func aWriteDeliveredWhileTheRefetchWaitedForItsSendIsNeverShownTwice(inMemory: Bool) async throws {
        let storage = InMemoryQueueStorage()
        let h = try OfflineFirstHarness(notes: ["a"], queueStorage: inMemory ? storage : nil)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .seconds(0)))
        await reader.waitFor { Notes.decode($0.data) == ["a"] }
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)
        let pending = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(pending.data) == ["a", "b"] && pending.pendingEntryIDs == [id])
        if inMemory { #expect(try await storage.queuedEntry(id: id) != nil && h.store.entryCount == 0) }  // in the storage given, not on disk
        await h.monitor.setConnected(true)
        let report = await h.queue.flush()
        #expect(report.delivered == [id])
        let settled = await reader.waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && $0.source == .network }
        #expect(Notes.decode(settled.data) == ["a", "b"] && h.origin.writes == 1)
        let firstShown = try #require(reader.notes.firstIndex(of: ["a", "b"]))
        #expect(
            reader.notes[firstShown...].allSatisfy { $0 == ["a", "b"] },
            "\(reader.all.map { "\(Notes.decode($0.data) ?? []) \($0.source) settling \($0.settlingEntryIDs.count) pending \($0.pendingEntryIDs.count) fetching \($0.isFetching) stale \($0.isStale)" })"
        )
        await reader.cancel()
    }

    @Test func coalescedEditsShowOnlyTheNewest() async throws {
        let h = try OfflineFirstHarness(connected: false, queueStorage: InMemoryQueueStorage())
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        try await h.client.mutate(CreateNote("draft 1", coalescingKey: "draft"))
        try await h.client.mutate(CreateNote("first", orderingKey: "list"))
        try await h.client.mutate(CreateNote("draft 2", coalescingKey: "draft"))
        await reader.waitFor { Notes.decode($0.data) == ["draft 2", "first"] }
        #expect(reader.notes.allSatisfy { !$0.contains("draft 1") || !$0.contains("draft 2") })
        #expect(await h.queue.pendingCount() == 2)
        await reader.cancel()
    }

    /// Another consumer of the storage (a replica, an outbox insert) adds an entry: the live read
    /// shows it as soon as the storage publishes it, and `pendingCounts` counts it.
    @Test func anEntryAnotherConsumerStoresShowsInALiveReadAndInTheCount() async throws {
        let storage = InMemoryQueueStorage()
        let h = try OfflineFirstHarness(notes: ["a"], queueStorage: storage)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        let counts = StreamCollector(h.queue.pendingCounts)
        await counts.wait(for: 1)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { Notes.decode($0.data) == ["a"] }
        let elsewhere = try await storage.add(QueueEntry(CreateNote("from elsewhere")), limit: nil)
        let shown = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(shown.data) == ["a", "from elsewhere"] && shown.pendingEntryIDs == [elsewhere.id])
        await counts.wait(for: 2)
        #expect(counts.items == [0, 1] && storage.changeFeed.count == 1)
        #expect(await h.client.queue.cancel(id: elsewhere.id))
        await reader.waitFor { !$0.hasPendingWrites && !$0.rejectedWrites.isEmpty }
        await counts.wait(for: 3)
        #expect(counts.items == [0, 1, 0])
        await reader.cancel()
    }
}
