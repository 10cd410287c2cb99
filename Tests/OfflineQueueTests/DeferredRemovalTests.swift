import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A finished entry's file is deleted on a pool thread while the replay pass goes on
/// (`DeferredRemovals`). These tests hold that thread to pin each order of events.
@Suite struct DeferredRemovalTests {
    /// A store whose deletions run on a held thread, holding one saved entry; the thread is held
    /// from the start, so every deletion queued waits until the test releases it.
    private struct Harness {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store: DiskQueueStore
        let queued: QueueEntry

        init() async throws {
            store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
            queued = QueueEntry(Mutation("/a", body: "body of /a"))
            try await store.save(queued)
            await held.hold()
        }

        var fileExists: Bool { FileManager.default.fileExists(atPath: directory.url.appendingPathComponent("\(queued.id.uuidString).json").path) }
    }

    @Test func aDiscardedEntryLeavesTheIndexAtOnceAndItsFileWhenTheDeletionRuns() async throws {
        let h = try await Harness()
        h.store.discard(id: h.queued.id, reason: .delivered(statusCode: 201))
        #expect(h.store.entry(id: h.queued.id) == nil)
        #expect(h.store.entryCount == 0)
        #expect(h.fileExists)  // not yet deleted
        #expect(h.store.outstandingRemovals == 1)
        h.store.finishRemovals()
        #expect(!h.fileExists)
        #expect(h.store.outstandingRemovals == 0)
        h.held.release()
    }

    @Test func aSaveOfTheSameIDAfterItsDiscardKeepsTheNewFile() async throws {
        let h = try await Harness()
        h.store.discard(id: h.queued.id, reason: .delivered(statusCode: 201))
        try await h.store.save(h.queued)  // the queued deletion of the old file runs before this write
        h.held.release()
        h.store.finishRemovals()
        #expect(h.fileExists)
        #expect(h.store.entry(id: h.queued.id) != nil)
        h.store.releaseLock()
        #expect(try DiskQueueStore(directory: h.directory.url).openReport.loaded == 1)
    }

    @Test func releasingTheFolderRunsTheQueuedDeletionsFirst() async throws {
        let h = try await Harness()
        h.store.discard(id: h.queued.id, reason: .expired)
        h.store.releaseLock()
        #expect(!h.fileExists)
        #expect(try DiskQueueStore(directory: h.directory.url).openReport.loaded == 0)
        h.held.release()
    }

    @Test func deleteExpiredReturnsWithTheFilesGone() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
        var request = Mutation("/old")
        request.ttl = 1
        let expiring = QueueEntry(request, enqueuedAt: Date().addingTimeInterval(-10))
        try await store.save(expiring)
        await held.hold()
        #expect(await store.deleteExpired() == 1)
        #expect(!FileManager.default.fileExists(atPath: directory.entryFile(expiring.id)))
        held.release()
    }

    /// Files to delete, made in `directory`.
    private func files(_ count: Int, in directory: TemporaryDirectory) throws -> [String] {
        try FileManager.default.createDirectory(at: directory.url, withIntermediateDirectories: true)
        return try (0..<count).map { index in
            let path = directory.url.appendingPathComponent("\(index).json").path
            try Data("x".utf8).write(to: URL(fileURLWithPath: path))
            return path
        }
    }

    /// Waking the pool thread for every delivered entry cost a replay pass more than the unlinks
    /// (Benchmarks/README.md): while a pass batches, the thread is woken once a batch is full.
    @Test func whileAPassBatchesTheThreadIsWokenOncePerFullBatch() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        await held.hold()
        let removals = DeferredRemovals(pool: held.pool)
        let paths = try files(DeferredRemovals.batchSize + 1, in: directory)
        removals.startBatching()
        for path in paths.prefix(DeferredRemovals.batchSize - 1) { removals.remove(path) }
        #expect(held.pool.queuedJobCount == 0)  // gathering
        removals.remove(paths[DeferredRemovals.batchSize - 1])
        #expect(held.pool.queuedJobCount == 1)  // the batch is full: the worker is on its way
        removals.remove(paths[DeferredRemovals.batchSize])
        #expect(held.pool.queuedJobCount == 1)  // the running worker takes it too
        removals.stopBatching()
        held.release()
        removals.finish()
        for path in paths { #expect(!FileManager.default.fileExists(atPath: path)) }
    }

    /// Outside a pass a lone delivery's file does not wait for others; a pass that ends with a
    /// batch not full hands it over at once.
    @Test func outsideAPassEachDeletionStartsAtOnceAndAPassHandsOverWhatItGathered() async throws {
        let directory = TemporaryDirectory()
        let paths = try files(2, in: directory)
        let lone = HeldPool()
        await lone.hold()
        let outside = DeferredRemovals(pool: lone.pool)
        outside.remove(paths[0])
        #expect(lone.pool.queuedJobCount == 1)  // no batch to wait for
        lone.release()
        outside.finish()
        let held = HeldPool()
        await held.hold()
        let removals = DeferredRemovals(pool: held.pool)
        removals.startBatching()
        removals.remove(paths[1])
        #expect(held.pool.queuedJobCount == 0)
        removals.stopBatching()
        #expect(held.pool.queuedJobCount == 1)  // the pass ended: what it gathered goes now
        held.release()
        removals.finish()
        for path in paths { #expect(!FileManager.default.fileExists(atPath: path)) }
    }

    @Test func aFlushReturnsWithItsDeliveredFilesGone() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let session = ScriptedNetworkSession([.status(201), .status(201), .status(201)])
        let queue = OfflineQueueEngine(requestEngine: AsyncRequestEngine(session: session), reachabilityMonitor: monitor, store: store)
        var ids: [UUID] = []
        for path in ["/a", "/b", "/c"] {
            ids.append(try #require(try await queue.enqueue(Mutation(path)).queuedID))
        }
        await held.hold()  // the worker cannot run: the pass must delete them itself before it returns
        await monitor.setConnected(true)
        let report = await queue.flush()
        #expect(report.delivered.count == 3)
        for id in ids { #expect(!FileManager.default.fileExists(atPath: directory.entryFile(id))) }
        held.release()
    }
}
