import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

/// A resolver made of a closure, counting its calls.
struct ClosureResolver: ConflictResolver {
    let calls = Locked<[WriteConflict]>([])
    let answer: @Sendable (WriteConflict) async throws -> ConflictResolution

    init(_ answer: @escaping @Sendable (WriteConflict) async throws -> ConflictResolution) { self.answer = answer }

    func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
        calls.withLock { $0.append(conflict) }
        return try await answer(conflict)
    }
}

/// The conflict table (issue 46), one row at a time, on the scripted network and the manual clock:
/// a write refused with 412 or 428 is stored in conflict, the server's version fetched, the
/// resolver asked in a task of its own, and its answer stored before anything is sent.
@Suite("Conflicts: a write the server refused with 412 or 428 is resolved, not lost")
struct ConflictResolutionTests {
    private let url = URL(string: "https://api.example.test/notes/1")!
    private let serverVersion = ScriptedNetworkSession.Step.respond(status: 200, headers: ["ETag": "\"v2\""], body: Data("server".utf8))

    private func edit(_ body: String, base: EditBase? = EditBase(etag: "\"v1\""), orderingKey: String? = nil) -> QueuedRequest {
        QueuedRequest(method: .put, url: url, body: Data(body.utf8), orderingKey: orderingKey, editBase: base)
    }

