import Dispatch
import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

/// Writes that race removals, ordered by hand: the store's only I/O thread is held until the test
/// has done what must happen while a write waits.
@Suite("DiskQueueStore: writes against removals", .timeLimit(.minutes(1)))
struct StoreRaceTests {
    /// A one-thread pool whose thread the test holds.
    private func entry(_ path: String, coalescingKey: String? = nil) -> QueueEntry {
        var request = Mutation(path, body: "body of \(path)")
        request.coalescingKey = coalescingKey
        return QueueEntry(request)
    }

    @Test func aSavedCoalescingEditReplacesTheKeysHolderAndSurvivesAReopen() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var first = Mutation("/profile", body: "v1")
        first.coalescingKey = "profile"
        let engineEdit = try #require(try await h.engine.enqueue(first).queuedID)
        let saved = entry("/profile", coalescingKey: "profile")
        try await h.store.save(saved)
        #expect(await h.store.load().map(\.id) == [saved.id])  // the holder was replaced
        #expect(!FileManager.default.fileExists(atPath: h.directory.entryFile(engineEdit)))
        h.store.releaseLock()
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(await reopened.load().map(\.id) == [saved.id])
        #expect(reopened.openReport.removedSupersededEntries == 0)
    }

    @Test func aRemovalWhileAnUpdateWaitsToBeWrittenWinsAndTheFileStaysGone() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: held.pool)
        let queued = entry("/a")
        try await store.save(queued)
        await held.hold()
        var updated = try #require(store.entry(id: queued.id))
        updated.attempts = 1
        let update = Task { try await store.update(updated) }
        await held.waitForQueued(1)  // the update's write waits behind the held thread
        try store.remove(id: queued.id)
        held.release()
        try await update.value
        #expect(!FileManager.default.fileExists(atPath: directory.entryFile(queued.id)))
        #expect(store.entry(id: queued.id) == nil)
        store.releaseLock()
        #expect(try DiskQueueStore(directory: directory.url).openReport.loaded == 0)
    }

    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func aWriteThatFailsAfterARemovalLeavesNoMarkThatWouldDeleteALaterSave() async throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 256))
        defer { mounted.unmount() }
        let folder = mountPoint.url.appendingPathComponent("queue")
        let held = HeldPool()
        let store = try DiskQueueStore(directory: folder, pool: held.pool)
        let queued = entry("/a")
        try await store.save(queued)
        await held.hold()
        var updated = try #require(store.entry(id: queued.id))
        updated.attempts = 1
        let update = Task { try await store.update(updated) }
        await held.waitForQueued(1)
        try store.remove(id: queued.id)
        let filler = mounted.fill()  // now the waiting write will find the disk full
        held.release()
        await #expect(throws: OfflineQueueError.self) { try await update.value }  // ENOSPC
        try FileManager.default.removeItem(atPath: filler)
        try await store.save(queued)  // the same id again: it must stay
        #expect(FileManager.default.fileExists(atPath: folder.appendingPathComponent("\(queued.id.uuidString).json").path))
        store.releaseLock()
        #expect(try DiskQueueStore(directory: folder).openReport.loaded == 1)
    }

    @Test func anEntryCancelledWhileItMovesToDeadLetterLeavesNoDeadLetterAndNoResult() async throws {
        let directory = TemporaryDirectory()
        let held = HeldPool()
        let store = try DiskQueueStore(directory: directory.url, pool: held.pool)
        let session = ScriptedNetworkSession([.status(503)])
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(maxAttempts: 1)
        )
        let id = try #require(try await engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        await held.hold()
        let pass = Task { await engine.flush() }
        await held.waitForQueued(1)  // the dead letter's write waits
        #expect(store.entry(id: id) != nil)
        let cancelled = Task { await engine.cancel(id: id) }
        #expect(await cancelled.value)
        held.release()
        let report = await pass.value
        #expect(report.deadLettered.isEmpty)
        #expect(store.deadLetters().isEmpty)
        #expect(store.entry(id: id) == nil)
    }
}

/// Saves, updates and removals of the same entries from several tasks at once, on the store's real
/// I/O threads: a deletion decided for one write of an id never removes the file a later write of
/// that id made, and writes of one id never land out of the order they began in, so after every
/// round the folder holds exactly the entries the store holds.
@Suite("DiskQueueStore: concurrent writes and removals of one id", .timeLimit(.minutes(2)))
struct StoreIDRaceTests {
    @Test func savesUpdatesAndRemovalsOfOneIdLeaveTheFolderAndTheStoreInAgreement() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let entries = (0..<4).map { QueueEntry(Mutation("/item-\($0)", body: "v0")) }
        for round in 0..<200 {
            for entry in entries { try await store.save(entry) }
            await withTaskGroup(of: Void.self) { group in
                for entry in entries {
                    group.addTask {
                        var updated = entry
                        updated.attempts = round % 5 + 1
                        try? await store.update(updated)
                    }
                    group.addTask { try? store.remove(id: entry.id) }
                    group.addTask { try? await store.save(entry) }
                }
            }
            store.finishRemovals()
            let files = Set(directory.fileNames.filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") })
            let queued = Set(store.orderedEntries().map { "\($0.id.uuidString).json" })
            if files != queued {
                Issue.record("round \(round): \(files.count) files, \(queued.count) queued; missing files \(queued.subtracting(files).count), extra files \(files.subtracting(queued).count)")
                return
            }
        }
        store.releaseLock()
        // What the folder holds is what a relaunch finds.
        #expect(try DiskQueueStore(directory: directory.url).openReport.loaded == store.orderedEntries().count)
    }
}
