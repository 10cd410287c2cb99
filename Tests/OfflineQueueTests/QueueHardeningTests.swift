import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
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

/// Edits that race each other, senders that never answer, folders that stop accepting writes.
@Suite("OfflineQueueEngine hardening: coalescing races, hung senders, unwritable folders", .timeLimit(.minutes(1)))
struct QueueHardeningTests {
    private func edit(_ body: String, key: String = "profile") -> Mutation {
        var request = Mutation("/profile", body: body)
        request.coalescingKey = key
        return request
    }

    private func bodies(_ session: ScriptedNetworkSession) -> [String] {
        session.requests.map { String(decoding: $0.httpBody ?? Data(), as: UTF8.self) }
    }

    /// Waits (yielding, no clock) until `condition` holds; the suite's time limit bounds it.
    private func eventually(_ condition: () async -> Bool) async {
        while await !condition() { await Task.yield() }
    }

    // MARK: Item 1: concurrent edits of one coalescing key

    @Test func concurrentEditsOfOneKeyLeaveOneEntryAndAReopenKeepsThatOne() async throws {
        for round in 0..<20 {
            let h = try QueueHarness([.ok()], connected: false)
            let engine = h.engine
            // Each edit notes a tick when it starts and when its enqueue has returned `.queued`.
            let ticks = Locked<(now: Int, started: [String: Int], acknowledged: [String: Int])>((0, [:], [:]))
            await withTaskGroup(of: Void.self) { group in
                for index in 0..<5 {
                    group.addTask {
                        let body = "v\(index)"
                        ticks.withLock {
                            $0.now += 1; $0.started[body] = $0.now
                        }
                        guard (try? await engine.enqueue(edit(body)))?.queuedID != nil else { return }
                        ticks.withLock {
                            $0.now += 1; $0.acknowledged[body] = $0.now
                        }
                    }
                    if index == 2 { await Task.yield() }  // some edits start after others were acknowledged
                }
            }
            let live = await engine.items.filter { $0.coalescingKey == "profile" }
            #expect(live.count == 1, "round \(round): \(live.count) live entries share the key")
            // The survivor was acknowledged, and no edit started after its acknowledgement: an
            // edit that began once another had returned must replace it.
            let seen = ticks.withLock { $0 }
            let survivor = try #require(live.first.flatMap { $0.body }.map { String(decoding: $0, as: UTF8.self) })
            let acknowledgedAt = try #require(seen.acknowledged[survivor], "round \(round): the survivor \(survivor) was never acknowledged")
            let later = seen.started.filter { $0.value > acknowledgedAt && seen.acknowledged[$0.key] != nil }.keys.sorted()
            #expect(later.isEmpty, "round \(round): \(survivor) survived although \(later) started after it was acknowledged")
            h.store.releaseLock()  // as if the process had ended
            let reopened = try DiskQueueStore(directory: h.directory.url)
            #expect(await reopened.load().map(\.body) == live.map(\.body), "round \(round)")
            #expect(reopened.openReport.removedSupersededEntries == 0, "round \(round)")
        }
    }

