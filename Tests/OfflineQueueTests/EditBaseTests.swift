import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineQueue

/// Issue 46's first step: a write carries the version it edits (`EditBase`), stored with its entry
/// and sent as a precondition on every attempt.
@Suite("EditBase: a queued write is sent on the condition of the version it edits")
struct EditBaseTests {
    private let url = URL(string: "https://api.example.test/notes/1")!

    private func edit(_ body: String, base: EditBase?, key: String? = nil, headers: [String: String] = [:]) -> QueuedRequest {
        QueuedRequest(method: .put, url: url, headers: headers, body: Data(body.utf8), coalescingKey: key, editBase: base)
    }

    @Test func aStrongETagGoesOutAsIfMatchOnTheFirstAttemptAndOnTheReplay() async throws {
        let h = try QueueHarness([.status(503), .ok()])
        _ = try await h.engine.enqueue(edit("v2", base: EditBase(etag: "\"v1\"", lastModified: "Tue, 01 Dec 2026 10:00:00 GMT")))
        h.clock.advance(by: .seconds(10))  // the 503's backoff
        #expect(await h.engine.flush().delivered.count == 1)
        #expect(h.session.requests.map { $0.value(forHTTPHeaderField: "If-Match") } == ["\"v1\"", "\"v1\""])
        #expect(h.session.requests.allSatisfy { $0.value(forHTTPHeaderField: "If-Unmodified-Since") == nil })
    }

    @Test func aWeakETagFallsBackToIfUnmodifiedSinceAndWithNeitherTheWriteIsUnconditional() async throws {
        let h = try QueueHarness([.ok(), .ok()], connected: false)
        _ = try await h.engine.enqueue(edit("a", base: EditBase(etag: "W/\"v1\"", lastModified: "Tue, 01 Dec 2026 10:00:00 GMT")))
        _ = try await h.engine.enqueue(edit("b", base: EditBase(etag: "W/\"v1\"")))
        await h.monitor.setConnected(true)
        #expect(await h.engine.flush().delivered.count == 2)
        #expect(h.session.requests.map { $0.value(forHTTPHeaderField: "If-Unmodified-Since") } == ["Tue, 01 Dec 2026 10:00:00 GMT", nil])
        #expect(h.session.requests.allSatisfy { $0.value(forHTTPHeaderField: "If-Match") == nil })
    }

    @Test func theAppsOwnPreconditionStands() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        _ = try await h.engine.enqueue(edit("a", base: EditBase(etag: "\"v1\""), headers: ["if-match": "\"mine\""]))
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        #expect(h.session.requests.first?.value(forHTTPHeaderField: "If-Match") == "\"mine\"")
    }

    @Test func theBaseSurvivesARelaunchThroughTheFastReaderAndAnEntryWithoutOneStaysUnconditional() async throws {
        let directory = TemporaryDirectory()
        do {
            let store = try DiskQueueStore(directory: directory.url)
            let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store)
            _ = try await engine.enqueue(edit("a", base: EditBase(etag: "\"v1\"", lastModified: "Tue, 01 Dec 2026 10:00:00 GMT")))
            _ = try await engine.enqueue(edit("b", base: nil))
            await engine.close()
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).filter { $0.hasSuffix(".json") }
        #expect(names.count == 2)
        for name in names {
            let bytes = try Data(contentsOf: directory.url.appendingPathComponent(name))
            let fast = try #require(QueueEntryDecoder.decode(bytes))
            let slow = try QueueEntry.makeDecoder().decode(QueueEntry.self, from: bytes)
            #expect(fast == slow)
        }
        let reopened = try DiskQueueStore(directory: directory.url)
        let bases = reopened.orderedEntries().map(\.base)
        #expect(bases == [EditBase(etag: "\"v1\"", lastModified: "Tue, 01 Dec 2026 10:00:00 GMT"), nil])
    }

    @Test(arguments: [false, true])
    func aCoalescedEditKeepsTheBaseOfTheEditItReplaces(inMemory: Bool) async throws {
        let storage: any QueueStorage
        let directory = TemporaryDirectory()
        if inMemory { storage = InMemoryQueueStorage() } else { storage = try DiskQueueStore(directory: directory.url) }
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: storage)
        _ = try await engine.enqueue(edit("first", base: EditBase(etag: "\"seen\""), key: "note-1"))
        _ = try await engine.enqueue(edit("second", base: EditBase(etag: "\"own-later\""), key: "note-1"))
        _ = try await engine.enqueue(edit("third", base: nil, key: "note-1"))
        let entries = try await storage.queuedEntries()
        #expect(entries.count == 1)
        #expect(entries.first?.body == Data("third".utf8))
        #expect(entries.first?.base == EditBase(etag: "\"seen\""))
    }

    @Test func aFirstEditWithoutABaseLetsTheNextOneBringItsOwn() async throws {
        let storage = InMemoryQueueStorage()
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: storage)
        _ = try await engine.enqueue(edit("first", base: nil, key: "note-1"))
        _ = try await engine.enqueue(edit("second", base: EditBase(etag: "\"v7\""), key: "note-1"))
        #expect(try await storage.queuedEntries().first?.base == EditBase(etag: "\"v7\""))
    }
}
