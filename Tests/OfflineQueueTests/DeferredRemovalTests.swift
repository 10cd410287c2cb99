import Foundation
import RequestEngine
import ResilienceCore
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
    /// A one-thread pool whose thread can be held, so the removals queued behind it wait.
    private struct HeldPool {
        let pool = BlockingIOPool(maxThreads: 1, name: "test.held-removals")
        let gate = DispatchSemaphore(value: 0)
        let holding = Locked(false)

        func hold() async {
            pool.submit { [gate, holding] in
                holding.withLock { $0 = true }
                gate.wait()
            }
            while !holding.withLock({ $0 }) { await Task.yield() }
        }
        func release() { gate.signal() }
    }

    private func file(_ directory: TemporaryDirectory, _ id: UUID) -> String {
        directory.url.appendingPathComponent("\(id.uuidString).json").path
    }

    private func entry(_ path: String) -> QueueEntry {
        QueueEntry(Mutation(path, body: "body of \(path)"))
    }

    @Test func aDiscardedEntryLeavesTheIndexAtOnceAndItsFileWhenTheDeletionRuns() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
        let queued = entry("/a")
        try await store.save(queued)
        await held.hold()
        store.discard(id: queued.id, reason: .delivered(statusCode: 201))
        #expect(store.entry(id: queued.id) == nil)
        #expect(store.entryCount == 0)
        #expect(FileManager.default.fileExists(atPath: file(directory, queued.id)))  // not yet deleted
        #expect(store.outstandingRemovals == 1)
        store.finishRemovals()
        #expect(!FileManager.default.fileExists(atPath: file(directory, queued.id)))
        #expect(store.outstandingRemovals == 0)
        held.release()
    }

    @Test func aSaveOfTheSameIDAfterItsDiscardKeepsTheNewFile() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
        let queued = entry("/a")
        try await store.save(queued)
        await held.hold()
        store.discard(id: queued.id, reason: .delivered(statusCode: 201))
        try await store.save(queued)  // the queued deletion of the old file runs before this write
        held.release()
        store.finishRemovals()
        #expect(FileManager.default.fileExists(atPath: file(directory, queued.id)))
        #expect(store.entry(id: queued.id) != nil)
        store.releaseLock()
        #expect(try DiskQueueStore(directory: directory.url).openReport.loaded == 1)
    }

    @Test func releasingTheFolderRunsTheQueuedDeletionsFirst() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: .shared, removalPool: held.pool)
        let queued = entry("/a")
        try await store.save(queued)
        await held.hold()
        store.discard(id: queued.id, reason: .expired)
        store.releaseLock()
        #expect(!FileManager.default.fileExists(atPath: file(directory, queued.id)))
        #expect(try DiskQueueStore(directory: directory.url).openReport.loaded == 0)
        held.release()
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
        #expect(!FileManager.default.fileExists(atPath: file(directory, expiring.id)))
        held.release()
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
        for id in ids { #expect(!FileManager.default.fileExists(atPath: file(directory, id))) }
        held.release()
    }
}
