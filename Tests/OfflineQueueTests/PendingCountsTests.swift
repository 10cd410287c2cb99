import Foundation
import RequestEngine
import ResilienceTesting
import Testing

@testable import OfflineQueue

@Suite("OfflineQueueEngine.pendingCounts: the count at once, then every change", .timeLimit(.minutes(1)))
struct PendingCountsTests {
    @Test func theStreamStartsWithTheCurrentCountAndFollowsEveryEnqueueDeliveryAndCancel() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        _ = try await h.engine.enqueue(Mutation("/before"))
        var counts = h.engine.pendingCounts.makeAsyncIterator()
        #expect(await counts.next() == 1)
        let second = try #require(try await h.engine.enqueue(Mutation("/second")).queuedID)
        #expect(await counts.next() == 2)
        _ = try await h.engine.enqueue(Mutation("/third"))
        #expect(await counts.next() == 3)
        #expect(await h.engine.cancel(id: second))
        #expect(await counts.next() == 2)
        await h.monitor.setConnected(true)
        #expect(await h.engine.flush().delivered.count == 2)
        // A slow reader sees the latest count, never an older one last.
        var last = -1
        while last != 0, let next = await counts.next() { last = next }
        #expect(last == 0)
    }

    @Test func aCoalescingReplacementDoesNotChangeTheCount() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var edit = Mutation("/profile", body: "v1")
        edit.coalescingKey = "profile"
        _ = try await h.engine.enqueue(edit)
        var counts = h.store.entryCounts(bufferingPolicy: .unbounded).makeAsyncIterator()  // every value kept
        #expect(await counts.next() == 1)
        edit.body = Data("v2".utf8)
        _ = try await h.engine.enqueue(edit)
        _ = try await h.engine.enqueue(Mutation("/other"))
        _ = try await h.engine.enqueue(Mutation("/third"))
        // 1 → 2 → 3: the replacement added no transient 2 → 1.
        #expect(await counts.next() == 2)
        #expect(await counts.next() == 3)
    }
}
