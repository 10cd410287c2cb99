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

/// `Configuration.maxConcurrentDeliveries` > 1: a pass keeps up to N entries in flight, claimed in
/// priority-then-FIFO order, one per ordering key, and settles each as its answer comes.
@Suite struct ConcurrentDeliveryTests {
    static func configuration(_ limit: Int) -> OfflineQueueEngine.Configuration {
        .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), maxConcurrentDeliveries: limit)
    }

    /// Queues `mutations` while offline (nothing is sent), in this order.
    static func queue(_ mutations: [Mutation], in h: QueueHarness) async throws -> [UUID] {
        var ids: [UUID] = []
        for mutation in mutations { ids.append(try #require(try await h.engine.enqueue(mutation).queuedID)) }
        #expect(h.session.callCount == 0)
        return ids
    }

    /// Lets other tasks run, so a pass that would claim more than it should has the chance to.
    static func settle() async {
        for _ in 0..<200 { await Task.yield() }
    }

    static func keyed(_ path: String, ordering: String? = nil, coalescing: String? = nil, priority: QueuePriority = .normal) -> Mutation {
        var mutation = Mutation(path, priority: priority)
        mutation.orderingKey = ordering
        mutation.coalescingKey = coalescing
        return mutation
    }

    @Test func upToNEntriesAreInFlightAtOnceAndTheRestGoAsSlotsFree() async throws {
        let h = try QueueHarness([.held(.status(201))], connected: false, configuration: Self.configuration(4))
        _ = try await Self.queue((1...6).map { Mutation("/n\($0)") }, in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(4)
        await Self.settle()
        #expect(h.session.callCount == 4)  // the fifth waits for a free slot
        #expect(Set(h.sentPaths) == ["/n1", "/n2", "/n3", "/n4"])  // the first four in line
        h.session.releaseHeld()
        await h.session.waitForCalls(6)
        h.session.releaseHeld()
        let report = await pass.value
        #expect(report.delivered.count == 6)
        #expect(report.remaining == 0)
        #expect(Set(h.sentPaths) == Set((1...6).map { "/n\($0)" }))
        #expect(h.directory.fileNames.isEmpty)
    }

    @Test func oneEntryPerOrderingKeyIsInFlightAndItsSuccessorWaitsForIt() async throws {
        let h = try QueueHarness([.held(.status(201))], connected: false, configuration: Self.configuration(8))
        _ = try await Self.queue(
            [
                Self.keyed("/a1", ordering: "A"), Self.keyed("/a2", ordering: "A"), Self.keyed("/b1", ordering: "B"),
                Self.keyed("/free"), Self.keyed("/a3", ordering: "A"), Self.keyed("/b2", ordering: "B"),
            ], in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(3)
        await Self.settle()
        #expect(Set(h.sentPaths) == ["/a1", "/b1", "/free"])
        h.session.releaseHeld()
        await h.session.waitForCalls(5)
        await Self.settle()
        #expect(Set(h.sentPaths.dropFirst(3)) == ["/a2", "/b2"])
        h.session.releaseHeld()
        await h.session.waitForCalls(6)
        #expect(h.sentPaths.last == "/a3")
        h.session.releaseHeld()
        let report = await pass.value
        #expect(report.delivered.count == 6)
        // Each key's entries went in the order they were queued.
        #expect(h.sentPaths.filter { $0.hasPrefix("/a") } == ["/a1", "/a2", "/a3"])
        #expect(h.sentPaths.filter { $0.hasPrefix("/b") } == ["/b1", "/b2"])
    }

    @Test func theSlotsGoByPriorityThenFIFO() async throws {
        let h = try QueueHarness([.held(.status(201))], connected: false, configuration: Self.configuration(2))
        _ = try await Self.queue(
            [
                Self.keyed("/normal1"), Self.keyed("/high1", priority: .high), Self.keyed("/critical", priority: .critical),
                Self.keyed("/normal2"),
            ], in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(2)
        await Self.settle()
        #expect(Set(h.sentPaths) == ["/critical", "/high1"])
        h.session.releaseHeld()
        await h.session.waitForCalls(4)
        #expect(Set(h.sentPaths.dropFirst(2)) == ["/normal1", "/normal2"])
        h.session.releaseHeld()
        #expect(await pass.value.delivered.count == 4)
    }

    @Test func aNewerEditReplacesOnlyTheQueuedEditNotTheOneInFlight() async throws {
        let h = try QueueHarness([.held(.status(200))], connected: false, configuration: Self.configuration(4))
        var first = Self.keyed("/doc", coalescing: "doc")
        first.body = Data("v1".utf8)
        _ = try await Self.queue([first, Self.keyed("/other")], in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(2)
        var second = first
        second.body = Data("v2".utf8)
        second.idempotencyKey = UUID().uuidString
        var third = second
        third.body = Data("v3".utf8)
        third.idempotencyKey = UUID().uuidString
        _ = try await h.engine.enqueue(second, sending: .onNextDrain)  // behind v1, which is in flight
        _ = try await h.engine.enqueue(third, sending: .onNextDrain)  // replaces v2
        h.session.releaseHeld()
        await h.session.waitForCalls(3)
        h.session.releaseHeld()
        let report = await pass.value
        #expect(report.remaining == 0)
        let bodies = h.session.requests.filter { $0.url?.path == "/doc" }.map { String(decoding: $0.httpBody ?? Data(), as: UTF8.self) }
        #expect(bodies == ["v1", "v3"])
    }

    @Test func aSendThatFindsNoNetworkStopsTheClaimingAndTheOthersInFlightSettle() async throws {
        // Three in flight, released together: two find no network, one is delivered, in any
        // order. A slot the delivery frees before the pass has seen a failure may be claimed once
        // more (and that send finds no network too); after that, nothing.
        let offline = ScriptedNetworkSession.Step.urlError(.notConnectedToInternet)
        let h = try QueueHarness(
            [.held(offline), .held(offline), .held(.status(201)), offline],
            connected: false, configuration: Self.configuration(3))
        _ = try await Self.queue((1...6).map { Mutation("/n\($0)") }, in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(3)
        h.session.releaseHeld()
        let report = await pass.value
        #expect(report.endedOffline)
        #expect(report.delivered.count == 1)
        #expect(h.session.callCount <= 4)  // the claiming stopped; the queue's other entries wait
        #expect(report.remaining == 5)
        #expect(await h.engine.items.allSatisfy { $0.attempts == 0 })  // no attempt counted
    }

    @Test func cancellingThePassCutsEveryDeliveryInFlightAndKeepsTheEntriesUntouched() async throws {
        let h = try QueueHarness([.hang], connected: false, configuration: Self.configuration(3))
        let ids = try await Self.queue((1...4).map { Mutation("/n\($0)") }, in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        await h.session.waitForCalls(3)
        pass.cancel()
        let report = await pass.value
        #expect(report.wasCancelled)
        #expect(report.results.isEmpty)
        #expect(h.session.callCount == 3)
        #expect(await h.engine.items.map(\.id) == ids)
        #expect(await h.engine.items.allSatisfy { $0.attempts == 0 })
    }

    @Test func failuresAreSettledOneByOneWhileTheOthersDeliver() async throws {
        let h = try QueueHarness([.status(201), .status(503), .status(422), .status(201)], connected: false, configuration: Self.configuration(4))
        _ = try await Self.queue((1...4).map { Mutation("/n\($0)") }, in: h)
        let report = await h.engine.flush(.ignoringReachability)
        #expect(report.delivered.count == 2)
        #expect(report.kept.count == 1)
        #expect(report.failed.count == 1)
        #expect(report.remaining == 1)
        let kept = try #require(await h.engine.items.first)
        #expect(kept.attempts == 1)
        #expect(kept.nextAttemptAt == h.engine.now.addingTimeInterval(10))
    }

    @Test func oneValueCountsAsOneAndTheDefaultIsOne() {
        #expect(OfflineQueueEngine.Configuration().maxConcurrentDeliveries == 1)
        #expect(OfflineQueueEngine.Configuration(maxConcurrentDeliveries: 0).maxConcurrentDeliveries == 1)
        #expect(OfflineQueueEngine.Configuration(maxConcurrentDeliveries: -5).maxConcurrentDeliveries == 1)
    }

    @Test func theDefaultSendsOneAtATimeInStrictOrder() async throws {
        let h = try QueueHarness([.held(.status(201))], connected: false)
        _ = try await Self.queue((1...3).map { Mutation("/n\($0)") }, in: h)
        let pass = Task { await h.engine.flush(.ignoringReachability) }
        for count in 1...3 {
            await h.session.waitForCalls(count)
            await Self.settle()
            #expect(h.session.callCount == count)
            h.session.releaseHeld()
        }
        #expect(await pass.value.delivered.count == 3)
        #expect(h.sentPaths == ["/n1", "/n2", "/n3"])
    }

    /// An engine over `InMemoryQueueStorage` (storage shared as a database is: it counts claim
    /// calls and fails claims on demand) whose sends are held until the test lets them go.
    static func sharedStorageEngine(maxConcurrentDeliveries: Int) -> (OfflineQueueEngine, InMemoryQueueStorage, ScriptedNetworkSession) {
        let storage = InMemoryQueueStorage()
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.status(201))])
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
            store: storage,
            configuration: configuration(maxConcurrentDeliveries),
            clock: clock
        )
        return (engine, storage, session)
    }

    @Test func onSharedStorageThePassClaimsAsManyAsItHasFreeSlotsInOneCall() async throws {
        let (engine, storage, session) = Self.sharedStorageEngine(maxConcurrentDeliveries: 16)
        for index in 1...16 { _ = try await engine.enqueue(Mutation("/n\(index)")) }
        let pass = Task { await engine.flush(.ignoringReachability) }
        await session.waitForCalls(16)
        #expect(storage.claimCalls == 1)  // sixteen claims in one call
        session.releaseHeld()
        let report = await pass.value
        #expect(report.delivered.count == 16)
        // Then one claim per eighth of the slots freed (two deliveries ending here): eight that
        // find nothing left, not one per delivery.
        #expect(storage.claimCalls == 9)
    }

    @Test func aClaimThatFailsEndsThePassWithTheErrorOnceTheDeliveriesInFlightSettle() async throws {
        let (engine, storage, session) = Self.sharedStorageEngine(maxConcurrentDeliveries: 4)
        for index in 1...6 { _ = try await engine.enqueue(Mutation("/n\(index)")) }
        let pass = Task { await engine.flush(.ignoringReachability) }
        await session.waitForCalls(4)
        storage.failNextClaims(1)  // the refill after the first delivery ends
        session.releaseHeld()
        let report = await pass.value
        #expect(report.storageError != nil)
        #expect(report.delivered.count == 4)  // every delivery in flight settled
        #expect(report.remaining == 2)
        #expect(session.callCount == 4)
    }
}