    private func harness(_ steps: [ScriptedNetworkSession.Step], resolver: ClosureResolver?, maxAttempts: Int? = nil) throws -> QueueHarness {
        try QueueHarness(
            steps, connected: false,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), maxAttempts: maxAttempts, conflictResolver: resolver))
    }

    private func header(_ name: String, of index: Int, _ h: QueueHarness) -> String? {
        h.session.requests[index].value(forHTTPHeaderField: name)
    }

    private func body(of index: Int, _ h: QueueHarness) -> String? {
        h.session.requests[index].httpBody.map { String(decoding: $0, as: UTF8.self) }
    }

    @Test func withoutAResolverA412IsARejectedWriteAsBefore() async throws {
        let h = try harness([.status(412)], resolver: nil)
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        await h.monitor.setConnected(true)
        let report = await h.engine.flush()
        #expect(report.failed == [id] && report.results.map(\.name) == ["failed(412)"])
        #expect(h.session.callCount == 1 && h.store.entry(id: id) == nil)
    }

    @Test func a412IsStoredInConflictTheServerVersionFetchedAndARebasedWriteSentOnIt() async throws {
        let resolver = ClosureResolver { conflict in
            let server = String(decoding: conflict.serverBody ?? Data(), as: UTF8.self)
            return .rebase(body: Data("\(server)+mine".utf8))
        }
        let h = try harness([.status(412), serverVersion, .ok()], resolver: resolver)
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        let key = try #require(h.store.entry(id: id)?.idempotencyKey)
        await h.monitor.setConnected(true)
        let first = await h.engine.flush()
        #expect(first.kept == [id] && first.delivered.isEmpty)
        await h.engine.resolutionsSettled()
        let stored = try #require(h.store.entry(id: id))
        #expect(stored.conflict == nil && stored.base == EditBase(etag: "\"v2\"") && stored.body == Data("server+mine".utf8))
        #expect(stored.idempotencyKey != key)
        #expect(await h.engine.flush().delivered == [id])

        #expect(h.session.requests.map(\.httpMethod) == ["PUT", "GET", "PUT"])
        #expect(header("If-Match", of: 0, h) == "\"v1\"" && body(of: 0, h) == "mine")
        #expect(header("Cache-Control", of: 1, h) == "no-cache" && header("If-Match", of: 1, h) == nil)
        #expect(header("If-Match", of: 2, h) == "\"v2\"" && body(of: 2, h) == "server+mine")
        #expect(header("Idempotency-Key", of: 2, h) == stored.idempotencyKey)
        let asked = try #require(resolver.calls.withLock { $0.first })
        #expect(asked.statusCode == 412 && asked.serverValidator == EditBase(etag: "\"v2\"") && asked.entry.body == Data("mine".utf8))
    }

    @Test func discardRemovesTheWriteAsAConflictAndTheServerVersionStands() async throws {
        let h = try harness([.status(412), serverVersion], resolver: ClosureResolver { _ in .discard })
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        var changes = h.engine.changes.makeAsyncIterator()
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(h.store.entry(id: id) == nil && h.session.callCount == 2)
        var reason: QueueRemovalReason?
        while reason == nil, let change = await changes.next() {
            if case .removed(let entry, let why) = change, entry.id == id { reason = why }
        }
        #expect(reason == .conflict(statusCode: 412))
    }

    @Test func overwriteAfterA412SendsTheSameBodyUnconditionallyWithANewKey() async throws {
        let h = try harness([.status(412), serverVersion, .ok()], resolver: ClosureResolver { _ in .overwrite })
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(await h.engine.flush().delivered == [id])
        #expect(header("If-Match", of: 2, h) == nil && header("If-Unmodified-Since", of: 2, h) == nil && body(of: 2, h) == "mine")
        #expect(header("Idempotency-Key", of: 2, h) != header("Idempotency-Key", of: 0, h))
    }

    @Test func a428ToAnUnconditionalWriteIsResolvedAndOverwriteGoesOnTheServersVersion() async throws {
        let h = try harness([.status(428), serverVersion, .ok()], resolver: ClosureResolver { _ in .overwrite })
        let id = try #require(try await h.engine.enqueue(edit("mine", base: nil)).queuedID)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(await h.engine.flush().delivered == [id])
        #expect(header("If-Match", of: 0, h) == nil && header("If-Match", of: 2, h) == "\"v2\"")
    }

    @Test func aResolverThatThrowsKeepsTheConflictWithTheFetchedVersionAndIsAskedAgainAfterTheBackoff() async throws {
        struct NotNow: Error {}
        let tries = Locked(0)
        let resolver = ClosureResolver { _ in
            guard
                tries.withLock({ count in
                    count += 1; return count
                }) > 1
            else { throw NotNow() }
            return .rebase(body: Data("merged".utf8))
        }
        let h = try harness([.status(412), serverVersion, .ok()], resolver: resolver)
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        let kept = try #require(h.store.entry(id: id))
        #expect(kept.conflict?.fetched == true && kept.conflict?.serverBody == Data("server".utf8) && kept.attempts == 2)
        #expect(kept.nextAttemptAt != nil)
        // Not due yet: nothing is asked, nothing sent.
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(tries.withLock { $0 } == 1 && h.session.callCount == 2)
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        // Refused once and failed once: the resolved write waits a backoff too.
        h.clock.advance(by: .seconds(10))
        #expect(await h.engine.flush().delivered == [id])
        // The version fetched once is the one the second answer was made on: no second GET.
        #expect(h.session.requests.map(\.httpMethod) == ["PUT", "GET", "PUT"] && body(of: 2, h) == "merged")
    }

    @Test func aFailedFetchKeepsTheConflictUnfetchedForALaterAttempt() async throws {
        let h = try harness([.status(412), .status(503), serverVersion, .ok()], resolver: ClosureResolver { _ in .overwrite })
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(h.store.entry(id: id)?.conflict == QueueConflict(statusCode: 412))
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        h.clock.advance(by: .seconds(10))
        #expect(await h.engine.flush().delivered == [id])
        #expect(h.session.requests.map(\.httpMethod) == ["PUT", "GET", "GET", "PUT"])
    }

    @Test func aSlowResolverHoldsBackOnlyItsOwnOrderingKey() async throws {
        let gate = Gate()
        let resolver = ClosureResolver { _ in
            await gate.wait()
            return .overwrite
        }
        let h = try harness([.status(412), serverVersion, .ok(), .ok(), .ok()], resolver: resolver)
        let conflicted = try #require(try await h.engine.enqueue(edit("mine", orderingKey: "note-1")).queuedID)
        let behind = try #require(try await h.engine.enqueue(QueuedRequest(method: .post, url: url.appendingPathComponent("tags"), orderingKey: "note-1")).queuedID)
        let other = try #require(try await h.engine.enqueue(QueuedRequest(method: .post, url: URL(string: "https://api.example.test/notes/2")!)).queuedID)
        await h.monitor.setConnected(true)
        let first = await h.engine.flush()
        // The other key's write went while the resolver was still thinking; the conflicted
        // write's follower waits in its line.
        #expect(first.delivered == [other] && h.store.entry(id: behind) != nil && h.store.entry(id: conflicted) != nil)
        gate.open()
        await h.engine.resolutionsSettled()
        #expect(await h.engine.flush().delivered == [conflicted, behind])
    }

    @Test func aConflictStoredByAProcessThatDiedIsResolvedByTheNextAndTheStaleBodyNeverGoesAgain() async throws {
        let directory = TemporaryDirectory()
        let session = ScriptedNetworkSession([.status(412), .hang])
        let clock = ManualClock()
        let never = Gate()
        do {
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session, clock: clock),
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: directory.url),
                configuration: .init(
                    conflictResolver: ClosureResolver { _ in
                        await never.wait()
                        return .discard
                    }), clock: clock)
            _ = try await engine.enqueue(edit("mine"), sending: .onNextDrain)
            _ = await engine.flush()
            // The process "dies" while fetching the server's version: only what is on disk counts.
            await engine.close()
        }
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.quarantined.isEmpty)
        let reopened = try #require(store.orderedEntries().first)
        #expect(reopened.conflict == QueueConflict(statusCode: 412) && reopened.body == Data("mine".utf8))
        let next = ScriptedNetworkSession([serverVersion, .ok()])
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: next, clock: clock),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: store,
            configuration: .init(conflictResolver: ClosureResolver { _ in .rebase(body: Data("merged".utf8)) }), clock: clock)
        _ = await engine.flush()
        await engine.resolutionsSettled()
        #expect(await engine.flush().delivered == [reopened.id])
        #expect(next.requests.map(\.httpMethod) == ["GET", "PUT"])
        #expect(next.requests[1].value(forHTTPHeaderField: "If-Match") == "\"v2\"" && next.requests[1].httpBody == Data("merged".utf8))
    }

    @Test func theFirstAttemptsConflictIsQueuedAndResolvedLikeAReplays() async throws {
        let h = try QueueHarness(
            [.status(412), serverVersion, .ok()],
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), conflictResolver: ClosureResolver { _ in .overwrite }))
        let id = try #require(try await h.engine.enqueue(edit("mine")).queuedID)
        #expect(h.store.entry(id: id)?.conflict == QueueConflict(statusCode: 412) && h.store.entry(id: id)?.attempts == 1)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(await h.engine.flush().delivered == [id])
    }

    @Test func aConflictLeftByARunWithAResolverIsRejectedByOneWithout() async throws {
        let h = try harness([], resolver: nil)
        var entry = QueueEntry(edit("mine"))
        entry.conflict = QueueConflict(statusCode: 412)
        try await h.store.save(entry)
        await h.monitor.setConnected(true)
        #expect(await h.engine.flush().results.map(\.name) == ["failed(412)"])
        #expect(h.session.callCount == 0)
    }
}