    @Test func editsOfOneKeyReachTheServerInTheOrderTheyWereMade() async throws {
        // The first edit's send is held; four more edits arrive meanwhile, one after another.
        let h = try QueueHarness([.held(.ok()), .ok()])
        let engine = h.engine
        var tasks: [Task<EnqueueResult?, Never>] = []
        tasks.append(Task { try? await engine.enqueue(edit("v0")) })
        await h.session.waitForCalls(1)
        for index in 1..<5 {
            tasks.append(Task { try? await engine.enqueue(edit("v\(index)")) })
            // It waits in line — or, if nothing made it wait, it overtakes (and the check below fails).
            await eventually { await engine.enqueuesInLine(coalescingKey: "profile") == index + 1 || h.session.callCount > 1 }
        }
        #expect(h.session.callCount == 1)  // nobody overtook the edit in flight
        h.session.releaseHeld()
        for task in tasks { #expect(await task.value == .sent(statusCode: 200)) }
        #expect(bodies(h.session) == ["v0", "v1", "v2", "v3", "v4"])
        #expect(await engine.enqueuesInLine(coalescingKey: "profile") == 0)
    }

    @Test func anEditMadeWhileItsPredecessorIsReplayedReplacesItWhateverTheOutcome() async throws {
        let h = try QueueHarness([.held(.status(503)), .ok()])
        let old = try #require(try await h.engine.enqueue(edit("v1"), sending: .onNextDrain).queuedID)
        let engine = h.engine
        let pass = Task { await engine.flush() }
        await h.session.waitForCalls(1)  // v1 is being sent
        let new = try #require(try await engine.enqueue(edit("v2")).queuedID)
        #expect(new != old)
        // Both files are on disk now; a crash here must keep the newer edit.
        let copy = TemporaryDirectory()
        try FileManager.default.copyItem(at: h.directory.url, to: copy.url)
        let afterCrash = try DiskQueueStore(directory: copy.url)
        #expect(await afterCrash.load().map(\.id) == [new])

        h.session.releaseHeld()  // v1 gets a 503: superseded, so dropped rather than retried later
        // v1 left the queue, so the pass scans again and sends the newer edit at once (until
        // 2026-11-28 it was left for the next trigger, with no backoff to set the timer).
        #expect(await pass.value.delivered == [new])
        #expect(await engine.items.isEmpty)
        h.clock.advance(by: .seconds(3600))
        #expect(await engine.flush().results.isEmpty)
        #expect(bodies(h.session) == ["v1", "v2"])
    }

    // MARK: Item 11: a first attempt that never finishes

    @Test func anEnqueueWhoseFirstAttemptOutlivesItsTimeoutIsStoredAndReturnsQueued() async throws {
        let directory = TemporaryDirectory()
        let clock = ManualClock()
        let sender = StuckSender()
        let store = try DiskQueueStore(directory: directory.url)
        let engine = OfflineQueueEngine(
            requestEngine: sender,
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: clock
        )
        var request = Mutation("/a", body: "x")
        request.timeout = 5
        let enqueue = Task { try await engine.enqueue(request) }
        await sender.waitForCalls(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(5))
        let id = try #require(try await enqueue.value.queuedID)
        let entry = try #require(store.entry(id: id))
        #expect(entry.attempts == 1)
        #expect(entry.lastError == NetworkError.timedOut.description)
        #expect(entry.nextAttemptAt == engine.now.addingTimeInterval(10))
        sender.release()
    }

    // MARK: Item 6: a folder that stops accepting writes

    /// A folder that cannot be created because the file system has no inode left says so
    /// (`ENOSPC`, on the first folder it could not create), not `EACCES`: the app tells the user
    /// to free space, not to fix permissions.
    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func aQueueFolderThatCannotBeCreatedForWantOfInodesIsADiskFullError() throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 1024, inodes: 8))
        defer { mounted.unmount() }
        #expect(mounted.useUpInodes() > 0)
        let support = mountPoint.url.appendingPathComponent("Application Support")
        let failure = OfflineQueueError.storage(operation: "mkdir", path: support.path, errno: ENOSPC)
        #expect(throws: failure) {
            try DiskQueueStore(directory: support.appendingPathComponent("Resilience/OfflineQueue"))
        }
        #expect(failure.isDiskFull)
    }

    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func cancelOnAReadOnlyFolderReturnsFalseAndTheEntryStaysQueued() async throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 1024))
        defer { mounted.unmount() }
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: ScriptedNetworkSession([.ok()])),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
            store: try DiskQueueStore(directory: mountPoint.url.appendingPathComponent("queue"))
        )
        let id = try #require(try await engine.enqueue(Mutation("/a")).queuedID)
        #expect(mounted.remount(readOnly: true))
        #expect(await engine.cancel(id: id) == false)
        #expect(await engine.pendingCount() == 1)
        #expect(await engine.items.map(\.id) == [id])
        await #expect(throws: OfflineQueueError.self) { try await engine.clear() }
        #expect(await engine.pendingCount() == 1)
        #expect(mounted.remount(readOnly: false))
        #expect(await engine.cancel(id: id) == true)
        #expect(await engine.pendingCount() == 0)
    }

    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func onAFullDiskAttemptsAndBackoffStillCountAndMaxAttemptsStillDeadLetters() async throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 256))
        defer { mounted.unmount() }
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503)])
        let store = try DiskQueueStore(directory: mountPoint.url.appendingPathComponent("queue"))
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), maxAttempts: 3),
            clock: clock
        )
        let id = try #require(try await engine.enqueue(Mutation("/a"), sending: .onNextDrain).queuedID)
        let filler = mounted.fill()

        #expect(await engine.flush().kept == [id])
        #expect(store.entry(id: id)?.attempts == 1)
        #expect(await engine.flush().results.isEmpty)  // its backoff holds although it was not written
        #expect(session.callCount == 1)
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().kept == [id])
        #expect(store.entry(id: id)?.attempts == 2)
        clock.advance(by: .seconds(10))
        // The third attempt uses up maxAttempts; the dead letter cannot be written: kept.
        let third = await engine.flush()
        #expect(third.deadLettered.isEmpty)
        #expect(store.entry(id: id)?.attempts == 3)
        #expect(session.callCount == 3)
        try FileManager.default.removeItem(atPath: filler)
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().deadLettered == [id])
        #expect(store.deadLetters().map(\.id) == [id])
    }
}

/// A sender whose sends never return, not even when cancelled, until `release()`.
final class StuckSender: RequestSending {
    private struct State {
        var calls = 0
        var released = false
        var stuck = WaiterList<Void, Void>()
        /// Tagged with the call count they wait for.
        var callWaiters = WaiterList<Void, Int>()
    }

    private let state = Locked(State())

    func send(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        try await response(for: request)
    }

    func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let due = state.withLock { state in
            state.calls += 1
            let calls = state.calls
            return state.callWaiters.takeAll { $0 <= calls }
        }
        for waiter in due { waiter.resume(returning: ()) }
        // Not cancellable on purpose: it returns only once released.
        let ticket = state.withLock { $0.stuck.issue(()) }
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            let released = state.withLock { state -> Bool in
                guard !state.released else {
                    state.stuck.withdraw(ticket)
                    return true
                }
                state.stuck.park(ticket, continuation)
                return false
            }
            if released { continuation.resume() }
        }
        throw NetworkError.cancelled
    }

    func waitForCalls(_ count: Int) async {
        await state.wait(on: \.callWaiters, tag: count, cancelled: ()) { $0.calls >= count ? () : nil }
    }

    func release() {
        let stuck = state.withLock { state in
            state.released = true
            return state.stuck.takeAll()
        }
        for waiter in stuck { waiter.resume(returning: ()) }
    }
}
