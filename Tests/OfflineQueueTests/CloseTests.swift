import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

/// `DiskQueueStore.close()` and `OfflineQueueEngine.close()`: the folder is let go of at once (a
/// user switch opens it without `folderInUse`), nothing written before is lost, nothing is written
/// after.
@Suite("Closing a queue: the folder is free at once, nothing lost, nothing written after", .timeLimit(.minutes(1)))
struct CloseTests {
    @Test func aClosedStoreLetsAnotherOpenTheFolderAtOnceWithEveryEntry() async throws {
        let directory = TemporaryDirectory()
        let first = try DiskQueueStore(directory: directory.url)
        let saved = [QueueEntry(Mutation("/a")), QueueEntry(Mutation("/b"))]
        for entry in saved { try await first.save(entry) }
        #expect(throws: OfflineQueueError.folderInUse(path: directory.url.path)) { try DiskQueueStore(directory: directory.url) }
        await first.close()
        #expect(first.isClosed)
        let second = try DiskQueueStore(directory: directory.url)
        #expect(await second.load().map(\.id) == saved.map(\.id))
        // The closed store writes and deletes nothing more.
        await #expect(throws: OfflineQueueError.closed) { try await first.save(QueueEntry(Mutation("/c"))) }
        #expect(throws: OfflineQueueError.closed) { try first.remove(id: saved[0].id) }
        first.discard(id: saved[1].id, reason: .delivered(statusCode: 201))
        #expect(first.entry(id: saved[1].id) != nil)  // dropped: the entry stays, for the next owner
        await first.close()  // twice is once
        let third = try await Self.reopen(directory, after: second)
        #expect(await third.load().map(\.id) == saved.map(\.id))
    }

    /// Saves racing `close()`: each either returned (its entry is in the folder when `close()`
    /// returns, for the next owner, who opens it at that moment) or threw `closed` (nothing of it
    /// is): never a file written after the folder was let go of, never an acknowledged entry
    /// missing.
    @Test func savesRacingCloseAreEachInTheFolderExactlyWhenTheyReturned() async throws {
        var generator = SplitMix64(seed: 45)
        var outcomes: [Int] = []
        for round in 0..<40 {
            let directory = TemporaryDirectory()
            let store = try DiskQueueStore(directory: directory.url)
            let entries = (0..<16).map { QueueEntry(Mutation("/n/\(round)/\($0)")) }
            let saved = Log<UUID>()
            let yields = Int.random(in: 0..<24, using: &generator)
            let found = await withTaskGroup(of: Set<UUID>?.self) { group in
                group.addTask {
                    for _ in 0..<yields { await Task.yield() }
                    await store.close()
                    // The next owner opens the folder the moment it is free.
                    return Set((try? DiskQueueStore(directory: directory.url))?.orderedEntries().map(\.id) ?? [])
                }
                for entry in entries {
                    group.addTask {
                        do {
                            try await store.save(entry)
                            saved.append(entry.id)
                        } catch {
                            #expect(error as? OfflineQueueError == .closed)
                        }
                        return nil
                    }
                }
                var found: Set<UUID> = []
                for await result in group { if let result { found = result } }
                return found
            }
            #expect(found == Set(saved.values), "round \(round)")
            outcomes.append(saved.values.count)
        }
        // The race was run: some rounds closed before every save was in.
        #expect(outcomes.contains { $0 < 16 }, "\(outcomes)")
    }

    @Test func aClosedEngineSendsNothingAndItsFolderOpensAtOnce() async throws {
        let h = try QueueHarness([], connected: false)
        await h.engine.start()
        _ = try await h.engine.enqueue(Mutation("/kept"))
        await h.engine.close()
        #expect(await h.engine.isStarted == false)
        await #expect(throws: OfflineQueueError.closed) { try await h.engine.enqueue(Mutation("/late")) }
        await h.engine.start()
        #expect(await h.engine.isStarted == false)
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.delivered.isEmpty && h.session.callCount == 0)
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(await reopened.load().map(\.url.path) == ["/kept"])
    }

    /// The second store opens while the first is still referenced: only its close let go.
    private static func reopen(_ directory: TemporaryDirectory, after store: DiskQueueStore) async throws -> DiskQueueStore {
        await store.close()
        return try DiskQueueStore(directory: directory.url)
    }
}
