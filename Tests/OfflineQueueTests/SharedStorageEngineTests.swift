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

/// An engine on storage many consumers share (`InMemoryQueueStorage`, leases and all), wired to a
/// scripted session, a manual clock and a manual monitor. Engines of one test share the clock.
struct SharedHarness {
    let storage: InMemoryQueueStorage
    let clock: ManualClock
    let session: ScriptedNetworkSession
    let monitor: ManualReachabilityMonitor
    let engine: OfflineQueueEngine

    init(
        _ steps: [ScriptedNetworkSession.Step],
        storage: InMemoryQueueStorage = InMemoryQueueStorage(),
        clock: ManualClock = ManualClock(),
        connected: Bool = true,
        maxAttempts: Int? = nil,
        backoff: TimeInterval = 10
    ) {
        self.storage = storage
        self.clock = clock
        session = ScriptedNetworkSession(steps)
        monitor = ManualReachabilityMonitor(isConnected: connected)
        engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock),
            reachabilityMonitor: monitor,
            store: storage,
            configuration: .init(
                retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: backoff),
                maxAttempts: maxAttempts,
                claimLease: .seconds(30),
                storagePollInterval: .seconds(5)
            ),
            clock: clock
        )
    }

    /// Another engine (a replica) on the same storage and clock, with its own session.
    func replica(_ steps: [ScriptedNetworkSession.Step]) -> SharedHarness {
        SharedHarness(steps, storage: storage, clock: clock)
    }

    /// Moves the clock a third of the lease (10 s) at a time, once the send's next renewal is due
    /// (its two deadlines, the renewal and the lease's cut, are on the engine's timer), until the
    /// storage has seen `count` renewals in all.
    func passRenewals(through count: Int) async {
        for round in (storage.renewals + 1)...count {
            await waitForRenewalAndCut()
            clock.advance(by: .seconds(10))
            while storage.renewals < round { await Task.yield() }
        }
    }

    /// Waits until the send's next renewal and its lease's cut are both on the engine's timer (a
    /// renewal schedules the next one before it moves the cut).
    func waitForRenewalAndCut() async {
        while engine.deadlines.pendingCount < 2 { await Task.yield() }
    }

    var sentPaths: [String] { session.requests.compactMap { $0.url?.path } }
    var sentKeys: [String?] { session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") } }
}

