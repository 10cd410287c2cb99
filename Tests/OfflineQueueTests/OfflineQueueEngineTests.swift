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

@Suite("OfflineQueueEngine: enqueue, replay outcomes, ordering, limits")
struct OfflineQueueEngineTests {
    // MARK: Fast path

    @Test func connectedEnqueueSendsAtOnceWithTheIdempotencyKeyAndStoresNothing() async throws {
        let h = try QueueHarness([.status(201)])
        var request = Mutation("/comments", body: "hi")
        request.idempotencyKey = "key-1"
        let result = try await h.engine.enqueue(request)
        #expect(result == .sent(statusCode: 201))
        #expect(h.sentKeys == ["key-1"])
        #expect(await h.engine.pendingCount() == 0)
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func noConnectionOnTheFirstAttemptQueuesTheEntry() async throws {
        let h = try QueueHarness([.urlError(.notConnectedToInternet)])
        let result = try await h.engine.enqueue(Mutation("/a"))
        let id = try #require(result.queuedID)
        #expect(h.directory.fileNames == ["\(id.uuidString).json"])
        let entry = try #require(h.store.entry(id: id))
        #expect(entry.attempts == 0)  // the server was not reached
        #expect(entry.nextAttemptAt == nil)
    }

    @Test func aRetryableFailureQueuesWithOneAttemptAndABackoff() async throws {
        let h = try QueueHarness([.status(503)])
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        let entry = try #require(h.store.entry(id: id))
        #expect(entry.attempts == 1)
        #expect(entry.nextAttemptAt == h.engine.now.addingTimeInterval(10))
        #expect(entry.lastError == "HTTP 503 (0 body bytes)")
    }

    @Test func retryAfterOnTheFirstAttemptSetsTheNextAttempt() async throws {
        let h = try QueueHarness([.status(429, headers: ["Retry-After": "120"])])
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        #expect(h.store.entry(id: id)?.nextAttemptAt == h.engine.now.addingTimeInterval(120))
    }

    @Test(arguments: [400, 401, 403, 404, 409, 422, 501])
    func aNonRetryableFailureIsThrownAndNothingIsQueued(status: Int) async throws {
        let h = try QueueHarness([.status(status)])
        let error = await thrownError { try await h.engine.enqueue(Mutation("/a")) }
        #expect((error as? NetworkError)?.statusCode == status)
        #expect(await h.engine.pendingCount() == 0)
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func offlineMonitorSkipsTheFirstAttempt() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        #expect(try await h.engine.enqueue(Mutation("/a")).queuedID != nil)
        #expect(h.session.callCount == 0)
    }

    @Test func aNoConnectionFromASendMarksTheQueueOfflineForLaterEnqueues() async throws {
        let h = try QueueHarness([.urlError(.notConnectedToInternet), .ok()])
        _ = try await h.engine.enqueue(Mutation("/a"))
        _ = try await h.engine.enqueue(Mutation("/b"))
        #expect(h.session.callCount == 1)  // learned: the second was queued without trying
        await h.monitor.setConnected(false)
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.delivered.count == 2)
    }

    @Test func enqueueWithoutAttemptOnlyStores() async throws {
        let h = try QueueHarness([.ok()])
        let raw = QueuedRequest(method: .put, url: URL(string: "https://api.example.test/raw")!, body: Data("x".utf8), idempotencyKey: "raw-key")
        let id = try #require(try await h.engine.enqueue(raw, sending: .onNextDrain).queuedID)
        #expect(h.session.callCount == 0)
        #expect(await h.engine.flush().delivered == [id])
        #expect(h.sentKeys == ["raw-key"])
        #expect(h.session.requests.first?.httpMethod == "PUT")
    }

