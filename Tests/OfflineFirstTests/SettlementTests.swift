import Foundation
import OfflineQueue
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import ResponseCache
import Retry
import Testing

@testable import OfflineFirst

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The rules that keep the response cache and the queue's files telling one story across a
/// relaunch (`SettlementTracker`): a read that may hold a write of unknown fate is not stored, and
/// a delivered write is recorded in the stored reads it changes before its file goes.
/// A write to another resource than the notes list.
struct OtherWrite: QueueableRequest {
    var url = URL(string: "https://notes.example.test/profile")!
    var method: HTTPMethod { .post }
    var body: Data? { Data("p".utf8) }
    var timeout: TimeInterval = .infinity
    var priority: QueuePriority { .high }
}

@Suite("OfflineFirst: what is stored tells one story across a relaunch", .timeLimit(.minutes(1)))
struct SettlementTests {
    // MARK: The tracker alone

    static let notes = URL(string: "https://notes.example.test/notes")!
    static let other = URL(string: "https://notes.example.test/profile")!

    static func entry(_ text: String, attempts: Int = 0) -> QueueEntry {
        let entry = QueueEntry(CreateNote(text))
        guard attempts > 0 else { return entry }
        // As read back from a file written after failed attempts.
        guard let data = try? QueueEntry.makeEncoder().encode(entry),
            var fields = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        else { return entry }
        fields["attempts"] = attempts
        guard let edited = try? JSONSerialization.data(withJSONObject: fields) else { return entry }
        return (try? QueueEntry.makeDecoder().decode(QueueEntry.self, from: edited)) ?? entry
    }

    static func tracker(recording recorded: Locked<[String]> = Locked([])) -> SettlementTracker {
        let tracker = SettlementTracker(rules: [appendNote]) { entry, _ in
            recorded.withLock { $0.append(String(decoding: entry.body ?? Data(), as: UTF8.self)) }
        }
        tracker.seed([], sendingAtOpen: [])
        return tracker
    }

    /// Yields until `condition` holds (a waiter has joined the line, say).
    static func until(_ condition: () -> Bool) async {
        while !condition() { await Task.yield() }
    }

    @Test func aFetchWaitsWhileAWriteOfItsReadIsSentAndRecorded() async throws {
        let recorded = Locked<[String]>([])
        let tracker = Self.tracker(recording: recorded)
        let write = Self.entry("b")
        #expect(await tracker.sendBegins(write, waits: true))
        let fetch = Task { await tracker.exchangeBegins(url: Self.notes, storedNote: Data()) }
        await Self.until { tracker.waitingCount == 1 }
        await tracker.delivered(write)
        #expect(recorded.withLock { $0 } == ["b"] && tracker.waitingCount == 1)  // still waiting: the file is not gone yet
        tracker.deliveryFinished(write)
        let token = try #require(await fetch.value)
        #expect(tracker.mayStore(token))  // it began after the write was recorded: it holds it
        tracker.exchangeEnded(token)
    }

    @Test func aReplayWaitsForAFetchOfAReadItChangesBegunBefore() async throws {
        let tracker = Self.tracker()
        let token = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        let replay = Task { await tracker.sendBegins(Self.entry("b"), waits: true) }
        await Self.until { tracker.waitingCount == 1 }
        #expect(tracker.mayStore(token))  // nothing was sent while it was fetched
        tracker.exchangeEnded(token)
        #expect(await replay.value)
    }

    @Test func turnsAreTakenFirstComeFirstServed() async throws {
        let tracker = Self.tracker()
        let write = Self.entry("b")
        let first = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        let replay = Task { await tracker.sendBegins(write, waits: true) }
        await Self.until { tracker.waitingCount == 1 }
        // A second fetch arrives after the write: it waits behind it, not beside the first fetch.
        let second = Task { await tracker.exchangeBegins(url: Self.notes, storedNote: Data()) }
        await Self.until { tracker.waitingCount == 2 }
        tracker.exchangeEnded(first)
        #expect(await replay.value)
        #expect(tracker.waitingCount == 1)
        tracker.sendEnded(write, mayHaveReachedServer: false)
        let token = try #require(await second.value)
        #expect(tracker.mayStore(token))
    }