@Suite("OfflineQueueEngine on shared QueueStorage: claims, leases, the queue's rules across engines")
struct SharedStorageEngineTests {
    @Test func anEntryStoredOfflineIsDeliveredByAClaimAndLeavesTheStorage() async throws {
        let h = SharedHarness([.status(201)], connected: false)
        var request = Mutation("/a")
        request.idempotencyKey = "key-a"
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        #expect(try await h.storage.queuedEntry(id: id)?.idempotencyKey == "key-a")
        #expect(await h.engine.pendingCount() == 1)
        #expect(await h.engine.items.map(\.id) == [id])

        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.delivered == [id])
        #expect(report.remaining == 0)
        #expect(try await h.storage.queuedCount() == 0)
        #expect(h.sentKeys == ["key-a"])
    }

    @Test func everyAttemptCarriesTheSameIdempotencyKeyAndTheBackoffIsKeptInTheStorage() async throws {
        let h = SharedHarness([.status(503), .status(503), .status(201)])
        var request = Mutation("/a")
        request.idempotencyKey = "same"
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        #expect(try await h.storage.queuedEntry(id: id)?.attempts == 1)

        #expect(await h.engine.flush().results.isEmpty)  // not due: its backoff runs
        h.clock.advance(by: .seconds(10))
        let kept = await h.engine.flush()
        #expect(kept.results.map(\.name) == ["kept(HTTP 503 (0 body bytes),2)"])
        let stored = try #require(try await h.storage.queuedEntry(id: id))
        #expect(stored.attempts == 2)
        #expect(stored.nextAttemptAt == h.engine.now.addingTimeInterval(10))

        h.clock.advance(by: .seconds(10))
        #expect(await h.engine.flush().delivered == [id])
        #expect(h.sentKeys == ["same", "same", "same"])
    }

    @Test func twoEnginesOnOneStorageSendAnOrderingKeysEntriesOneAtATimeInOrder() async throws {
        let a = SharedHarness([.held(.status(201)), .status(201), .status(201)])
        let b = a.replica([.status(201), .status(201), .status(201)])
        var ids: [UUID] = []
        for path in ["/1", "/2", "/3"] {
            var request = Mutation(path)
            request.orderingKey = "k"
            ids.append(try #require(try await a.engine.enqueue(request, sending: .onNextDrain).queuedID))
        }
        let first = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)  // /1 is in flight on engine a
        // While /1 is in flight, neither /2 nor /3 may go, from any engine.
        let meanwhile = await b.engine.flush()
        #expect(meanwhile.results.isEmpty)
        #expect(b.session.requests.isEmpty)
        a.session.releaseHeld()
        #expect(await first.value.delivered == ids)
        #expect(a.sentPaths == ["/1", "/2", "/3"])
    }

    @Test func aLongSendRenewsItsLeaseSoNoOtherEngineCanClaimItsEntry() async throws {
        let a = SharedHarness([.held(.status(201))])
        let b = a.replica([.status(201)])
        let id = try #require(try await a.engine.enqueue(Mutation("/slow"), sending: .onNextDrain).queuedID)
        let flush = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)
        // Past the first lease's end in three renewals (every 10 s of a 30 s lease).
        await a.passRenewals(through: 4)
        #expect(a.storage.leaseEnds(of: id) == a.engine.now.addingTimeInterval(30))
        #expect(await b.engine.flush().results.isEmpty)
        #expect(b.session.requests.isEmpty)
        a.session.releaseHeld()
        #expect(await flush.value.delivered == [id])
    }

    @Test func aLeaseThatCannotBeRenewedCancelsItsDeliveryBeforeItEndsAndTheEntryStaysQueued() async throws {
        let a = SharedHarness([.hang])
        let b = a.replica([.status(201)])  // made now: engines on one clock agree on the time
        let id = try #require(try await a.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        a.storage.failRenewals()
        let flush = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)
        // Renewals at 10 s and 20 s fail; at 27 s, a tenth of the lease before its end, the send is cut.
        await a.passRenewals(through: 2)
        await a.waitForRenewalAndCut()
        a.clock.advance(by: .seconds(7))
        let report = await flush.value  // the hanging send was cancelled
        #expect(report.results.isEmpty)
        let entry = try #require(try await a.storage.queuedEntry(id: id))
        #expect(entry.attempts == 0)  // a cut delivery is not an attempt

        #expect(await b.engine.flush().results.isEmpty)  // its lease still runs
        a.clock.advance(by: .seconds(3))
        #expect(await b.engine.flush().delivered == [id])
    }

    @Test func aRenewalThatHangsCutsTheSendBeforeTheLeaseEnds() async throws {
        let a = SharedHarness([.hang])
        let b = a.replica([.status(201)])  // made now: engines on one clock agree on the time
        let id = try #require(try await a.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        a.storage.hangRenewals()
        let flush = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)
        await a.passRenewals(through: 1)  // the renewal hangs from here
        a.clock.advance(by: .seconds(16))
        #expect(a.storage.leaseEnds(of: id) == a.engine.now.addingTimeInterval(4))
        a.clock.advance(by: .seconds(1))  // 27 s: a tenth of the lease before its end
        let report = await flush.value
        #expect(report.results.isEmpty)
        #expect(try await a.storage.queuedEntry(id: id)?.attempts == 0)
        // Nobody sends it before the lease has ended; then another engine does.
        #expect(await b.engine.flush().results.isEmpty)
        a.clock.advance(by: .seconds(3))
        #expect(await b.engine.flush().delivered == [id])
    }

    @Test func aRenewalThatFailsOnceIsTriedAgainAndTheSendGoesOn() async throws {
        let a = SharedHarness([.held(.status(201))])
        let id = try #require(try await a.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        a.storage.failNextRenewals(1)
        let flush = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)
        await a.passRenewals(through: 2)
        #expect(a.storage.leaseEnds(of: id) == a.engine.now.addingTimeInterval(30))
        a.session.releaseHeld()
        #expect(await flush.value.delivered == [id])
    }

    @Test func stoppingDuringASendHandsTheClaimBackAtOnce() async throws {
        let a = SharedHarness([.hang])
        await a.engine.start()
        let id = try #require(try await a.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        await a.session.waitForCalls(1)
        await a.engine.stop()
        #expect(a.storage.leaseEnds(of: id) == nil)  // released, not left leased
        let entry = try #require(try await a.storage.queuedEntry(id: id))
        #expect(entry.attempts == 0)
        let b = a.replica([.status(201)])
        #expect(await b.engine.flush().delivered == [id])
    }

    @Test func aCancelledFlushIsReportedAsCancelledWithWhatRemains() async throws {
        let a = SharedHarness([.hang])
        _ = try await a.engine.enqueue(Mutation("/a"), sending: .onNextDrain)
        let flush = Task { await a.engine.flush() }
        await a.session.waitForCalls(1)
        flush.cancel()
        let report = await flush.value
        #expect(report.wasCancelled)
        #expect(report.storageError == nil)
        #expect(report.remaining == 1)
    }

    @Test func aPassEndedByAStorageErrorIsNotRunAgainUntilABackoffHasPassed() async throws {
        // A folder one engine owns (no polling): its entry is due now, so without a backoff the
        // pass a failing claim ended would start again at once, and again, while no time passes.
        let h = SharedHarness([.status(201)], storage: InMemoryQueueStorage(othersAddWork: false))
        let id = try #require(try await h.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        h.storage.failNextClaims(2)
        await h.engine.start()  // online: one pass, whose claim fails
        await h.clock.waitForSleepers(1)
        #expect(h.storage.claimCalls == 1)
        #expect(h.clock.nextDeadline == h.clock.now.advanced(by: .seconds(10)))  // the retry policy's 10 s
        h.clock.advance(by: .seconds(10))
        await h.clock.waitForSleepers(1)
        #expect(h.storage.claimCalls == 2)  // failed again, and waits again
        #expect(h.session.requests.isEmpty)
        var results = await h.engine.results.makeAsyncIterator()
        h.clock.advance(by: .seconds(10))
        let delivered = await results.next()
        #expect(delivered?.id == id)
        #expect(h.session.requests.count == 1)
        await h.engine.stop()
    }

    @Test func flushRunsAPassAtOnceEvenWhileTheStorageBacksOff() async throws {
        let h = SharedHarness([.status(201)], storage: InMemoryQueueStorage(othersAddWork: false))
        let id = try #require(try await h.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        h.storage.failNextClaims(1)
        await h.engine.start()  // online: one pass, whose claim fails; the timer waits 10 s
        await h.clock.waitForSleepers(1)
        #expect(h.storage.claimCalls == 1)
        let report = await h.engine.flush()  // no time has passed
        #expect(report.delivered == [id])
        #expect(h.storage.claimCalls >= 2)
        await h.engine.stop()
    }

    @Test func anEntryKeptWithNoWaitIsNotSentTwiceInOnePass() async throws {
        let h = SharedHarness([.status(503), .status(201)], backoff: 0)
        let id = try #require(try await h.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        let first = await h.engine.flush()
        #expect(first.kept == [id])
        #expect(h.session.requests.count == 1)
        #expect(await h.engine.flush().delivered == [id])
    }

    @Test func anEnqueueWithAnOrderingKeyIsStoredForAClaimRatherThanSentAtOnce() async throws {
        let a = SharedHarness([.status(201)])
        var keyed = Mutation("/keyed")
        keyed.orderingKey = "k"
        let id = try #require(try await a.engine.enqueue(keyed).queuedID)
        #expect(a.session.requests.isEmpty)
        #expect(try await a.engine.enqueue(Mutation("/free")) == .sent(statusCode: 201))  // no key: at once
        let b = a.replica([.status(201)])
        #expect(await b.engine.flush().delivered == [id])
    }

    @Test func aDeadReplicasClaimIsTakenOverOnceItsLeaseRunsOutAndItsLateSettlementChangesNothing() async throws {
        let b = SharedHarness([.status(201)])
        let id = try #require(try await b.engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        // A replica claims the entry and dies.
        let dead = try #require(try await b.storage.claim(upTo: 1, now: b.engine.now, lease: .seconds(30)).first)
        #expect(await b.engine.flush().results.isEmpty)
        b.clock.advance(by: .seconds(31))
        #expect(await b.engine.flush().delivered == [id])
        await #expect(throws: OfflineQueueError.claimLost(id: id)) {
            try await b.storage.complete(dead, reason: .delivered(statusCode: 201))
        }
    }

    @Test func maxAttemptsMovesTheEntryToTheStoragesDeadLetters() async throws {
        let h = SharedHarness([.status(503), .status(503)], maxAttempts: 2)
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        h.clock.advance(by: .seconds(10))
        let report = await h.engine.flush()
        #expect(report.deadLettered == [id])
        #expect(try await h.storage.queuedCount() == 0)
        #expect(h.storage.deadLetters.map(\.attempts) == [2])
    }

    @Test func aPassSweepsExpiredEntries() async throws {
        let h = SharedHarness([], connected: false)
        var request = Mutation("/a")
        request.ttl = 60
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        h.clock.advance(by: .seconds(61))
        #expect(await h.engine.flush().expired == [id])
        #expect(try await h.storage.queuedCount() == 0)
    }

    @Test func aStartedEngineStartsOnWorkAnotherConsumerAnnounces() async throws {
        let h = SharedHarness([.status(201)])
        await h.engine.start()
        // Another replica adds an entry and notifies.
        let entry = QueueEntry(Mutation("/elsewhere"), enqueuedAt: h.engine.now)
        _ = try await h.storage.add(entry, limit: nil)
        h.storage.announceArrival()
        await h.session.waitForCalls(1)
        #expect(h.sentPaths == ["/elsewhere"])
        await h.engine.stop()
    }

    @Test func aStartedEngineLooksForUnannouncedWorkAtThePollInterval() async throws {
        let h = SharedHarness([.status(201)])
        await h.engine.start()
        let entry = QueueEntry(Mutation("/quiet"), enqueuedAt: h.engine.now)
        _ = try await h.storage.add(entry, limit: nil)  // no announcement
        await h.clock.waitForSleepers(1)
        h.clock.advance(by: .seconds(5))
        await h.session.waitForCalls(1)
        #expect(h.sentPaths == ["/quiet"])
        await h.engine.stop()
    }

    @Test func pendingCountsFollowTheEnginesOwnChanges() async throws {
        let h = SharedHarness([.status(201)], connected: false)
        var counts = h.engine.pendingCounts.makeAsyncIterator()
        #expect(await counts.next() == 0)
        _ = try await h.engine.enqueue(Mutation("/a"))
        #expect(await counts.next() == 1)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        #expect(await counts.next() == 0)
    }

    @Test func cancelAndClearWorkOnTheStorage() async throws {
        let h = SharedHarness([], connected: false)
        let a = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        _ = try await h.engine.enqueue(Mutation("/b"))
        #expect(await h.engine.cancel(id: a))
        #expect(await !h.engine.cancel(id: a))
        #expect(await h.engine.pendingCount() == 1)
        try await h.engine.clear()
        #expect(await h.engine.pendingCount() == 0)
    }

    @Test func aDiskStorePassedAsAnyQueueStorageKeepsTheDiskPath() async throws {
        let directory = TemporaryDirectory()
        let disk = try DiskQueueStore(directory: directory.url)
        let storage: any QueueStorage = disk
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: storage)
        #expect(engine.disk === disk && engine.store as? DiskQueueStore === disk)
        _ = try await engine.enqueue(Mutation("/a"))
        #expect(directory.fileNames.count == 1)
    }
}