    @Test func invalidRequestsAreThrownNotQueued() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var bad = Mutation("/a")
        bad.url = URL(string: "ftp://example.test/a")!
        #expect((await thrownError { try await h.engine.enqueue(bad) } as? NetworkError).map { "\($0)" }?.hasPrefix("invalid request") == true)
        #expect(await h.engine.pendingCount() == 0)
    }

    // MARK: Replay outcomes

    @Test func replayOutcomesFollowTheTable() async throws {
        let h = try QueueHarness([.status(200), .status(404), .status(503), .status(408), .status(429), .urlError(.timedOut), .urlError(.cannotConnectToHost)], connected: false)
        var ids: [UUID] = []
        for index in 0..<7 { ids.append(try #require(try await h.engine.enqueue(Mutation("/\(index)")).queuedID)) }
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(
            report.results.map(\.name) == [
                "delivered(200)", "failed(404)", "kept(HTTP 503 (0 body bytes),1)", "kept(HTTP 408 (0 body bytes),1)",
                "kept(HTTP 429 (0 body bytes),1)", "kept(timed out,1)", "kept(transport failure: cannotConnectToHost,1)",
            ])
        #expect(report.remaining == 5)
        #expect(h.store.entry(id: ids[0]) == nil)
        #expect(h.store.entry(id: ids[1]) == nil)
        #expect(h.store.entry(id: ids[2])?.attempts == 1)
    }

    @Test func noConnectionEndsThePassAndLeavesEntriesUntouched() async throws {
        let h = try QueueHarness([.ok(), .urlError(.notConnectedToInternet), .ok()], connected: false)
        for index in 0..<3 { _ = try await h.engine.enqueue(Mutation("/\(index)")) }
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.results.map(\.name) == ["delivered(200)"])
        #expect(report.endedOffline)
        #expect(report.remaining == 2)
        #expect(h.session.callCount == 2)
        #expect(await h.engine.items.allSatisfy { $0.attempts == 0 })
    }

    @Test func replayOrderIsPriorityDescendingThenFIFO() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        let plan: [(String, QueuePriority)] = [("n1", .normal), ("h1", .high), ("c1", .critical), ("n2", .normal), ("h2", .high), ("c2", .critical)]
        for (name, priority) in plan { _ = try await h.engine.enqueue(Mutation("/\(name)", priority: priority)) }
        #expect(await h.engine.items.map(\.url.lastPathComponent) == ["c1", "c2", "h1", "h2", "n1", "n2"])
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        #expect(h.sentPaths == ["/c1", "/c2", "/h1", "/h2", "/n1", "/n2"])
    }

    @Test func everyReplayCarriesTheKeyReadOnceAtEnqueue() async throws {
        let h = try QueueHarness([.status(503), .status(503), .ok()])
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)  // first attempt: 503
        let key = try #require(h.store.entry(id: id)?.idempotencyKey)
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()  // 503 again
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()  // 200
        #expect(h.sentKeys == [key, key, key])
        #expect(await h.engine.pendingCount() == 0)
    }

    @Test func aKeptEntryIsNotSentBeforeItsBackoffEnds() async throws {
        let h = try QueueHarness([.status(503), .ok()])
        _ = try await h.engine.enqueue(Mutation("/a"))
        h.clock.advance(by: .seconds(9))
        #expect(await h.engine.flush().results.isEmpty)
        #expect(h.session.callCount == 1)
        h.clock.advance(by: .seconds(1))
        #expect(await h.engine.flush().delivered.count == 1)
    }

    @Test func expiredEntriesAreRemovedAndNeverSent() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var short = Mutation("/short")
        short.ttl = 60
        let shortID = try #require(try await h.engine.enqueue(short).queuedID)
        _ = try await h.engine.enqueue(Mutation("/long"))
        h.clock.advance(by: .seconds(61))
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.expired == [shortID])
        #expect(h.sentPaths == ["/long"])
    }

    @Test func expiredEntriesAreSweptEvenWhileOffline() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var short = Mutation("/short")
        short.ttl = 1
        _ = try await h.engine.enqueue(short)
        h.clock.advance(by: .seconds(2))
        let report = await h.engine.flush()
        #expect(report.expired.count == 1)
        #expect(report.endedOffline)
        #expect(h.session.callCount == 0)
    }

    @Test func maxAttemptsMovesAnEntryToTheDeadLetterFolder() async throws {
        let h = try QueueHarness([.status(500)], configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 1), maxAttempts: 3))
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)  // attempt 1
        h.clock.advance(by: .seconds(1))
        #expect(await h.engine.flush().results.map(\.name) == ["kept(HTTP 500 (0 body bytes),2)"])
        h.clock.advance(by: .seconds(1))
        #expect(await h.engine.flush().results.map(\.name) == ["dead(3)"])
        #expect(await h.engine.pendingCount() == 0)
        let dead = h.store.deadLetters()
        #expect(dead.map(\.id) == [id])
        #expect(dead.first?.attempts == 3)
        #expect(dead.first?.lastError == "HTTP 500 (0 body bytes)")
    }

    /// The first entry of an ordering key uses its last attempt and goes to the dead letters: the
    /// next of its key goes in the same pass. (Counted as kept, it waited for another trigger, with
    /// no backoff of its own to set the timer.)
    @Test func whenTheFirstOfAKeyIsDeadLetteredTheNextGoesInTheSamePass() async throws {
        let h = try QueueHarness([.status(500), .status(201)], connected: false, configuration: .init(maxAttempts: 1))
        var first = Mutation("/first")
        first.orderingKey = "k"
        var next = Mutation("/next")
        next.orderingKey = "k"
        _ = try await h.engine.enqueue(first)
        _ = try await h.engine.enqueue(next)
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.results.map(\.name) == ["dead(1)", "delivered(201)"])
        #expect(await h.engine.pendingCount() == 0)
    }

    // MARK: Concurrency and limits

    @Test func overlappingFlushesNeverSendTheSameEntryTwiceAtOnce() async throws {
        let h = try QueueHarness([.held(.ok())], connected: false)
        _ = try await h.engine.enqueue(Mutation("/once"))
        await h.monitor.setConnected(true)
        async let first = h.engine.flush()
        async let second = h.engine.flush()
        await h.session.waitForCalls(1)
        h.session.releaseHeld()
        let reports = await [first, second]
        #expect(h.session.callCount == 1)
        #expect(reports.flatMap(\.delivered).count == 1)
    }

    @Test func aFlushCancelledWhileAnotherPassRunsReturnsAtOnceWithoutSending() async throws {
        let h = try QueueHarness([.held(.ok())], connected: false)
        _ = try await h.engine.enqueue(Mutation("/once"))
        await h.monitor.setConnected(true)
        let first = Task { await h.engine.flush() }
        await h.session.waitForCalls(1)  // the first pass holds its send
        let second = Task { await h.engine.flush() }
        second.cancel()
        // Returns while the first pass is still held: a wait for the pass would hang here.
        let cancelled = await second.value
        #expect(cancelled.wasCancelled)
        #expect(cancelled.results.isEmpty && cancelled.remaining == 1)
        h.session.releaseHeld()
        #expect(await first.value.delivered.count == 1)
        #expect(h.session.callCount == 1)
    }

    @Test func maxQueueSizeHoldsUnderOneHundredConcurrentEnqueues() async throws {
        let h = try QueueHarness([.ok()], connected: false, maxQueueSize: 10)
        let engine = h.engine
        let outcomes = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<100 {
                group.addTask {
                    do {
                        _ = try await engine.enqueue(Mutation("/\(index)"))
                        return true
                    } catch {
                        return false
                    }
                }
            }
            return await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(outcomes.filter { $0 }.count == 10)
        #expect(await h.engine.pendingCount() == 10)
        #expect(h.directory.fileNames.count == 10)
        let error = await thrownError { try await h.engine.enqueue(Mutation("/more")) }
        #expect(error as? OfflineQueueError == .full)
    }

    // MARK: Ordering and coalescing keys

    @Test func anOrderingKeyKeepsEnqueueOrderOverPriority() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var first = Mutation("/doc/create", priority: .normal)
        first.orderingKey = "doc-1"
        var second = Mutation("/doc/edit", priority: .critical)
        second.orderingKey = "doc-1"
        _ = try await h.engine.enqueue(first)
        _ = try await h.engine.enqueue(second)
        _ = try await h.engine.enqueue(Mutation("/other", priority: .high))
        await h.monitor.setConnected(true)
        #expect(await h.engine.flush().delivered.count == 3)
        #expect(h.sentPaths == ["/other", "/doc/create", "/doc/edit"])
    }

    @Test func aBlockedHeadHoldsBackOnlyItsOwnFollowers() async throws {
        let h = try QueueHarness([.status(503), .ok()], connected: false)
        var head = Mutation("/a/1")
        head.orderingKey = "a"
        var follower = Mutation("/a/2")
        follower.orderingKey = "a"
        _ = try await h.engine.enqueue(head)
        _ = try await h.engine.enqueue(follower)
        _ = try await h.engine.enqueue(Mutation("/b/1"))
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(h.sentPaths == ["/a/1", "/b/1"])  // /a/2 waits behind its failing head
        #expect(report.remaining == 2)
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()
        #expect(h.sentPaths == ["/a/1", "/b/1", "/a/1", "/a/2"])
    }

    @Test func anEnqueueWithAPendingOrderingKeyIsQueuedBehindIt() async throws {
        let h = try QueueHarness([.status(503), .ok()])
        var head = Mutation("/a/1")
        head.orderingKey = "a"
        _ = try await h.engine.enqueue(head)  // 503: queued with backoff
        var next = Mutation("/a/2")
        next.orderingKey = "a"
        #expect(try await h.engine.enqueue(next).queuedID != nil)
        #expect(h.session.callCount == 1)  // not sent ahead of its head
    }

    @Test func aNewerEntryWithTheSameCoalescingKeyReplacesThePendingOneInPlace() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var v1 = Mutation("/profile", body: "v1")
        v1.coalescingKey = "profile"
        _ = try await h.engine.enqueue(v1)
        _ = try await h.engine.enqueue(Mutation("/later"))
        var v2 = Mutation("/profile", body: "v2")
        v2.coalescingKey = "profile"
        let v2ID = try #require(try await h.engine.enqueue(v2).queuedID)
        let items = await h.engine.items
        #expect(items.map(\.url.lastPathComponent) == ["profile", "later"])
        #expect(items.first?.id == v2ID)
        #expect(items.first?.body == Data("v2".utf8))
        #expect(h.directory.fileNames.count == 2)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        #expect(h.session.requests.first?.httpBody == Data("v2".utf8))
        #expect(h.session.callCount == 2)
    }

    // MARK: Managing entries

    @Test func cancelClearAndItems() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        let a = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)
        _ = try await h.engine.enqueue(Mutation("/b"))
        #expect(await h.engine.cancel(id: a))
        #expect(!(await h.engine.cancel(id: a)))
        #expect(await h.engine.items.map(\.url.lastPathComponent) == ["b"])
        try await h.engine.clear()
        #expect(await h.engine.pendingCount() == 0)
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func resultsAreStreamedPerEntry() async throws {
        let h = try QueueHarness([.ok(), .status(400)], connected: false)
        let collector = StreamCollector(await h.engine.results)
        _ = try await h.engine.enqueue(Mutation("/a"))
        _ = try await h.engine.enqueue(Mutation("/b"))
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await collector.wait(for: 2)
        #expect(collector.items.map(\.name) == ["delivered(200)", "failed(400)"])
    }

    // MARK: Secrets

    @Test func secretHeadersAreSentOnTheFirstAttemptButNeverStored() async throws {
        let h = try QueueHarness([.urlError(.notConnectedToInternet)])
        var request = Mutation("/a")
        request.headers = ["Authorization": "Bearer secret-token", "Cookie": "session=abc", "X-Trace": "t1"]
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        #expect(h.session.requests.first?.value(forHTTPHeaderField: "Authorization") == "Bearer secret-token")
        let file = try String(contentsOf: h.directory.url.appendingPathComponent("\(id.uuidString).json"), encoding: .utf8)
        #expect(!file.contains("secret-token"))
        #expect(!file.contains("session=abc"))
        #expect(file.contains("X-Trace"))
    }

    @Test(arguments: ["access_token", "api_key", "token", "X-Api-Key", "client_secret", "password"])
    func credentialLikeQueryParametersAreRefused(name: String) async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/a?\(name)=s3cr3t&page=2")!
        let error = await thrownError { try await h.engine.enqueue(request) }
        #expect(error as? OfflineQueueError == .sensitiveQueryParameter(name))
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func ordinaryQueryParametersAreKept() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/a?page=2&sort=desc&monkey=1")!
        #expect(try await h.engine.enqueue(request).queuedID != nil)
    }

    /// `stop()` waits for a pass in flight — also one the backoff timer started, which clears the
    /// timer as it fires (the simulation found a stopped queue still sending for a minute).
    @Test func stopCancelsAndWaitsForAPassTheBackoffTimerStarted() async throws {
        let h = try QueueHarness([.status(503), .held(.ok()), .ok()])
        let id = try #require(try await h.engine.enqueue(Mutation("/a")).queuedID)  // 503: kept 10 s
        await h.engine.start()  // in backoff: the start pass skips it and arms the timer
        await h.clock.waitForSleepers(1)
        h.clock.advance(by: .seconds(10))
        await h.session.waitForCalls(2)  // the timer's pass sends it; the answer is held
        await h.engine.stop()
        // The held attempt was cancelled before stop() returned: uncounted, the entry still queued.
        #expect(await h.engine.pendingCount() == 1)
        #expect(h.store.entry(id: id)?.attempts == 1)
        h.session.releaseHeld()  // too late for the cancelled attempt
        let report = await h.engine.flush()
        #expect(report.delivered == [id] && h.session.callCount == 3)  // sent afresh, once
    }

    /// The backoff timer counts only the first entry of each ordering key; cancelling that entry
    /// must not leave its follower waiting for the cancelled entry's backoff.
    @Test func cancellingTheFirstEntryOfAnOrderingKeyLetsTheNextGoWithoutItsBackoff() async throws {
        let h = try QueueHarness([.status(503), .ok()])
        var first = Mutation("/first")
        first.orderingKey = "doc"
        var second = Mutation("/second")
        second.orderingKey = "doc"
        let head = try #require(try await h.engine.enqueue(first).queuedID)  // 503: kept 10 s
        _ = try await h.engine.enqueue(second)  // behind it: stored, not sent
        let collector = StreamCollector(await h.engine.results)
        await h.engine.start()  // the start pass holds both back and arms the timer for 10 s
        await h.clock.waitForSleepers(1)
        #expect(h.clock.nextDeadline == .init(offset: .seconds(10)) && h.session.callCount == 1)
        #expect(await h.engine.cancel(id: head))
        await collector.wait(for: 1)  // at once: the clock has not moved
        #expect(collector.items.map(\.name) == ["delivered(200)"] && h.sentPaths == ["/first", "/second"])
        #expect(h.clock.now == .init(offset: .zero))
        await h.engine.stop()
    }

    @Test func aStartedQueueThatLearnedItIsOfflineTriesAgainAfterTheRecheckInterval() async throws {
        // The monitor keeps saying "connected" while sends find no network.
        let h = try QueueHarness(
            [.urlError(.notConnectedToInternet), .urlError(.notConnectedToInternet), .ok()],
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), offlineRecheckInterval: .seconds(30)))
        let collector = StreamCollector(await h.engine.results)
        _ = try await h.engine.enqueue(Mutation("/a"))  // noConnection: queued
        await h.engine.start()  // the start pass finds no network again and arms the re-check
        await h.clock.waitForSleepers(1)
        #expect(h.session.callCount == 2)
        #expect(h.clock.nextDeadline == .init(offset: .seconds(30)))
        h.clock.advance(by: .seconds(30))
        await collector.wait(for: 1)
        #expect(collector.items.map(\.name) == ["delivered(200)"])
        await h.engine.stop()
    }
}