    @Test func aReadTheWriteDoesNotChangeNeitherWaitsNorIsWaitedFor() async throws {
        let tracker = Self.tracker()
        #expect(await tracker.sendBegins(Self.entry("b"), waits: true))
        let token = try #require(await tracker.exchangeBegins(url: Self.other, storedNote: Data()))
        #expect(tracker.mayStore(token))
        #expect(await tracker.sendBegins(Self.entry("c"), waits: true))
    }

    @Test func aFirstAttemptGoesAtOnceAndAFetchInFlightIsNotStored() async throws {
        let tracker = Self.tracker()
        let token = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        let write = Self.entry("b")
        #expect(await tracker.sendBegins(write, waits: false))  // no wait
        #expect(!tracker.mayStore(token))  // the fetch may bring "b" before the queue knows its fate
        tracker.exchangeEnded(token)
        let waiting = Task { await tracker.exchangeBegins(url: Self.notes, storedNote: Data()) }  // a new fetch waits for it
        await Self.until { tracker.waitingCount == 1 }
        tracker.deliveryFinished(write)
        let next = try #require(await waiting.value)
        #expect(tracker.mayStore(next))
    }

    @Test func aWriteThatMayHaveReachedTheServerKeepsItsReadsOutOfTheStoreUntilItLeaves() async throws {
        let tracker = Self.tracker()
        let timedOut = Self.entry("b")
        #expect(await tracker.sendBegins(timedOut, waits: true))
        tracker.sendEnded(timedOut, mayHaveReachedServer: true)
        let during = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))  // no wait: nothing on the wire
        #expect(!tracker.mayStore(during))
        tracker.exchangeEnded(during)
        tracker.queueChanged(.removed(timedOut, reason: .cancelled))
        let after = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        #expect(tracker.mayStore(after))
        tracker.exchangeEnded(after)
        // A send refused or never sent leaves nothing unknown.
        let refused = Self.entry("c")
        #expect(await tracker.sendBegins(refused, waits: true))
        tracker.sendEnded(refused, mayHaveReachedServer: false)
        #expect(tracker.unknownCount == 0)
    }

    @Test func theWriteOnTheWireWhenTheLastLaunchEndedAndWritesAttemptedBeforeAreOfUnknownFate() {
        let onTheWire = Self.entry("on the wire at the kill")
        let attempted = Self.entry("timed out before", attempts: 2)
        let neverSent = Self.entry("saved offline")
        let tracker = SettlementTracker(rules: [appendNote]) { _, _ in }
        // A change published between observing and seeding is applied after the seed.
        tracker.queueChanged(.removed(attempted, reason: .rejected(statusCode: 400)))
        tracker.seed([onTheWire, attempted, neverSent], sendingAtOpen: [onTheWire.id])
        #expect(tracker.unknownCount == 1)  // the rejected one left; the one never sent is known
    }

    @Test func aCancelledWaiterLeavesTheLineAndLetsTheNextGo() async throws {
        let tracker = Self.tracker()
        let fetch = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        let replay = Task { await tracker.sendBegins(Self.entry("b"), waits: true) }
        await Self.until { tracker.waitingCount == 1 }
        let second = Task { await tracker.exchangeBegins(url: Self.notes, storedNote: Data()) }
        await Self.until { tracker.waitingCount == 2 }
        replay.cancel()
        #expect(await replay.value == false)
        #expect(try #require(await second.value) != fetch)  // admitted beside the first fetch
        #expect(tracker.waitingCount == 0)
    }

    @Test func anEditReplacingOneOfUnknownFateIsOfUnknownFateToo() async throws {
        let tracker = Self.tracker()
        let first = QueueEntry(CreateNote("v1", coalescingKey: "draft"))
        let second = QueueEntry(CreateNote("v2", coalescingKey: "draft"))
        #expect(await tracker.sendBegins(first, waits: true))
        tracker.sendEnded(first, mayHaveReachedServer: true)
        tracker.queueChanged(.stored(second, replacing: first.id))
        #expect(tracker.unknownCount == 1)
        tracker.queueChanged(.removed(second, reason: .cancelled))
        #expect(tracker.unknownCount == 0)
    }

    /// A turn handed over between the waiter's decision to wait and its suspension is kept for
    /// its ticket (found by review: the waiter joined the line in a second lock step, and a release
    /// in between admitted it and resumed nobody). Many rounds, each a race on real threads.
    @Test func aTurnHandedOverAsTheWaiterSuspendsIsNeverLost() async throws {
        for _ in 0..<2_000 {
            let tracker = Self.tracker()
            let token = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
            let replay = Task.detached { await tracker.sendBegins(Self.entry("b"), waits: true) }
            await Task.detached { tracker.exchangeEnded(token) }.value
            #expect(await replay.value)  // a lost turn would hang here, until the time limit
        }
    }

    @Test func aReplayWaitsForAFetchAheadOfItAtMostItsPatienceThenGoesAndTheFetchIsNotStored() async throws {
        let clock = ManualClock()
        let deadlines = DeadlineTimer(time: TimeSource(clock))
        defer { deadlines.shutdown() }
        let tracker = SettlementTracker(rules: [appendNote], deadlines: deadlines, replayPatience: .seconds(2)) { _, _ in }
        tracker.seed([], sendingAtOpen: [])
        let fetch = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))  // a slow GET
        let replay = Task { await tracker.sendBegins(Self.entry("b"), waits: true) }
        await Self.until { tracker.waitingCount == 1 }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(2))
        #expect(await replay.value)  // out of patience: it goes
        #expect(!tracker.mayStore(fetch))  // and the fetch it overlapped is not stored
    }

    @Test func aWriteThatLeavesTheQueueWhileOnTheWireIsNotOfUnknownFateAfterwards() async throws {
        let tracker = Self.tracker()
        let write = Self.entry("b")
        #expect(await tracker.sendBegins(write, waits: true))
        tracker.queueChanged(.removed(write, reason: .cancelled))  // cancelled, dead-lettered, superseded…
        tracker.sendEnded(write, mayHaveReachedServer: true)  // told once the outcome is applied
        #expect(tracker.unknownCount == 0)
        let token = try #require(await tracker.exchangeBegins(url: Self.notes, storedNote: Data()))
        #expect(tracker.mayStore(token))
    }

    @Test func aNoteKeepsEachWriteOnceAndTheNewestAtMostLimit() {
        var note = Data()
        let first = Self.entry("a")
        note = SettlingNote.adding(first, to: note)
        note = SettlingNote.adding(first, to: note)
        #expect(SettlingNote.entries(note).map(\.id) == [first.id])
        for number in 0..<(SettlingNote.limit + 5) { note = SettlingNote.adding(Self.entry("n\(number)"), to: note) }
        let kept = SettlingNote.entries(note)
        #expect(kept.count == SettlingNote.limit && kept.last?.body == Data("n\(SettlingNote.limit + 4)".utf8))
        #expect(SettlingNote.entries(Data("not json".utf8)).isEmpty)
    }

    // MARK: Through the stack

    /// What the folders of `h` hold now, copied as a process killed at this moment would leave
    /// them (after the cache's writes in flight, which a kill could also lose: then the older file).
    static func disk(of h: OfflineFirstHarness) async throws -> TemporaryDirectory {
        await h.cache.waitForWrites()
        let copy = TemporaryDirectory()
        try FileManager.default.copyItem(at: h.directory.url, to: copy.url)
        return copy
    }

    /// `h`'s disk after "b" was delivered, with its queue file put back: a kill before the
    /// delivered file's deletion reached the disk.
    static func diskWithDeliveredFileKept(of h: OfflineFirstHarness) async throws -> (disk: TemporaryDirectory, entry: QueueEntry) {
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        let queued = try #require(await h.queue.items.first)
        let name = "queue/\(queued.id.uuidString).json"
        let file = try Data(contentsOf: h.directory.url.appendingPathComponent(name))
        await h.monitor.setConnected(true)
        _ = await h.queue.flush()
        let disk = try await disk(of: h)
        try file.write(to: disk.url.appendingPathComponent(name))
        return (disk, queued)
    }

    /// The stack a relaunch opens on `folder` (its `cache` and `queue` folders).
    static func relaunch(
        on folder: TemporaryDirectory, origin: NotesOrigin, clock: ManualClock, connected: Bool
    ) throws -> (queue: OfflineQueueEngine, client: OfflineFirstClient) {
        let monitor = ManualReachabilityMonitor(isConnected: connected)
        let cache = try DiskResponseCache(directory: folder.url.appendingPathComponent("cache"), maxBytes: 1 << 20)
        let store = try DiskQueueStore(directory: folder.url.appendingPathComponent("queue"))
        let engine = AsyncRequestEngine(session: origin, clock: clock)
        let queue = OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: store, clock: clock)
        let reads = CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor, clock: clock)
        return (queue, OfflineFirstClient(reads: reads, queue: queue, optimisticUpdates: [appendNote], invalidations: [], startsQueue: false))
    }

    /// The first snapshot of a live read, and a one-shot snapshot, of the relaunched stack.
    static func screens(_ client: OfflineFirstClient) async throws -> (live: [String]?, oneShot: [String]?) {
        let reader = SnapshotReader(client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        let first = await reader.waitFor { _ in true }
        await reader.cancel()
        let shot = try await client.snapshot(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        return (Notes.decode(first.data), Notes.decode(shot.data))
    }

    @Test func aDeliveredWriteIsInTheStoredReadsNoteBeforeItsFileGoesAndARelaunchShowsItOnce() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)  // ["a"] stored
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        await h.monitor.setConnected(true)
        let report = await h.queue.flush()
        #expect(report.delivered.count == 1 && h.origin.notes == ["a", "b"])
        await h.cache.waitForWrites()
        // The stored list lacks "b" and says so; the queue's file is gone already.
        let stored = try #require(h.reads.storedResponse(for: NotesList(), staleTime: .http))
        #expect(Notes.decode(stored.data) == ["a"] && stored.isStale)
        #expect(SettlingNote.entries(stored.note).map(\.body) == [Data("b".utf8)])
        let queueFolder = h.directory.url.appendingPathComponent("queue").path
        #expect(try FileManager.default.contentsOfDirectory(atPath: queueFolder).filter { $0.hasSuffix(".json") }.isEmpty)
        // Killed here, before the list was refetched: the next launch, offline, shows "b" once.
        let disk = try await Self.disk(of: h)  // kept until the end: it deletes its folder when released
        let relaunched = try Self.relaunch(on: disk, origin: h.origin, clock: h.clock, connected: false)
        let screens = try await Self.screens(relaunched.client)
        #expect(screens.live == ["a", "b"] && screens.oneShot == ["a", "b"])
    }

    @Test func aWriteWhoseFileOutlivedItsDeliveryIsShownOnceAfterARelaunchAndSentAgain() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let (disk, _) = try await Self.diskWithDeliveredFileKept(of: h)
        let relaunched = try Self.relaunch(on: disk, origin: h.origin, clock: h.clock, connected: false)
        #expect(await relaunched.queue.pendingCount() == 1)
        let screens = try await Self.screens(relaunched.client)
        #expect(screens.live == ["a", "b"] && screens.oneShot == ["a", "b"])  // once, as settling
        // At least once: it is sent again, with its key, and the server takes it once.
        _ = await relaunched.queue.flush(.ignoringReachability)
        #expect(h.origin.notes == ["a", "b"] && h.origin.writes == 2)
    }

    @Test func aFetchWaitsForTheReplayOfAWriteOfItsReadAndIsThenStoredWithIt() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        await h.monitor.setConnected(true)
        h.origin.holdWrites(true)
        let pass = Task { await h.queue.flush() }
        await h.origin.waitForHeldWrites(1)  // "b" is on the wire: the server may take it at any moment
        let fetch = Task { try await h.reads.response(for: NotesList(), mode: .always, staleTime: .http) }
        await Self.until { h.client.settlement.waitingCount == 1 }
        #expect(h.origin.reads == 1)  // the fetch has not gone out
        h.origin.holdWrites(false)
        h.origin.releaseWrites()
        _ = await pass.value
        let fetched = try await fetch.value
        await h.cache.waitForWrites()
        // It went out once "b" was delivered and recorded: it holds "b", and is stored, with no note.
        let stored = try #require(h.reads.storedResponse(for: NotesList(), staleTime: .http))
        #expect(Notes.decode(fetched.data) == ["a", "b"] && Notes.decode(stored.data) == ["a", "b"] && stored.note.isEmpty)
    }

    @Test func aFetchInFlightWhenAnEnqueueSendsAtOnceIsAnsweredButNotStored() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        h.origin.holdReads(true)
        let fetch = Task { try await h.reads.response(for: NotesList(), mode: .always, staleTime: .http) }
        await h.origin.waitForHeldReads(1)  // the fetch read the list (["a"]) and waits to answer
        #expect(try await h.client.mutate(CreateNote("b")) == .sent(statusCode: 201))  // at once, no wait
        h.origin.holdReads(false)
        h.origin.releaseReads()
        let fetched = try await fetch.value
        await h.cache.waitForWrites()
        #expect(Notes.decode(fetched.data) == ["a"])
        // Not stored (it landed after "b" was recorded, and would have replaced the note): the
        // stored list carries "b" in its note.
        let stored = try #require(h.reads.storedResponse(for: NotesList(), staleTime: .http))
        #expect(Notes.decode(stored.data) == ["a"] && SettlingNote.entries(stored.note).count == 1)
    }

    @Test func readsOfWritesAPreviousProcessMayHaveSentAreNotStoredUntilTheyLeave() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        let queued = try #require(await h.queue.items.first)
        // The process sent "b" and was killed before it heard back: the server has it, the queue too.
        var post = URLRequest(url: NotesList().url)
        post.httpMethod = "POST"
        post.httpBody = Data("b".utf8)
        post.setValue(queued.idempotencyKey, forHTTPHeaderField: "Idempotency-Key")
        await h.store.noteSending([queued.id])  // as the replay notes the entry it sends
        _ = try await h.origin.data(for: post)
        let disk = try await Self.disk(of: h)
        do {
            let relaunched = try Self.relaunch(on: disk, origin: h.origin, clock: h.clock, connected: true)
            let fetched = try await relaunched.client.reads.response(for: NotesList(), mode: .always, staleTime: .http)
            #expect(Notes.decode(fetched.data) == ["a", "b"])  // holds "b", which is still queued
            await relaunched.client.reads.cache.waitForWrites()
            let stored = try #require(relaunched.client.reads.storedResponse(for: NotesList(), staleTime: .http))
            #expect(Notes.decode(stored.data) == ["a"])  // so it was not stored
        }
        // Killed again: the launch after it, offline, shows "b" once.
        let copy = try Self.copy(disk)
        let again = try Self.relaunch(on: copy, origin: h.origin, clock: h.clock, connected: false)
        let screens = try await Self.screens(again.client)
        #expect(screens.live == ["a", "b"] && screens.oneShot == ["a", "b"])
    }

    @Test func aWriteDeadLetteredAfterA5xxLeavesItsReadsStorableAgain() async throws {
        let h = try OfflineFirstHarness(
            notes: ["a"], configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), maxAttempts: 1))
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        await h.monitor.setConnected(true)
        h.origin.rejectWrites(with: 500)  // may have been applied: of unknown fate…
        _ = await h.queue.flush()
        #expect(await h.queue.pendingCount() == 0)  // …until it leaves the queue, dead-lettered
        #expect(h.client.settlement.unknownCount == 0)
        await h.cache.waitForWrites()
        let before = h.cache.statistics.stored
        _ = try await h.reads.response(for: NotesList(), mode: .always, staleTime: .http)
        await h.cache.waitForWrites()
        #expect(h.cache.statistics.stored == before + 1)  // the list is stored again
    }

    /// A replay cancelled mid-send (a drain budget, `stop()`) counts no attempt, but the server may
    /// have taken it: the queue keeps it in its note of possibly sent entries, so the launch after
    /// a kill, even with another entry on the wire then, does not store a read that may hold it.
    @Test func aReplayCancelledMidSendStaysPossiblySentAcrossARelaunch() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        await h.monitor.setConnected(true)
        h.origin.holdWrites(true)
        let pass = Task { await h.queue.flush() }
        await h.origin.waitForHeldWrites(1)  // "b" on the wire
        pass.cancel()
        _ = await pass.value
        h.origin.releaseWrites()  // the server takes "b" all the same
        await Self.until { h.origin.notes == ["a", "b"] }
        #expect(await h.queue.items.first?.attempts == 0)
        // Another entry goes next and is on the wire at the kill.
        try await h.queue.enqueue(OtherWrite(), sending: .onNextDrain)
        let next = Task { await h.queue.flush() }
        await h.origin.waitForHeldWrites(1)
        let disk = try await Self.disk(of: h)
        do {
            let relaunched = try Self.relaunch(on: disk, origin: h.origin, clock: h.clock, connected: true)
            _ = try await relaunched.client.reads.response(for: NotesList(), mode: .always, staleTime: .http)  // holds "b"
            await relaunched.client.reads.cache.waitForWrites()
        }
        let copy = try Self.copy(disk)
        let again = try Self.relaunch(on: copy, origin: h.origin, clock: h.clock, connected: false)
        let screens = try await Self.screens(again.client)
        #expect(screens.live == ["a", "b"] && screens.oneShot == ["a", "b"])
        h.origin.holdWrites(false)
        h.origin.releaseWrites()
        next.cancel()
        _ = await next.value
    }

    /// A write whose file outlived its delivery and that the stored read's note records is known
    /// delivered: not overlaid as pending once a fetch lands, before the queue sends it again.
    @Test func aNotedWriteStillQueuedIsNotShownTwiceOnceAFetchLands() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let (disk, queued) = try await Self.diskWithDeliveredFileKept(of: h)
        // Relaunched online; the queue has not sent "b" again (not started).
        let relaunched = try Self.relaunch(on: disk, origin: h.origin, clock: h.clock, connected: true)
        let reader = SnapshotReader(relaunched.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        let fetched = await reader.waitFor { $0.source == .network }
        await reader.cancel()
        #expect(Notes.decode(fetched.data) == ["a", "b"])
        let shot = try await relaunched.client.snapshot(for: NotesList(), mode: .always, staleTime: .http)
        #expect(Notes.decode(shot.data) == ["a", "b"])
        // And no list is stored while it is queued: the stored one keeps the note.
        await relaunched.client.reads.cache.waitForWrites()
        let stored = try #require(relaunched.client.reads.storedResponse(for: NotesList(), staleTime: .http))
        #expect(Notes.decode(stored.data) == ["a"] && SettlingNote.entries(stored.note).map(\.id) == [queued.id])
    }

    /// A delivery's recording is disk I/O that always ends: a cancelled caller (a drain budget)
    /// still waits for it, rather than count the unfinished write as failed and drop the read.
    @Test func aCancelledRecordingStillWaitsForItsWriteAndKeepsTheRead() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        let entry = QueueEntry(CreateNote("b"))
        let recording = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await h.reads.annotateStored(where: { $0.path == "/notes" }) { SettlingNote.adding(entry, to: $0) }
        }
        #expect(await recording.value == 0)  // none removed
        let stored = try #require(h.reads.storedResponse(for: NotesList(), staleTime: .http))
        #expect(SettlingNote.entries(stored.note).map(\.id) == [entry.id])
    }

    /// A client released (a user switch making a new one) leaves nothing installed on the engines.
    @Test func aReleasedClientLetsGoOfItsEngines() async throws {
        let directory = TemporaryDirectory()
        let monitor = ManualReachabilityMonitor(isConnected: true)
        let engine = AsyncRequestEngine(session: NotesOrigin(notes: ["a"]))
        let queue = OfflineQueueEngine(
            requestEngine: engine, reachabilityMonitor: monitor, store: try DiskQueueStore(directory: directory.url.appendingPathComponent("queue")))
        let reads = CachedRequestEngine(
            requestEngine: engine, cache: try DiskResponseCache(directory: directory.url.appendingPathComponent("cache"), maxBytes: 1 << 20),
            reachabilityMonitor: monitor)
        weak var released: SettlementTracker?
        do {
            let client = OfflineFirstClient(reads: reads, queue: queue, optimisticUpdates: [appendNote])
            released = client.settlement
            _ = try await client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        }
        await Self.until { released == nil }  // neither engine keeps it (its listener task ends first)
        let stored = try await reads.response(for: NotesList(), mode: .always, staleTime: .http)
        #expect(Notes.decode(stored.data) == ["a"])
    }

    static func copy(_ folder: TemporaryDirectory) throws -> TemporaryDirectory {
        let copy = TemporaryDirectory()
        try FileManager.default.copyItem(at: folder.url, to: copy.url)
        return copy
    }
}
