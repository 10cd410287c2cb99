import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@Suite("DiskQueueStore: layout, durability, quarantine, restart")
struct DiskQueueStoreTests {
    func permissions(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? NSNumber)?.intValue ?? -1
    }

    /// The queue's timer waits for the earliest backoff that holds a send back. An entry behind
    /// the first of its ordering key waits for that one, so its own earlier date must not count:
    /// counted, it fired the timer into passes that sent nothing, over and over while the clock
    /// stood still (the simulation's queue seed 934 ran out of steps on it).
    @Test func theEarliestBackoffEndLeavesOutEntriesWaitingBehindTheFirstOfTheirKey() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let start = Date(timeIntervalSince1970: 1_000_000)
        func entry(_ path: String, key: String?, sequence: UInt64, next: Date?) -> QueueEntry {
            var request = Mutation(path)
            request.orderingKey = key
            return QueueEntry(request: request, idempotencyKey: path, enqueuedAt: start, sequence: sequence, attempts: 1, nextAttemptAt: next)
        }
        try await store.save(entry("/first", key: "k", sequence: 10, next: start.addingTimeInterval(60)))
        try await store.save(entry("/behind", key: "k", sequence: 11, next: start.addingTimeInterval(5)))
        #expect(store.earliestBackoffEnd() == start.addingTimeInterval(60))
        #expect(try await store.earliestNextAttempt() == start.addingTimeInterval(60))
        try await store.save(entry("/alone", key: nil, sequence: 12, next: start.addingTimeInterval(30)))
        #expect(store.earliestBackoffEnd() == start.addingTimeInterval(30))
        try await store.save(entry("/other-key", key: "j", sequence: 13, next: start.addingTimeInterval(20)))
        #expect(store.earliestBackoffEnd() == start.addingTimeInterval(20))
    }

    /// The first of a key is the lowest sequence, whatever the replay order says (a later entry of
    /// higher priority comes first in it), and its expiry ends the wait as its backoff does.
    @Test func theFirstOfAKeyIsItsLowestSequenceAndItsExpiryCounts() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let start = Date(timeIntervalSince1970: 1_000_000)
        var first = Mutation("/first")
        first.orderingKey = "k"
        first.ttl = 600
        var behind = Mutation("/behind", priority: .critical)
        behind.orderingKey = "k"
        try await store.save(QueueEntry(request: first, idempotencyKey: "1", enqueuedAt: start, sequence: 10, attempts: 1, nextAttemptAt: start.addingTimeInterval(3_600)))
        try await store.save(QueueEntry(request: behind, idempotencyKey: "2", enqueuedAt: start, sequence: 11, attempts: 1, nextAttemptAt: start.addingTimeInterval(5)))
        #expect(store.orderedEntries().first?.sequence == 11)  // the critical one leads the replay order
        #expect(store.earliestBackoffEnd() == start.addingTimeInterval(600))  // the first one's expiry
    }

    @Test func oneOwnerOnlyJSONFilePerEntryDirectlyInTheFolder() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var ids: [UUID] = []
        for index in 0..<3 { ids.append(try #require(try await h.engine.enqueue(Mutation("/\(index)")).queuedID)) }
        #expect(h.directory.fileNames == ids.map { "\($0.uuidString).json" }.sorted())
        for id in ids {
            #expect(permissions(h.directory.url.appendingPathComponent("\(id.uuidString).json").path) == 0o600)
        }
        #expect(permissions(h.directory.url.path) == 0o700)
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: h.directory.url.appendingPathComponent("quarantine").path, isDirectory: &isDirectory) && isDirectory.boolValue)
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: h.directory.url.appendingPathComponent("\(ids[0].uuidString).json"))) as? [String: Any]
        #expect(json?["idempotencyKey"] as? String != nil)
        #expect(json?["formatVersion"] as? Int == 1)
    }

    @Test func temporaryFilesLeftByACrashAreRemovedAtOpen() async throws {
        let directory = TemporaryDirectory()
        _ = try DiskQueueStore(directory: directory.url)
        let leftover = directory.url.appendingPathComponent(".\(UUID().uuidString).json.tmp")
        try Data("{\"half".utf8).write(to: leftover)
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.removedTemporaryFiles == 1)
        #expect(!FileManager.default.fileExists(atPath: leftover.path))
        #expect(await store.count() == 0)
    }

    @Test func corruptOrForeignFilesAreQuarantinedReportedAndNotCounted() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        let good = try #require(try await h.engine.enqueue(Mutation("/good")).queuedID)
        let url = h.directory.url
        let garbage = "\(UUID().uuidString).json", empty = "\(UUID().uuidString).json", schema = "\(UUID().uuidString).json"
        try Data([0xFF, 0x00, 0x7B]).write(to: url.appendingPathComponent(garbage))
        try Data().write(to: url.appendingPathComponent(empty))
        try Data("{\"hello\": \"world\"}".utf8).write(to: url.appendingPathComponent(schema))
        // A valid entry under the wrong name.
        let renamed = "\(UUID().uuidString).json"
        try FileManager.default.copyItem(at: url.appendingPathComponent("\(good.uuidString).json"), to: url.appendingPathComponent(renamed))
        try Data("notes".utf8).write(to: url.appendingPathComponent("README.txt"))  // not ours: ignored

        h.store.releaseLock()  // as if the process had ended
        let store = try DiskQueueStore(directory: url)
        #expect(await store.count() == 1)
        #expect(Set(store.openReport.quarantined.map(\.name)) == [garbage, empty, schema, renamed])
        let quarantined = try FileManager.default.contentsOfDirectory(atPath: store.quarantineDirectory.path)
        #expect(Set(quarantined) == [garbage, empty, schema, renamed])
        #expect(h.directory.fileNames == ["\(good.uuidString).json", "README.txt"])
    }

    @Test func aNewEngineOnTheSameFolderResumesEntriesWithKeysAttemptsAndBackoff() async throws {
        let h = try QueueHarness([.status(503)])
        var request = Mutation("/a")
        request.idempotencyKey = "stable-key"
        let first = try #require(try await h.engine.enqueue(request).queuedID)  // 503: attempt 1, backoff
        let before = try #require(h.store.entry(id: first))

        let session = ScriptedNetworkSession([.ok()])
        h.store.releaseLock()  // as if the process had ended
        let reopened = try DiskQueueStore(directory: h.directory.url)
        let restarted = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
            store: reopened
        )
        let after = try #require(reopened.entry(id: first))
        #expect(after == before)
        #expect(after.attempts == 1)
        #expect(after.idempotencyKey == "stable-key")
        #expect(after.nextAttemptAt == before.nextAttemptAt)
        let next = try #require(try await restarted.enqueue(Mutation("/b")).queuedID)
        #expect(await restarted.items.map(\.id) == [first, next])  // FIFO continues across restarts
        #expect(try #require(reopened.entry(id: next)).sequence > after.sequence)
    }

    @Test func aCoalescingReplacementInterruptedByACrashKeepsTheNewestRevision() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var v1 = Mutation("/profile", body: "v1")
        v1.coalescingKey = "p"
        let oldID = try #require(try await h.engine.enqueue(v1).queuedID)
        let old = try #require(h.store.entry(id: oldID))
        var v2 = Mutation("/profile", body: "v2")
        v2.coalescingKey = "p"
        let newID = try #require(try await h.engine.enqueue(v2).queuedID)
        // Simulate the crash window: the old file is still there next to its replacement.
        let data = try QueueEntry.makeEncoder().encode(old)
        try data.write(to: h.directory.url.appendingPathComponent("\(oldID.uuidString).json"))
        h.store.releaseLock()  // as if the process had ended
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(await reopened.load().map(\.id) == [newID])
        #expect(reopened.openReport.removedSupersededEntries == 1)
        #expect(h.directory.fileNames == ["\(newID.uuidString).json"])
    }

    @Test func aFolderThatCannotBeCreatedIsATypedError() throws {
        let directory = TemporaryDirectory()
        try FileManager.default.createDirectory(at: directory.url, withIntermediateDirectories: true)
        let blocker = directory.url.appendingPathComponent("queue")
        try Data("I am a file".utf8).write(to: blocker)
        #expect(throws: OfflineQueueError.self) { try DiskQueueStore(directory: blocker) }
        #expect(throws: OfflineQueueError.self) { try DiskQueueStore(directory: blocker.appendingPathComponent("inner")) }
    }

    @Test func twoThousandEntriesReopenInOrderWithoutLoss() async throws {
        let h = try QueueHarness([.ok()], connected: false, maxQueueSize: 5000)
        let engine = h.engine
        let ids = try await withThrowingTaskGroup(of: UUID?.self) { group in
            for index in 0..<2000 {
                group.addTask {
                    try await engine.enqueue(Mutation("/\(index)", priority: index % 3 == 0 ? .high : .normal)).queuedID
                }
            }
            return try await group.reduce(into: Set<UUID>()) { if let id = $1 { $0.insert(id) } }
        }
        #expect(ids.count == 2000)
        let expectedOrder = await h.store.load().map(\.id)
        h.store.releaseLock()  // as if the process had ended
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(reopened.openReport.loaded == 2000)
        #expect(await reopened.load().map(\.id) == expectedOrder)
        #expect(Set(expectedOrder) == ids)
    }

    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a size-limited tmpfs here (needs Linux, root and mount(2))"))
    func aFullDiskIsATypedErrorAndLosesNothingAcknowledged() async throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 64))
        defer { mounted.unmount() }
        let folder = mountPoint.url.appendingPathComponent("queue")
        let store = try DiskQueueStore(directory: folder)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: ScriptedNetworkSession([.ok()])),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
            store: store, maxQueueSize: 100_000
        )
        var acknowledged: [UUID] = []
        var failure: OfflineQueueError?
        let body = String(repeating: "x", count: 2048)
        for index in 0..<1000 {
            do {
                acknowledged.append(try #require(try await engine.enqueue(Mutation("/\(index)", body: body)).queuedID))
            } catch let error as OfflineQueueError {
                failure = error
                break
            }
        }
        let error = try #require(failure, "the 64 KiB file system never filled up")
        #expect(error.isDiskFull, "\(error)")
        #expect(await engine.pendingCount() == acknowledged.count)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasPrefix(".") }
        #expect(leftovers.isEmpty)
        store.releaseLock()  // as if the process had ended
        let reopened = try DiskQueueStore(directory: folder)
        #expect(Set(await reopened.load().map(\.id)) == Set(acknowledged))
        #expect(reopened.openReport.quarantined.isEmpty)
    }
}
