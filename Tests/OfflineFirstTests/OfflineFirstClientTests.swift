import Foundation
import OfflineQueue
import Reachability
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineFirst
@testable import ResponseCache

/// The state table of Sources/OfflineFirst/OfflineFirst.docc/OfflineFirstGuide.md, row by row, on a manual clock, a manual monitor and a
/// fake origin: pending, delivered and refetching, delivered and settled, rejected — online and
/// offline.
@Suite("OfflineFirstClient: reads and queued writes meet", .timeLimit(.minutes(1)))
struct OfflineFirstClientTests {
    // MARK: Pending

    @Test func aNoteSavedOfflineShowsInTheListBeforeMutateReturns() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)  // stored
        await h.monitor.setConnected(false)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { Notes.decode($0.data) == ["a"] }
        let result = try await h.client.mutate(CreateNote("b"))
        #expect(result.queuedID != nil)
        // Yielded before mutate returned (the reader's own task collects it).
        let shown = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(shown.data) == ["a", "b"] && shown.hasPendingWrites && shown.pendingEntryIDs == [result.queuedID])
        #expect(shown.source == .cache)
        #expect(h.origin.writes == 0)
        await reader.cancel()
    }

    @Test func withNothingCachedOfflineTheOverlayAloneIsShownAndTheReadIsPaused() async throws {
        let h = try OfflineFirstHarness(connected: false)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        let first = await reader.waitFor { _ in true }
        #expect(first.data == nil && first.source == .overlayOnly && first.isPaused)
        try await h.client.mutate(CreateNote("offline"))
        let shown = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(shown.data) == ["offline"] && shown.isPaused && shown.hasPendingWrites)
        await reader.cancel()
    }

    @Test func entriesEnqueuedStraightOnTheQueueOverlayTooAndAFreshClientShowsThemFromTheDurableQueue() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.queue.enqueue(CreateNote("straight"))
        // A new client over the same queue and cache (as after a relaunch): the overlay is
        // recomputed from the stored entry; nothing else was kept.
        let fresh = OfflineFirstClient(reads: h.reads, queue: h.queue, optimisticUpdates: [appendNote])
        let snapshot = try await fresh.snapshot(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        #expect(Notes.decode(snapshot.data) == ["a", "straight"] && snapshot.hasPendingWrites)
    }

    @Test func coalescedEditsShowOnlyTheNewestAndOrderedWritesApplyInReplayOrder() async throws {
        let h = try OfflineFirstHarness(connected: false)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        try await h.client.mutate(CreateNote("draft 1", coalescingKey: "draft"))
        try await h.client.mutate(CreateNote("first", orderingKey: "list"))
        try await h.client.mutate(CreateNote("draft 2", coalescingKey: "draft"))
        try await h.client.mutate(CreateNote("second", orderingKey: "list"))
        await reader.waitFor { $0.pendingEntryIDs.count == 3 }
        #expect(reader.notes.last == ["draft 2", "first", "second"])  // the draft keeps its place in line
        #expect(reader.notes.allSatisfy { !$0.contains("draft 1") || !$0.contains("draft 2") })
        await reader.cancel()
    }

    @Test func aThrowingApplySkipsThatOverlayAndIsReported() async throws {
        struct Unreadable: Error {}
        let picky = OptimisticUpdate(
            mutations: { $0.method == "POST" },
            reads: { $0.path == "/notes" },
            apply: { current, pending in
                if pending.body == Data("bad".utf8) { throw Unreadable() }
                return Notes.encode((Notes.decode(current) ?? []) + [String(decoding: pending.body ?? Data(), as: UTF8.self)])
            }
        )
        let h = try OfflineFirstHarness(connected: false, updates: [picky])
        try await h.client.mutate(CreateNote("good"))
        let bad = try #require(try await h.client.mutate(CreateNote("bad")).queuedID)
        try await h.client.mutate(CreateNote("also good"))
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        let shown = await reader.waitFor { _ in true }
        #expect(Notes.decode(shown.data) == ["good", "also good"])
        #expect(shown.overlayFailures.map(\.entryID) == [bad] && shown.pendingEntryIDs.count == 2)
        await reader.cancel()
    }

    // MARK: Delivered: refetching, then settled

    /// The no-flicker rule: once the note was shown, no snapshot may show the list without it —
    /// not while a fetch begun before its replay is in flight (the replay waits for it), not when
    /// it is delivered, not while the refetch is in flight.
    @Test func aDeliveredNoteStaysShownAndItsReplayWaitsForAFetchOfTheListInFlight() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .seconds(0)))
        await reader.waitFor { Notes.decode($0.data) == ["a", "b"] && $0.isPaused }
        h.origin.holdReads(true)
        await h.monitor.setConnected(true)  // the stale list is refetched: a fetch begins, held
        await h.origin.waitForHeldReads(1)
        let pass = Task { await h.queue.flush() }
        while h.client.settlement.waitingCount == 0 { await Task.yield() }  // the replay waits for the fetch
        #expect(h.origin.writes == 0)
        h.origin.holdReads(false)
        h.origin.releaseReads()  // the fetch lands (["a"]): "b" stays overlaid, then goes out
        let delivered = await pass.value
        #expect(delivered.delivered.count == 1)
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching && !$0.hasPendingWrites }
        #expect(Notes.decode(settled.data) == ["a", "b"] && settled.source == .network)
        // Never the list without the note after it was first shown.
        let notes = reader.notes
        let firstShown = try #require(notes.firstIndex(of: ["a", "b"]))
        #expect(notes[firstShown...].allSatisfy { $0 == ["a", "b"] }, "\(notes)")
        await reader.cancel()
    }

    /// The one-shot read's read-your-writes: a stale stored list (shown offline, or at once while
    /// it is revalidated) never hides a note the server already took; a list fetched after the
    /// delivery has it, and settles it.
    @Test func aOneShotReadKeepsADeliveredNoteOnAStaleStoredListUntilAReadGetsAListFromAfterIt() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)  // ["a"] stored
        let sent = try await h.client.mutate(CreateNote("b"))  // online: delivered at once
        #expect(sent == .sent(statusCode: 201) && h.origin.notes == ["a", "b"])
        await h.monitor.setConnected(false)
        let offline = try await h.client.snapshot(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        #expect(Notes.decode(offline.data) == ["a", "b"] && offline.isStale && offline.source == .cache)
        #expect(offline.settlingEntryIDs.count == 1 && !offline.hasPendingWrites)
        await h.monitor.setConnected(true)
        let fetched = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)  // the server's list
        #expect(Notes.decode(fetched.data) == ["a", "b"] && fetched.source == .network && fetched.settlingEntryIDs.isEmpty)
        await h.reads.waitForBackgroundRevalidations()
        let stored = try await h.client.snapshot(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        #expect(Notes.decode(stored.data) == ["a", "b"] && !stored.isStale && stored.settlingEntryIDs.isEmpty)  // settled: applied once, not twice
    }

    @Test func aNoteSentAtOnceOnlineIsShownFromTheMomentItIsOfferedUntilTheRefetch() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { Notes.decode($0.data) == ["a"] && $0.source == .network }
        h.origin.holdReads(true)
        #expect(try await h.client.mutate(CreateNote("b")) == .sent(statusCode: 201))
        let shown = await reader.waitFor { $0.settlingEntryIDs.count == 1 }  // delivered at once: applied until the refetch lands
        #expect(Notes.decode(shown.data) == ["a", "b"] && shown.settlingEntryIDs.count == 1 && shown.isStale)
        await h.origin.waitForHeldReads(1)
        h.origin.holdReads(false)
        h.origin.releaseReads()
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching }
        #expect(Notes.decode(settled.data) == ["a", "b"] && !settled.isStale)
        let notes = reader.notes
        let firstShown = try #require(notes.firstIndex(of: ["a", "b"]))
        #expect(notes[firstShown...].allSatisfy { $0 == ["a", "b"] }, "\(notes)")
        await reader.cancel()
    }

    @Test func aWriteRetryingOnlineStaysShownUntilItIsDelivered() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        h.origin.rejectWrites(with: 503)
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)  // tried at once, kept for a retry
        await reader.waitFor { Notes.decode($0.data) == ["a", "b"] && $0.pendingEntryIDs == [id] }
        h.origin.rejectWrites(with: nil)
        h.clock.advance(by: .seconds(10))
        _ = await h.queue.flush()
        let settled = await reader.waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && !$0.isFetching }
        #expect(Notes.decode(settled.data) == ["a", "b"] && h.origin.notes == ["a", "b"])
        await reader.cancel()
    }

    @Test func aDeliveredWriteWhoseRefetchMustWaitForTheNetworkStaysShownWhileThereadIsPaused() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("b"))
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { $0.hasPendingWrites }
        _ = await h.queue.flush(.ignoringReachability)  // delivered, though the monitor says offline
        let paused = await reader.waitFor { $0.settlingEntryIDs.count == 1 }
        #expect(Notes.decode(paused.data) == ["a", "b"] && paused.isPaused && paused.isStale && !paused.isFetching)
        await h.monitor.setConnected(true)
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.source == .network }
        #expect(Notes.decode(settled.data) == ["a", "b"] && !settled.isPaused && !settled.isStale)
        await reader.cancel()
    }

    /// With the reads as a closure, and as a pattern the cache answers from its index.
    @Test(arguments: [false, true])
    func aDeliveredWriteMarksTheReadsItsInvalidationNamesStaleEvenWithNoScreenShowingThem(byPattern: Bool) async throws {
        let counted =
            byPattern
            ? Invalidation(mutations: { $0.method == "POST" }, readsMatching: [.path("/notes")])
            : Invalidation(mutations: { $0.method == "POST" }, reads: { $0.path == "/notes" })
        let h = try OfflineFirstHarness(notes: ["a"], updates: [], invalidations: [counted])
        await h.reads.cache.pathsIndexed()
        #expect(h.reads.cache.indexesStoredPaths == byPattern)  // built ahead only for patterns
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        #expect(h.origin.reads == 1)
        try await h.client.mutate(CreateNote("b"))  // sent at once
        let after = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        #expect(Notes.decode(after.data) == ["a", "b"] && h.origin.reads == 2)  // fresh for 60 s, yet refetched
    }

    // MARK: Rejected

    /// Over the disk store, and over in-memory storage (`OfflineFirstStorageTests`).
    @Test(arguments: [false, true]) func aRejectedWriteStopsOverlayingAtOnceAndIsReported(inMemory: Bool) async throws {
        let h = try OfflineFirstHarness(notes: ["a"], queueStorage: inMemory ? InMemoryQueueStorage() : nil)
        _ = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        await h.monitor.setConnected(false)
        let id = try #require(try await h.client.mutate(CreateNote("spam")).queuedID)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { Notes.decode($0.data) == ["a", "spam"] }
        h.origin.rejectWrites(with: 422)
        await h.monitor.setConnected(true)
        _ = await h.queue.flush()
        let shown = await reader.waitFor { !$0.rejectedWrites.isEmpty }
        #expect(Notes.decode(shown.data) == ["a"] && !shown.hasPendingWrites)
        #expect(shown.rejectedWrites.map(\.id) == [id] && shown.rejectedWrites.first?.statusCode == 422)
        await reader.cancel()
    }

    @Test(arguments: ["expired", "cancelled", "dead-lettered", "rejected at once"])
    func everyKindOfPermanentFailureRollsBack(kind: String) async throws {
        var configuration = OfflineQueueEngine.Configuration(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10))
        configuration.maxAttempts = 1
        let h = try OfflineFirstHarness(connected: kind == "rejected at once", configuration: configuration)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { _ in true }
        var note = CreateNote("doomed")
        note.ttl = 5
        switch kind {
        case "rejected at once":
            h.origin.rejectWrites(with: 400)
            await #expect(throws: NetworkError.self) { try await h.client.mutate(note) }
        default:
            let id = try #require(try await h.client.mutate(note).queuedID)
            await reader.waitFor { Notes.decode($0.data) == ["doomed"] }
            switch kind {
            case "expired":
                h.clock.advance(by: .seconds(10))
                await h.monitor.setConnected(true)
                _ = await h.queue.flush()
            case "cancelled":
                #expect(await h.queue.cancel(id: id))
            default:
                h.origin.rejectWrites(with: 503)
                await h.monitor.setConnected(true)
                _ = await h.queue.flush()
            }
        }
        let shown = await reader.waitFor { !$0.rejectedWrites.isEmpty }
        #expect(Notes.decode(shown.data) ?? [] == [] && !shown.hasPendingWrites, "\(kind)")
        let expected: String =
            switch kind {
            case "expired": "expired"
            case "cancelled": "cancelled"
            case "dead-lettered": "deadLettered(attempts: 1)"
            default: "rejected(statusCode: Optional(400))"
            }
        #expect("\(shown.rejectedWrites[0].reason)" == expected)
        await reader.cancel()
    }

    // MARK: The queue's replay

    /// Nobody called `queue.start()`: the client starts the replay at its first use, so a write
    /// made offline is delivered on reconnect and a wait for it returns.
    @Test func aForgottenStartDoesNotLeaveAWaitForPendingWritesHanging() async throws {
        let h = try OfflineFirstHarness(notes: ["a"], connected: false, startsQueue: true)
        #expect(await h.queue.isStarted == false)
        try await h.client.mutate(CreateNote("b"))
        #expect(await h.queue.isStarted)
        await h.monitor.setConnected(true)
        try await h.client.waitForPendingWrites()
        #expect(h.origin.notes == ["a", "b"])
        #expect(await h.queue.pendingCount() == 0)
    }

    /// A live read is a first use too; and the start happens once: a queue the app stopped stays
    /// stopped through later reads and writes.
    @Test func theClientStartsItsQueueOnceAndAStoppedQueueStaysStopped() async throws {
        let h = try OfflineFirstHarness(notes: ["a"], connected: false, startsQueue: true)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        _ = await reader.waitFor { $0.isPaused }
        #expect(await h.queue.isStarted)
        await h.queue.stop()
        try await h.client.mutate(CreateNote("b"))
        await h.monitor.setConnected(true)  // a started queue would replay now
        let shot = try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http)
        #expect(Notes.decode(shot.data) == ["a", "b"] && shot.hasPendingWrites)
        #expect(await h.queue.isStarted == false)
        #expect(await h.queue.pendingCount() == 1 && h.origin.notes == ["a"])
        await reader.cancel()
    }

    // MARK: Closing

    /// A user switch: `close()` ends the live reads, stops the queue and frees both folders, so a
    /// new client opens them at once and finds the first one's queued write; the closed client
    /// does nothing more.
    @Test func closeFreesBothFoldersAtOnceForTheNextClient() async throws {
        let h = try OfflineFirstHarness(notes: ["a"], connected: false, startsQueue: true)
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http))
        let id = try #require(try await h.client.mutate(CreateNote("b")).queuedID)
        _ = await reader.waitFor { $0.pendingEntryIDs == [id] }
        await h.client.close()
        #expect(h.client.isClosed && h.cache.isClosed && h.store.isClosed)
        #expect(await h.queue.isStarted == false)
        await reader.waitUntilFinished()
        #expect(await h.monitor.subscriberCount == 0)  // nothing of the client is left running
        await #expect(throws: OfflineQueueError.closed) { try await h.client.mutate(CreateNote("c")) }
        let closedRead = await #expect(throws: NetworkError.self) { try await h.client.snapshot(for: NotesList(), mode: .online, staleTime: .http) }
        guard case .cancelled = closedRead else { Issue.record("a read of a closed client: \(String(describing: closedRead))"); return }
        // The next client, on the same folders, opens at once.
        let store = try DiskQueueStore(directory: h.directory.url.appendingPathComponent("queue"))
        let cache = try DiskResponseCache(directory: h.directory.url.appendingPathComponent("cache"), maxBytes: 1 << 20)
        let engine = AsyncRequestEngine(session: h.origin, clock: h.clock)
        let next = OfflineFirstClient(
            reads: CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: h.monitor, clock: h.clock),
            queue: OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: h.monitor, store: store, clock: h.clock),
            optimisticUpdates: [appendNote]
        )
        await h.monitor.setConnected(true)
        try await next.waitForPendingWrites()
        #expect(h.origin.notes == ["a", "b"])
        await next.close()
    }

    // MARK: Live reads, waits, pending lists

    @Test func cancellingALiveReadEndsItAndMutateNoLongerWaitsForIt() async throws {
        let h = try OfflineFirstHarness(connected: false)
        let stream = h.client.snapshots(for: NotesList(), mode: .offlineFirst, staleTime: .http)
        let consumer = Task {
            var count = 0
            for try await _ in stream { count += 1 }
            return count
        }
        while await h.monitor.subscriberCount == 0, !Task.isCancelled { await Task.yield() }
        consumer.cancel()
        _ = try? await consumer.value
        while await h.monitor.subscriberCount > 0, !Task.isCancelled { await Task.yield() }  // its connectivity listener left
        try await h.client.mutate(CreateNote("after"))  // would wait for the read if it were still registered
    }

    @Test func waitForPendingWritesReturnsWhenEveryWritePendingAtTheCallLeftTheQueue() async throws {
        let h = try OfflineFirstHarness(connected: false)
        try await h.client.mutate(CreateNote("one"))
        try await h.client.mutate(CreateNote("two"))
        let waiting = Task { try await h.client.waitForPendingWrites() }
        await h.monitor.setConnected(true)
        _ = await h.queue.flush()
        try await waiting.value
        #expect(await h.queue.pendingCount() == 0)
        // Nothing pending: returns at once. Cancelled while waiting: throws.
        try await h.client.waitForPendingWrites()
        await h.monitor.setConnected(false)
        try await h.client.mutate(CreateNote("three"))
        let cancelled = Task { try await h.client.waitForPendingWrites() }
        cancelled.cancel()
        await #expect(throws: NetworkError.self) { try await cancelled.value }
    }

    @Test func pendingWritesShowEachEntrysStateAsItChanges() async throws {
        let h = try OfflineFirstHarness(connected: false)
        let lists = Log<[PendingWrite.State]>()
        let watcher = Task { for await list in h.client.pendingWrites { lists.append(list.map(\.state)) } }
        while lists.count == 0, !Task.isCancelled { await Task.yield() }
        #expect(lists.values.last == [])
        let id = try #require(try await h.client.mutate(CreateNote("one")).queuedID)
        while lists.values.last != [.waiting], !Task.isCancelled { await Task.yield() }
        h.origin.rejectWrites(with: 503)
        h.origin.holdWrites(true)
        await h.monitor.setConnected(true)
        let flush = Task { await h.queue.flush() }
        await h.origin.waitForHeldWrites(1)
        while lists.values.last != [.sending], !Task.isCancelled { await Task.yield() }  // held at the server: being sent
        h.origin.releaseWrites()
        _ = await flush.value
        while !Task.isCancelled {
            if case .retrying(let attempts, let next, let error)? = lists.values.last?.first {
                #expect(attempts == 1 && next != nil && error != nil)
                break
            }
            await Task.yield()
        }
        #expect(await h.queue.items.map(\.id) == [id])
        watcher.cancel()
    }

    @Test func aRequestBeingOfferedAtOnceIsPendingAndSendingAndWaitedFor() async throws {
        let h = try OfflineFirstHarness()
        h.origin.holdWrites(true)
        let lists = Log<[PendingWrite.State]>()
        let watcher = Task { for await list in h.client.pendingWrites { lists.append(list.map(\.state)) } }
        let mutation = Task { try await h.client.mutate(CreateNote("now")) }
        await h.origin.waitForHeldWrites(1)
        while lists.values.last != [.sending], !Task.isCancelled { await Task.yield() }
        // Started while the request is in its first attempt: it waits for it.
        let waiting = Task { try await h.client.waitForPendingWrites() }
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.pendingEntryIDs.count == 1 }  // a read begun meanwhile shows it too
        h.origin.holdWrites(false)
        h.origin.releaseWrites()
        #expect(try await mutation.value == .sent(statusCode: 201))
        try await waiting.value
        // And right after a write sent at once, there is nothing left to wait for.
        try await h.client.mutate(CreateNote("then"))
        try await h.client.waitForPendingWrites()
        watcher.cancel()
        await reader.cancel()
    }

    // MARK: Refetch failures and other readers (no flicker)

    @Test func aRefetchAnsweredWithAnErrorStatusOrNoConnectionKeepsTheWriteShown() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        h.origin.failReads(true)
        try await h.client.mutate(CreateNote("b"))  // delivered at once; its refetch fails
        let failed = await reader.waitFor { $0.lastFetchError != nil && !$0.isFetching }
        #expect(Notes.decode(failed.data) == ["a", "b"] && failed.settlingEntryIDs.count == 1 && failed.isStale)
        h.origin.failReads(false)
        await h.monitor.setConnected(false)
        await h.monitor.setConnected(true)  // the next reconnect refetches
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.lastFetchError == nil }
        #expect(Notes.decode(settled.data) == ["a", "b"])
        #expect(reader.notes.drop { $0 != ["a", "b"] }.allSatisfy { $0 == ["a", "b"] }, "\(reader.notes)")
        await reader.cancel()
    }

    @Test func aLiveReadNeverSettlesFromAnExchangeAnotherReaderBeganBeforeTheDelivery() async throws {
        let h = try OfflineFirstHarness(notes: ["a"])
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .online, staleTime: .http))
        await reader.waitFor { $0.source == .network }
        h.origin.holdReads(true)
        // Another screen pulls to refresh: its GET reads the list (["a"]) and is held.
        let refresh = Task { try await h.client.snapshot(for: NotesList(), mode: .always, staleTime: .http) }
        await h.origin.waitForHeldReads(1)
        try await h.client.mutate(CreateNote("b"))  // delivered while that GET is in flight
        await h.origin.waitForHeldReads(2)  // the live read's own refetch: not joined to the held one
        h.origin.holdReads(false)
        h.origin.releaseReads()
        _ = try await refresh.value
        let settled = await reader.waitFor { $0.settlingEntryIDs.isEmpty && !$0.isFetching }
        #expect(Notes.decode(settled.data) == ["a", "b"])
        #expect(reader.notes.drop { $0 != ["a", "b"] }.allSatisfy { $0 == ["a", "b"] }, "\(reader.notes)")
        // The held GET's pre-write list was not stored as fresh: a read now gets the list with the note.
        let now = try await h.reads.response(for: NotesList(), mode: .online, staleTime: .http)
        #expect(Notes.decode(now.data) == ["a", "b"])
        await reader.cancel()
    }

    @Test func aRefetchAnsweredWith503IsAnErrorNotTheList() async throws {
        let h = try OfflineFirstHarness(notes: ["a"], connected: false)
        _ = try? await h.reads.response(for: NotesList(), mode: .always, staleTime: .http)  // stored
        let reader = SnapshotReader(h.client.snapshots(for: NotesList(), mode: .always, staleTime: .http))
        await reader.waitFor { $0.isPaused }
        h.origin.failReadsWith503(true)
        await h.monitor.setConnected(true)
        let failed = await reader.waitFor { $0.lastFetchError != nil }
        #expect(Notes.decode(failed.data) == ["a"] && failed.source == .cache && failed.lastFetchError?.statusCode == 503)
        await reader.cancel()
    }
}
