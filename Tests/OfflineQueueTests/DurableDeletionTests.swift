import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

/// An older edit of a coalescing key must never come back after a crash once a newer one is
/// delivered (Models/QueueCoalescing.pml found the window): the deletions of older edits reach
/// the disk before a newer edit is sent. Deletions are unlinks, which a crash may undo until the
/// folder is fsynced; what is observable here is the order — the file gone, then a directory
/// fsync, then the send — and that entries without a coalescing key pay nothing.
@Suite("Deletions made durable before an edit of a coalescing key is sent", .timeLimit(.minutes(1)))
struct DurableDeletionTests {

    private func edit(_ text: String) -> Mutation {
        var request = Mutation("/profile", body: text)
        request.coalescingKey = "profile"
        return request
    }

    @Test func aDeletionSinceTheLastFsyncIsSyncedOnceAndOnlyOnce() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        defer { store.releaseLock() }
        let entry = QueueEntry(Mutation("/a", body: "a"))
        try await store.save(entry)
        try await store.makeDeletionsDurable()
        let before = store.directorySyncs
        try await store.makeDeletionsDurable()
        #expect(store.directorySyncs == before)  // nothing deleted: no fsync

        store.discard(id: entry.id, reason: .delivered(statusCode: 200))
        try await store.makeDeletionsDurable()
        #expect(!FileManager.default.fileExists(atPath: directory.entryFile(entry.id)))  // the queued deletion ran first
        #expect(store.directorySyncs == before + 1)
        try await store.makeDeletionsDurable()
        #expect(store.directorySyncs == before + 1)  // already durable
    }

    @Test func anEditReplacedInPlaceHasItsFileDeletedBeforeTheEnqueueReturns() async throws {
        let harness = try QueueHarness([], connected: false)
        defer { harness.store.releaseLock() }
        guard case .queued(let first) = try await harness.engine.enqueue(edit("one")) else { Issue.record("not queued"); return }
        guard case .queued(let second) = try await harness.engine.enqueue(edit("two")) else { Issue.record("not queued"); return }
        #expect(!FileManager.default.fileExists(atPath: harness.directory.entryFile(first)))
        #expect(FileManager.default.fileExists(atPath: harness.directory.entryFile(second)))
        #expect(harness.store.entryCount == 1)
    }

    @Test func theReplayOfAnEditFsyncsTheFolderAfterAnOlderEditWasDeleted() async throws {
        let harness = try QueueHarness([.ok("saved")], connected: false)
        defer { harness.store.releaseLock() }
        _ = try await harness.engine.enqueue(edit("one"))
        _ = try await harness.engine.enqueue(edit("two"))  // deletes edit one's file: not yet durable
        let before = harness.store.directorySyncs
        await harness.monitor.setConnected(true)
        let report = await harness.engine.flush()
        #expect(report.delivered.count == 1)
        #expect(harness.session.callCount == 1)
        #expect(harness.store.directorySyncs >= before + 1)  // before the send of edit two
    }

    @Test func aReplayWithoutACoalescingKeyCostsNoFsync() async throws {
        let harness = try QueueHarness([.ok("a"), .ok("b")], connected: false)
        defer { harness.store.releaseLock() }
        _ = try await harness.engine.enqueue(Mutation("/a", body: "a"))
        _ = try await harness.engine.enqueue(Mutation("/b", body: "b"))
        let before = harness.store.directorySyncs
        await harness.monitor.setConnected(true)
        let report = await harness.engine.flush()
        #expect(report.delivered.count == 2)
        #expect(harness.store.directorySyncs == before)  // the first delivery's deletion is not fsynced
    }

    @Test func anOnlineEditIsSentOnlyOnceTheDeletionOfAnOlderOneIsDurable() async throws {
        let harness = try QueueHarness([.ok("one"), .ok("two")], connected: true)
        defer { harness.store.releaseLock() }
        // Stored, then delivered by a drain: its file's deletion is queued, not fsynced.
        _ = try await harness.engine.enqueue(edit("one"), sending: .onNextDrain)
        _ = await harness.engine.flush()
        let before = harness.store.directorySyncs
        // The next edit goes out at once: the older edit's deletion is made durable first.
        guard case .sent = try await harness.engine.enqueue(edit("two")) else { Issue.record("not sent"); return }
        #expect(harness.store.directorySyncs == before + 1)
    }
}