@Suite("Conflicts: a server that refuses every write does not spin the queue")
struct ConflictLoopTests {
    /// Each round is a 428, a GET and a rebase: the first rebased write goes at once, every later
    /// one waits the backoff (10 s here), so without the clock moving the queue makes two rounds.
    @Test func aServerThatAnswers428ForeverCostsABackoffPerRoundNotATightLoop() async throws {
        var steps: [ScriptedNetworkSession.Step] = []
        for _ in 0..<20 {
            steps.append(.status(428))
            steps.append(.respond(status: 200, headers: ["ETag": "\"v2\""], body: Data("server".utf8)))
        }
        let h = try QueueHarness(
            steps, connected: false,
            configuration: .init(
                retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), conflictResolver: ClosureResolver { _ in .rebase(body: Data("x".utf8)) }))
        let id = try #require(try await h.engine.enqueue(QueuedRequest(method: .put, url: URL(string: "https://api.example.test/notes/1")!, body: Data("mine".utf8))).queuedID)
        await h.monitor.setConnected(true)
        for _ in 0..<3 {
            _ = await h.engine.flush()
            await h.engine.resolutionsSettled()
        }
        #expect(h.session.callCount == 4)  // 428, GET, 428, GET
        let waiting = try #require(h.store.entry(id: id))
        #expect(waiting.attempts == 2 && waiting.nextAttemptAt == h.engine.now.addingTimeInterval(10))
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        #expect(h.session.callCount == 6)
    }

    /// A resolution in progress holds its entry's claim: the store's next backoff end leaves it
    /// out, or a started queue's timer would fire again and again at the same instant for a pass
    /// that finds nothing to claim (the simulation's livelock, before this).
    @Test func anEntryBeingResolvedArmsNoTimer() async throws {
        struct NotNow: Error {}
        let gate = Gate()
        let calls = Locked(0)
        let resolver = ClosureResolver { _ in
            if calls.withLock({ count in
                count += 1; return count
            }) == 1 {
                throw NotNow()
            }
            await gate.wait()
            return .discard
        }
        let h = try QueueHarness(
            [.status(412), .respond(status: 200, headers: ["ETag": "\"v2\""], body: Data())], connected: false,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), conflictResolver: resolver))
        _ = try await h.engine.enqueue(QueuedRequest(method: .put, url: URL(string: "https://api.example.test/notes/1")!, editBase: EditBase(etag: "\"v1\"")))
        await h.monitor.setConnected(true)
        _ = await h.engine.flush()
        await h.engine.resolutionsSettled()
        h.clock.advance(by: .seconds(10))
        _ = await h.engine.flush()  // claims it again: the resolver now waits
        #expect(try await h.store.earliestNextAttempt() == nil)
        gate.open()
        await h.engine.resolutionsSettled()
        #expect(await h.engine.pendingCount() == 0)
    }
}
