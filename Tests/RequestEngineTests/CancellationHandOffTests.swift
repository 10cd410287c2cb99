import Dispatch
import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A task whose `cancel()` blocks until the test opens its gate, like `URLSessionTask.cancel()` on
/// Linux while the session's work queue is busy with a flood of body bytes. The gate has a safety
/// bound (50 s, inside the suite's time limit) only so that a build whose cancel does block the
/// cancelling thread fails instead of hanging: the tests never depend on it, since with hundreds of
/// tests running at once on two cores a task can wait many seconds for a thread.
final class BlockingCancelProbe: Sendable {
    struct State: Sendable {
        var resumeStarted = false
        var resumed = false
        var cancelStarted = false
        var cancelFinished = false
        var gateTimedOut = false
        var watchers: [(condition: @Sendable (State) -> Bool, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let gate = DispatchSemaphore(value: 0)
    /// A gate of its own for a blocking `resume()`: with one gate for both, a `cancel()` made while
    /// the resume is blocked could take the signal meant for the resume.
    private let resumeGate = DispatchSemaphore(value: 0)
    private let state = Locked(State())
    /// Whether `resume()` blocks too (as on Linux while the session's work queue is busy).
    private let resumeBlocks: Bool

    init(resumeBlocks: Bool = false) {
        self.resumeBlocks = resumeBlocks
    }

    var snapshot: State { state.withLock { $0 } }

    func resume() {
        update { $0.resumeStarted = true }
        var timedOut = false
        if resumeBlocks { timedOut = resumeGate.wait(timeout: .now() + .seconds(50)) == .timedOut }
        update {
            $0.resumed = true
            $0.gateTimedOut = $0.gateTimedOut || timedOut
        }
    }

    func cancel() {
        update { $0.cancelStarted = true }
        let timedOut = gate.wait(timeout: .now() + .seconds(50)) == .timedOut
        update {
            $0.cancelFinished = true
            $0.gateTimedOut = timedOut
        }
    }

    /// Lets the blocked (or next) `cancel()` return.
    func openGate() { gate.signal() }

    /// Lets the blocked (or next) `resume()` return.
    func openResumeGate() { resumeGate.signal() }

    /// Suspends until `condition` holds (the suite's time limit is the safety net).
    func wait(until condition: @escaping @Sendable (State) -> Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if condition(state) { return true }
                state.watchers.append((condition, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    private func update(_ change: (inout State) -> Void) {
        let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            change(&state)
            let current = state
            let ready = state.watchers.filter { $0.condition(current) }.map(\.continuation)
            state.watchers.removeAll { $0.condition(current) }
            return ready
        }
        for continuation in ready { continuation.resume() }
    }
}

/// A `TransferTask` over a `BlockingCancelProbe`.
final class BlockingCancelTask: TransferTask {
    let taskIdentifier = 1
    let probe: BlockingCancelProbe

    init(resumeBlocks: Bool = false) {
        probe = BlockingCancelProbe(resumeBlocks: resumeBlocks)
    }

    func resume() { probe.resume() }
    func cancel() { probe.cancel() }
}

#if canImport(FoundationNetworking)
/// A data task whose `cancel()` blocks (corelibs-foundation lets a test make one with `init()`).
final class BlockingDataTask: URLSessionDataTask, @unchecked Sendable {
    // @unchecked Sendable: its only stored property is a Sendable constant; the superclass's
    // state is never touched (neither resume nor cancel reaches it).
    let probe = BlockingCancelProbe()
    override func resume() { probe.resume() }
    override func cancel() { probe.cancel() }
}

/// A `URLSession` whose completion-handler data tasks are one `BlockingDataTask`.
final class BlockingURLSession: URLSession, @unchecked Sendable {
    // @unchecked Sendable: its only stored property is a Sendable constant.
    let task = BlockingDataTask()
    override func dataTask(
        with request: URLRequest,
        completionHandler: @escaping @Sendable (Data?, URLResponse?, (any Error)?) -> Void
    ) -> URLSessionDataTask {
        task
    }
}
#endif

/// Nothing on a cancellation path blocks: a caller's `Task.cancel()` (or the engine's timeout)
/// returns at once and the caller is answered `cancelled` at once, while the task's own
/// `cancel()` — which on Linux can wait seconds for a busy session — runs on another thread.
@Suite("Cancellation never blocks the cancelling thread", .timeLimit(.minutes(2)))
struct CancellationHandOffTests {
    private static let url = URL(string: "https://api.example.test/slow")!

    /// What a session call threw, as the engine classifies it.
    private static func sessionError(_ body: () async throws -> (Data, URLResponse)) async -> NetworkError? {
        do {
            _ = try await body()
            return nil
        } catch {
            return NetworkError(mapping: error)
        }
    }

    /// Cancels `caller` once `probe`'s task is resumed and checks, without timing anything, that
    /// `Task.cancel()` returned while the task's cancel still blocks (so it was not made on this
    /// thread) and that the caller is answered `cancelled` with the gate still closed (so its answer
    /// does not wait for the task's cancel); then lets the cancel finish.
    private static func cancelWhileTheTasksCancelBlocks(
        _ caller: Task<NetworkError?, Never>,
        probe: BlockingCancelProbe
    ) async {
        await probe.wait { $0.resumed }
        caller.cancel()  // would block here, in the task's cancel, were it made on this thread
        #expect(!probe.snapshot.cancelFinished)
        #expect(await caller.value?.caseName == "cancelled")
        probe.openGate()
        await probe.wait { $0.cancelFinished }  // the cancel was made, on another thread
        #expect(!probe.snapshot.gateTimedOut)  // a blocked answer would have waited out the bound
    }

    @Test func cancellingACallerOfTheTransportDoesNotWaitForTheTasksCancel() async {
        let task = BlockingCancelTask()
        let transport = URLSessionTransport(configuration: .ephemeral) { _, _ in task }
        let caller = Task { await Self.sessionError { try await transport.data(for: URLRequest(url: Self.url)) } }
        await Self.cancelWhileTheTasksCancelBlocks(caller, probe: task.probe)
    }

    @Test func aTimeoutWhoseTaskIsSlowToCancelDelaysNoOtherTimeout() async {
        // The engine's watchdog cancels timed-out attempts from its own thread, one after another:
        // were a task's cancel made there, the next request's timeout would wait behind it.
        let slow = BlockingCancelTask()
        let next = BlockingCancelTask()
        next.probe.openGate()  // its cancel does not block
        let tasks = Locked<[BlockingCancelTask]>([slow, next])
        let transport = URLSessionTransport(configuration: .ephemeral) { _, _ in tasks.withLock { $0.removeFirst() } }
        let clock = ManualClock()
        let engine = AsyncRequestEngine(session: transport, clock: clock)
        let first = Task { await networkError { try await engine.send(TestRequest("/first", timeout: 5)) } }
        await slow.probe.wait { $0.resumed }
        let second = Task { await networkError { try await engine.send(TestRequest("/second", timeout: 6)) } }
        await next.probe.wait { $0.resumed }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(6))  // both deadlines pass; the first is handled first
        // Both answered with the first cancel still blocked: neither waits for it.
        #expect(await first.value?.caseName == "timedOut")
        #expect(await second.value?.caseName == "timedOut")
        slow.probe.openGate()
        await slow.probe.wait { $0.cancelFinished }
        await next.probe.wait { $0.cancelFinished }
        #expect(!slow.probe.snapshot.gateTimedOut)  // an answer waiting for it would have waited out the bound
    }

    #if canImport(FoundationNetworking)
    @Test func cancellingACallerOfAPlainURLSessionDoesNotWaitForTheTasksCancel() async {
        let session = BlockingURLSession(configuration: .ephemeral)
        let caller = Task { await Self.sessionError { try await session.data(for: URLRequest(url: Self.url)) } }
        await Self.cancelWhileTheTasksCancelBlocks(caller, probe: session.task.probe)
    }
    #endif

    #if canImport(FoundationNetworking)
    @Test func aCallerWhoseTasksResumeBlocksIsNotHeldAndIsAnsweredWhenCancelled() async {
        // On Linux `resume()` waits for the session's work queue; made on the caller's thread (one
        // of the cooperative pool's), it would hold that thread, and the caller could not even be
        // answered, until the session let go.
        let task = BlockingCancelTask(resumeBlocks: true)
        let transport = URLSessionTransport(configuration: .ephemeral) { _, _ in task }
        let caller = Task { await Self.sessionError { try await transport.data(for: URLRequest(url: Self.url)) } }
        await task.probe.wait { $0.resumeStarted }
        caller.cancel()
        #expect(await caller.value?.caseName == "cancelled")  // answered with the resume still blocked
        #expect(!task.probe.snapshot.resumed)
        task.probe.openResumeGate()  // lets the resume return
        await task.probe.wait { $0.resumed }
        task.probe.openGate()  // and the cancel that followed it
        await task.probe.wait { $0.cancelFinished }
        #expect(!task.probe.snapshot.gateTimedOut)
    }
    #endif

    @Test func aCallerCancelledBeforeItsTransferStartsGetsNoTask() async {
        let made = Locked(0)
        let transport = URLSessionTransport(configuration: .ephemeral) { _, _ in
            made.withLock { $0 += 1 }
            return BlockingCancelTask()
        }
        let caller = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await Self.sessionError { try await transport.data(for: URLRequest(url: Self.url)) }
        }
        #expect(await caller.value?.caseName == "cancelled")
        #expect(made.withLock { $0 } == 0)
    }
}
