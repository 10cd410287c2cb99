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
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// SwiftResilience's public queue API (issue 14): `QueueEntry(_:id:enqueuedAt:)`, `isExpired`,
/// `asURLRequest()`, `DiskQueueStore.save/load/count/delete/deleteExpired` with their published
/// meanings, `OfflineQueueEngine(reachabilityMonitor:)` on the default folder, and the derived
/// idempotency key as an opt-in.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("OfflineQueue: SwiftResilience's public API and its meanings", .timeLimit(.minutes(5)))
struct SwiftResilienceCompatibilityTests {
    struct SubmitOrder: QueueableRequest {
        let url = URL(string: "https://api.example.test/orders")!
        let method: HTTPMethod = .post
        var headers: [String: String] = ["Content-Type": "application/json", "Authorization": "Bearer secret", "Idempotency-Key": "ignored"]
        var body: Data? = Data("{\"id\":1}".utf8)
        var timeout: TimeInterval { 12 }
        var ttl: TimeInterval = 3_600
        var priority: QueuePriority = .high
        var idempotencyKey: String { "order-1" }
    }

    // MARK: - QueueEntry

    @Test func thePublicInitializerSnapshotsTheRequestWithoutSecrets() {
        let id = UUID()
        let date = Date(timeIntervalSince1970: 1_748_476_800)
        let entry = QueueEntry(SubmitOrder(), id: id, enqueuedAt: date)
        #expect(entry.id == id)
        #expect(entry.enqueuedAt == date)
        #expect(entry.url == SubmitOrder().url && entry.method == "POST" && entry.body == SubmitOrder().body)
        #expect(entry.timeout == 12 && entry.ttl == 3_600 && entry.priority == QueuePriority.high.rawValue)
        #expect(entry.idempotencyKey == "order-1")
        #expect(entry.headers == ["Content-Type": "application/json"])  // no Authorization, no Idempotency-Key
        #expect(entry.attempts == 0 && entry.nextAttemptAt == nil)
        #expect(QueueEntry(SubmitOrder()).id != QueueEntry(SubmitOrder()).id)
    }

    @Test func isExpiredReadsTheSystemClock() {
        var request = SubmitOrder()
        request.ttl = 1
        #expect(QueueEntry(request, enqueuedAt: Date().addingTimeInterval(-60)).isExpired)
        #expect(!QueueEntry(request).isExpired)
        #expect(!QueueEntry(SubmitOrder(), enqueuedAt: Date().addingTimeInterval(-60)).isExpired)
    }

    @Test func asURLRequestCarriesTheStoredFieldsAndTheIdempotencyKey() {
        let request = QueueEntry(SubmitOrder()).asURLRequest()
        #expect(request.url == SubmitOrder().url)
        #expect(request.httpMethod == "POST")
        #expect(request.httpBody == SubmitOrder().body)
        #expect(request.timeoutInterval == 12)
        #expect(request.value(forHTTPHeaderField: "Idempotency-Key") == "order-1")
        #expect(request.value(forHTTPHeaderField: "Content-Type") == "application/json")
        #expect(request.value(forHTTPHeaderField: "Authorization") == nil)
    }

    // MARK: - DiskQueueStore

