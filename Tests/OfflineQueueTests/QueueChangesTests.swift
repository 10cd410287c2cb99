import Foundation
import RequestEngine
import ResilienceTesting
import Testing

@testable import OfflineQueue

/// `DiskQueueStore.changes`: every change to the entries, in order, with why an entry left.
@Suite("OfflineQueue changes: stored, updated, attempts, removed and why", .timeLimit(.minutes(1)))
struct QueueChangesTests {
    /// A readable name for each change, with the entry's path.
    static func describe(_ change: QueueChange) -> String {
        switch change {
        case .offered(let entry): "offered \(entry.url.path)"
        case .stored(let entry, let replacing): "stored \(entry.url.path)" + (replacing == nil ? "" : " replacing")
        case .updated(let entry): "updated \(entry.url.path) attempts \(entry.attempts)"
        case .attemptStarted: "attempt started"
        case .attemptEnded: "attempt ended"
        case .removed(let entry, let reason): "removed \(entry.url.path) \(reason)"
        }
    }

    @Test func everyKindOfChangeIsPublishedInOrderWithTheReasonAnEntryLeft() async throws {
        let h = try QueueHarness([.status(503), .ok()], connected: false)
        var changes = h.engine.changes.makeAsyncIterator()
        var edit = Mutation("/profile", body: "v1")
        edit.coalescingKey = "profile"
        _ = try await h.engine.enqueue(edit)
        edit.body = Data("v2".utf8)
        _ = try await h.engine.enqueue(edit)
        let doomed = try #require(try await h.engine.enqueue(Mutation("/doomed")).queuedID)
        _ = try await h.engine.enqueue(Mutation("/posted"))
        #expect(await h.engine.cancel(id: doomed))
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()  // /profile: 503, kept with a backoff; /posted: 200
        var seen: [String] = []
        for _ in 0..<11 {
            guard let change = await changes.next() else { break }
            seen.append(Self.describe(change))
        }
        #expect(
            seen == [
                "stored /profile",
                "stored /profile replacing",
                "stored /doomed",
                "stored /posted",
                "removed /doomed cancelled",
                "attempt started", "updated /profile attempts 1", "attempt ended",
                "attempt started", "removed /posted delivered(statusCode: 200)", "attempt ended",
            ])
    }

    @Test func aRequestSentAtOnceIsOfferedThenDeliveredStoredOrRejectedUnderOneID() async throws {
        let h = try QueueHarness([.ok(), .status(503), .status(422)])
        var changes = h.engine.changes.makeAsyncIterator()
        #expect(try await h.engine.enqueue(Mutation("/sent")) == .sent(statusCode: 200))
        let kept = try #require(try await h.engine.enqueue(Mutation("/kept")).queuedID)
        await #expect(throws: NetworkError.self) { try await h.engine.enqueue(Mutation("/rejected")) }
        var seen: [String] = []
        var ids: [UUID] = []
        for _ in 0..<6 {
            guard let change = await changes.next() else { break }
            seen.append(Self.describe(change))
            ids.append(change.entryID)
        }
        #expect(
            seen == [
                "offered /sent", "removed /sent delivered(statusCode: 200)",
                "offered /kept", "stored /kept",
                "offered /rejected", "removed /rejected rejected(statusCode: Optional(422))",
            ])
        #expect(ids[0] == ids[1] && ids[2] == kept && ids[3] == kept && ids[4] == ids[5])
    }

    @Test func anOfferedRequestThatCannotBeStoredIsRemovedAsNotStored() async throws {
        let h = try QueueHarness([.status(503)], connected: false, maxQueueSize: 1)
        _ = try await h.engine.enqueue(Mutation("/first"))
        var changes = h.engine.changes.makeAsyncIterator()
        await h.monitor.setConnected(true)
        await #expect(throws: OfflineQueueError.self) { try await h.engine.enqueue(Mutation("/second")) }
        var seen: [String] = []
        while seen.count < 2, let change = await changes.next() { seen.append(Self.describe(change)) }
        #expect(seen == ["offered /second", "removed /second notStored"])
    }

    @Test func aRejectionExpiryAndDeadLetterSayWhy() async throws {
        var configuration = OfflineQueueEngine.Configuration(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10))
        configuration.maxAttempts = 1
        let h = try QueueHarness([.status(422), .status(503)], connected: false, configuration: configuration)
        let start = h.store.changeFeed.sequencedChangesWithStart()
        var changes = start.changes.makeAsyncIterator()
        _ = try await h.engine.enqueue(Mutation("/rejected"))
        _ = try await h.engine.enqueue(Mutation("/dead"))
        var short = Mutation("/expired")
        short.ttl = 5
        _ = try await h.engine.enqueue(short)
        h.clock.advance(by: .seconds(10))
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        var removals: [String] = []
        var last: UInt64 = start.sequence
        while removals.count < 3, let (sequence, change) = await changes.next() {
            #expect(sequence == last + 1)  // numbered without gaps
            last = sequence
            if case .removed(let entry, let reason) = change { removals.append("\(entry.url.path) \(reason)") }
        }
        // The pass sweeps the expired entry first (it is never sent), then sends the others.
        #expect(removals == ["/expired expired", "/rejected rejected(statusCode: Optional(422))", "/dead deadLettered(attempts: 1)"])
        #expect(h.store.changeFeed.sequence == last + 1)  // the dead letter's attempt ended last
    }
}