    @Test func savedEntriesAreReplayedByPriorityThenInSaveOrder() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let base = Date()
        let normal = QueueEntry(Mutation("/n1"), enqueuedAt: base)
        let critical = QueueEntry(Mutation("/c", priority: .critical), enqueuedAt: base)
        let normal2 = QueueEntry(Mutation("/n2"), enqueuedAt: base.addingTimeInterval(-10))  // older, saved later
        for entry in [normal, critical, normal2] { try await store.save(entry) }
        #expect(await store.load().map(\.id) == [critical.id, normal.id, normal2.id])
        #expect(directory.fileNames.count == 3)
    }

    @Test func savingAnIDAgainReplacesItKeepsItsPlaceAndMovesItToItsNewPriority() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let first = QueueEntry(Mutation("/1"))
        let second = QueueEntry(Mutation("/2"))
        let third = QueueEntry(Mutation("/3"))
        for entry in [first, second, third] { try await store.save(entry) }
        try await store.save(QueueEntry(Mutation("/2-edited"), id: second.id))
        #expect(await store.load().map(\.url.path) == ["/1", "/2-edited", "/3"])
        try await store.save(QueueEntry(Mutation("/3", priority: .critical), id: third.id))
        #expect(await store.load().map(\.id) == [third.id, first.id, second.id])
        try await store.save(QueueEntry(Mutation("/3"), id: third.id))  // back to normal: its old place
        #expect(await store.load().map(\.id) == [first.id, second.id, third.id])
        #expect(await store.count() == 3)
        #expect(directory.fileNames.count == 3)
        store.releaseLock()
        #expect(try DiskQueueStore(directory: directory.url).orderedEntries().map(\.id) == [first.id, second.id, third.id])
    }

    /// The bug of issue 14, step by step: an entry saved again with another priority, then many
    /// removals of other entries (a lane compaction). Before d8ad5c8 it vanished from `load()` and
    /// from replay while `count()` still counted it.
    @Test func anEntryMovedToAnotherPriorityStaysListedThroughLaneCompactions() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let moved = QueueEntry(Mutation("/moved"))
        try await store.save(moved)
        try await store.save(QueueEntry(Mutation("/moved", priority: .high), id: moved.id))
        for index in 0..<80 {
            let other = QueueEntry(Mutation("/other/\(index)"))
            try await store.save(other)
            await store.delete(id: other.id)
        }
        #expect(await store.load().map(\.id) == [moved.id])
        #expect(await store.count() == 1)
        #expect(store.orderedEntries().first?.queuePriority == .high)
    }

    @Test func loadLeavesOutExpiredEntriesWhichStayCountedUntilSwept() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        var shortLived = Mutation("/expired")
        shortLived.ttl = 1
        let expired = QueueEntry(shortLived, enqueuedAt: Date().addingTimeInterval(-60))
        let fresh = QueueEntry(Mutation("/fresh"))
        try await store.save(expired)
        try await store.save(fresh)
        #expect(await store.load().map(\.id) == [fresh.id])
        #expect(store.orderedEntries().map(\.id) == [expired.id, fresh.id])
        #expect(await store.count() == 2)
        #expect(await store.deleteExpired() == 1)
        #expect(await store.count() == 1)
        #expect(store.orderedEntries().map(\.id) == [fresh.id])
    }

    @Test func anEntrySavedByHandIsReplayedWithItsIdempotencyKey() async throws {
        let h = try QueueHarness([.ok()])
        try await h.store.save(QueueEntry(SubmitOrder()))
        let report = await h.engine.flush()
        #expect(report.delivered.count == 1)
        #expect(h.sentKeys == ["order-1"])
        #expect(h.session.requests.first?.value(forHTTPHeaderField: "Content-Type") == "application/json")
        #expect(await h.store.count() == 0)
    }

    @Test func savingAnEntryBuiltOrDecodedWithSecretHeadersWritesNone() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let plain = QueueEntry(Mutation("/x"))
        let withSecrets = QueueEntry(
            id: plain.id, url: plain.url, method: plain.method,
            headers: ["Authorization": "Bearer secret", "cookie": "s=1", "Idempotency-Key": "k", "Accept": "text/plain"],
            body: nil, timeout: 30, enqueuedAt: Date(), ttl: 60, priority: 0, idempotencyKey: "key",
            orderingKey: nil, coalescingKey: nil, sequence: 0, attempts: 0, nextAttemptAt: nil, lastError: nil,
            revision: 0, formatVersion: QueueEntry.currentFormatVersion
        )
        let decoded = try JSONDecoder().decode(QueueEntry.self, from: JSONEncoder().encode(withSecrets))
        try await store.save(decoded)
        let file = try String(decoding: Data(contentsOf: directory.url.appendingPathComponent("\(plain.id.uuidString).json")), as: UTF8.self)
        #expect(!file.contains("secret") && !file.contains("s=1") && !file.lowercased().contains("cookie"))
        #expect(store.entry(id: plain.id)?.headers == ["Accept": "text/plain"])
    }

    @Test func anEntryWithASequenceOutOfRangeIsRefused() async throws {
        let directory = TemporaryDirectory()
        let store = try DiskQueueStore(directory: directory.url)
        let entry = QueueEntry(Mutation("/x")).placed(at: QueueEntry.maximumCounter + 1)
        await #expect(throws: OfflineQueueError.self) { try await store.save(entry) }
        #expect(await store.count() == 0)
    }

    // MARK: - flush and the monitor

    @Test func flushFollowsTheMonitorUnlessToldToIgnoreIt() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        _ = try await h.engine.enqueue(Mutation("/a"))
        let respecting = await h.engine.flush()
        #expect(respecting.endedOffline && respecting.delivered.isEmpty && h.session.callCount == 0)
        let forced = await h.engine.flush(.ignoringReachability)
        #expect(forced.delivered.count == 1 && !forced.endedOffline)
        #expect(h.sentPaths == ["/a"])
    }

    @Test func aForcedFlushThatFindsNoNetworkEndsThePassAndKeepsTheEntry() async throws {
        let h = try QueueHarness([.urlError(.notConnectedToInternet)], connected: false)
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        let forced = await h.engine.flush(.ignoringReachability)
        #expect(forced.endedOffline && forced.results.isEmpty)
        #expect(h.store.entry(id: id)?.attempts == 0)
    }

    // MARK: - The default folder

    /// `OfflineQueueEngine(reachabilityMonitor:)` opens `DiskQueueStore()`'s folder; run in a child
    /// process whose data folder (`XDG_DATA_HOME`) is a temporary one.
    @Test func theInitializerWithoutAStoreUsesTheDefaultFolder() async throws {
        #if os(Linux)
        let directory = TemporaryDirectory()
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = directory.url.path as String] in
                setenv("XDG_DATA_HOME", path, 1)
                let queue = try OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false))
                let expected = URL(fileURLWithPath: path).appendingPathComponent("Resilience/OfflineQueue").standardizedFileURL.path
                guard queue.disk?.directory.standardizedFileURL.path == expected else { exit(1) }
                guard try await queue.enqueue(Mutation("/a")).queuedID != nil else { exit(2) }
                guard FileManager.default.fileExists(atPath: expected + "/quarantine") else { exit(3) }
                // A second queue on the default folder is refused, not silently given a store that loses entries.
                do {
                    _ = try OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor())
                    exit(4)
                } catch OfflineQueueError.folderInUse(let folder) {
                    guard URL(fileURLWithPath: folder).standardizedFileURL.path == expected else { exit(5) }
                }
                exit(0)
            }
        }
        #endif
    }

    @Test func theInitializerWithoutAStoreThrowsWhenTheFolderCannotBeMade() async throws {
        #if os(Linux)
        let directory = TemporaryDirectory()
        try FileManager.default.createDirectory(at: directory.url, withIntermediateDirectories: true)
        let blocker = directory.url.appendingPathComponent("Resilience")
        try Data("a file where the folder should be".utf8).write(to: blocker)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = directory.url.path as String] in
                setenv("XDG_DATA_HOME", path, 1)
                do {
                    _ = try OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor())
                    exit(1)
                } catch OfflineQueueError.storage {
                    exit(0)
                }
            }
        }
        #endif
    }

    // MARK: - Idempotency keys

    @Test func theDefaultKeyIsAFreshUUIDPerRequestAndTheDerivedKeyIsStable() {
        let request = Mutation("/orders", body: "{\"id\":1}")
        struct Plain: QueueableRequest { let url: URL; let method: HTTPMethod = .post }
        let plain = Plain(url: request.url)
        #expect(plain.idempotencyKey != plain.idempotencyKey)
        #expect(UUID(uuidString: plain.idempotencyKey) != nil)

        let key = request.derivedIdempotencyKey
        #expect(key == Mutation("/orders", body: "{\"id\":1}").derivedIdempotencyKey)
        #expect(key.count == 64 && key.allSatisfy { "0123456789abcdef".contains($0) })
        #expect(key != Mutation("/orders", body: "{\"id\":2}").derivedIdempotencyKey)
        #expect(key != Mutation("/other", body: "{\"id\":1}").derivedIdempotencyKey)
        var put = request
        put.method = .put
        #expect(key != put.derivedIdempotencyKey)
        // The documented bytes: method, NUL, absolute URL, NUL, body.
        #expect(
            IdempotencyKey.derived(method: .post, url: URL(string: "https://api.example.com/orders")!, body: Data("{\"id\":1}".utf8))
                == "0b4b53e050497bc832439f32998f51dbba0f72aef2917b747628aa7657107195")
        #expect(
            IdempotencyKey.derived(method: .delete, url: request.url, body: nil)
                == IdempotencyKey.derived(method: .delete, url: request.url, body: Data()))
    }

    @Test func aConformanceThatOptsInIsQueuedAndReplayedWithTheDerivedKey() async throws {
        struct Like: QueueableRequest {
            let url = URL(string: "https://api.example.test/posts/7/like")!
            let method: HTTPMethod = .put
            var idempotencyKey: String { derivedIdempotencyKey }
        }
        let h = try QueueHarness([.ok()], connected: false)
        _ = try await h.engine.enqueue(Like())
        _ = try await h.engine.enqueue(Like())
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        #expect(h.sentKeys == [Like().derivedIdempotencyKey, Like().derivedIdempotencyKey])
    }

    @Test(arguments: [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
        (String(repeating: "a", count: 55), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"),
        (String(repeating: "a", count: 56), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"),
        (String(repeating: "a", count: 63), "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"),
        (String(repeating: "a", count: 64), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"),
    ])
    func sha256MatchesTheFIPSVectors(input: String, digest: String) {
        #expect(SHA256.hexDigest(Array(input.utf8)) == digest)
    }

    @Test func sha256OfAMillionBytes() {
        #expect(SHA256.hexDigest([UInt8](repeating: 0x61, count: 1_000_000)) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}