/// `QueueChangeFeed.publishFromElsewhere`: a late notice of an entry this feed saw removed is
/// dropped, for the newest `rememberedRemovals` removals; older ones are forgotten, so the memory
/// a feed keeps for them stays bounded on a queue that runs for months.
@Suite("QueueChangeFeed remembers the newest removals, and only those")
struct QueueChangeFeedRemovalMemoryTests {
    private func entry(_ n: Int) -> QueueEntry {
        QueueEntry(QueuedRequest(method: .post, url: URL(string: "https://api.example.test/items/\(n)")!), enqueuedAt: Date(timeIntervalSince1970: 0))
    }

    @Test func aLateNoticeOfARemovedEntryIsDroppedUntilNewerRemovalsPushItOut() {
        let limit = QueueChangeFeed.rememberedRemovals
        let entries = (0...limit + 1).map(entry)
        let feed = QueueChangeFeed(entries: entries)
        for entry in entries { feed.publish(.removed(entry, reason: .delivered(statusCode: 201))) }
        #expect(feed.count == 0)
        // limit + 2 removals: the two oldest are forgotten, the newest `limit` remembered.
        #expect(feed.publishFromElsewhere(.stored(entries[limit + 1], replacing: nil)) == false)
        #expect(feed.publishFromElsewhere(.updated(entries[2])) == false)
        #expect(feed.count == 0)
        #expect(feed.publishFromElsewhere(.stored(entries[1], replacing: nil)) == true)
        #expect(feed.publishFromElsewhere(.stored(entries[0], replacing: nil)) == true)
        #expect(feed.count == 2)
        #expect(Set(feed.entries().map(\.id)) == [entries[0].id, entries[1].id])
    }

    @Test func theRemovalsRememberedStayBoundedOverManyTimesTheLimit() {
        let limit = QueueChangeFeed.rememberedRemovals
        let feed = QueueChangeFeed()
        var last: [QueueEntry] = []
        for n in 0..<(limit * 5 + 7) {
            let entry = entry(n)
            feed.publish(.stored(entry, replacing: nil))
            feed.publish(.removed(entry, reason: .cancelled))
            last.append(entry)
            if last.count > limit + 1 { last.removeFirst() }
        }
        // The newest `limit` are remembered, the one before them is not.
        #expect(feed.removalMemory.ids == limit)
        #expect(feed.removalMemory.log <= 2 * limit + 1)
        #expect(feed.publishFromElsewhere(.stored(last[last.count - 1], replacing: nil)) == false)
        #expect(feed.publishFromElsewhere(.stored(last[1], replacing: nil)) == false)
        #expect(feed.publishFromElsewhere(.stored(last[0], replacing: nil)) == true)
    }
}
