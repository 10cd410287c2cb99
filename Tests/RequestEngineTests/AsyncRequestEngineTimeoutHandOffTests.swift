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

/// A transport whose first calls (one by default) ignore cancellation: each answers "late" only
/// when the test releases it. Later calls answer "second" at once. It stands for a URLSession that
/// is slow to acknowledge a cancel under load.
final class StubbornSession: NetworkSession {
    private struct State {
        var calls = 0
        var blocked: [Int: CheckedContinuation<Void, Never>] = [:]
        var released: Set<Int> = []
        var callWatchers: [(Int, CheckedContinuation<Void, Never>)] = []
    }
    private let state = Locked(State())
    private let hangingCalls: Int

    init(hangingCalls: Int = 1) {
        self.hangingCalls = hangingCalls
    }

    var callCount: Int { state.withLock { $0.calls } }

    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let (call, ready) = state.withLock { state -> (Int, [CheckedContinuation<Void, Never>]) in
            state.calls += 1
            let count = state.calls
            let ready = state.callWatchers.filter { $0.0 <= count }.map(\.1)
            state.callWatchers.removeAll { $0.0 <= count }
            return (count, ready)
        }
        for watcher in ready { watcher.resume() }
        let url = request.url!
        if call <= hangingCalls {
            // No cancellation handler on purpose.
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let releasedAlready = state.withLock { state -> Bool in
                    if state.released.contains(call) { return true }
                    state.blocked[call] = continuation
                    return false
                }
                if releasedAlready { continuation.resume() }
            }
            return (Data("late".utf8), HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: nil)!)
        }
        return (Data("second".utf8), HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: nil)!)
    }

    /// Lets hanging call `call` answer (with "late"); by default the first.
    func release(call: Int = 1) {
        let blocked = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.released.insert(call)
            return state.blocked.removeValue(forKey: call)
        }
        blocked?.resume()
    }

    /// Suspends until at least `count` calls have started.
    func waitForCalls(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.calls >= count { return true }
                state.callWatchers.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }
}

@Suite("AsyncRequestEngine: a timed-out attempt hands the request to a new task", .timeLimit(.minutes(1)))
struct AsyncRequestEngineTimeoutHandOffTests {
    /// An engine on a manual clock over a `StubbornSession`, recording events; requests use a 5 s timeout.
    private struct Harness {
        let clock = ManualClock()
        let session: StubbornSession
        let recorder = EventRecorder()
        let engine: AsyncRequestEngine

        init(retries: Bool = true, hangingCalls: Int = 1) {
            session = StubbornSession(hangingCalls: hangingCalls)
            engine = AsyncRequestEngine(
                session: session,
                retryPolicy: retries ? FixedIntervalRetryPolicy(maxRetries: 1, interval: 0) : nil,
                eventSink: recorder,
                clock: clock
            )
        }

        /// Waits until the first call hangs in the transport with its deadline armed.
        func firstCallHangs() async {
            await session.waitForCalls(1)
            await clock.waitForSleepers(1)
        }

        func fireTimeout() {
            clock.advance(by: .seconds(5))
        }
    }

    @Test func theRetryAfterATimeoutDoesNotWaitForATransportThatIgnoresCancellation() async throws {
        let harness = Harness()
        let task = Task { try await harness.engine.send(TestRequest(timeout: 5)) }
        await harness.firstCallHangs()
        harness.fireTimeout()
        // The first call is still blocked (never released before this line), yet the retry ran.
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "second")
        #expect(harness.session.callCount == 2)
        #expect(harness.recorder.timeline == ["started", "retry(0,0.0)", "succeeded(200,1)"])
        #expect(harness.engine.inFlightCount == 0)
        harness.session.release()  // the superseded attempt's late answer goes nowhere
    }

    @Test func withoutRetriesATimeoutAnswersAtOnceWhileTheTransportIgnoresTheCancel() async {
        let harness = Harness(retries: false)
        let task = Task { await networkError { try await harness.engine.send(TestRequest(method: .post, timeout: 5)) } }
        await harness.firstCallHangs()
        harness.fireTimeout()
        #expect(await task.value?.caseName == "timedOut")
        #expect(harness.recorder.timeline == ["started", "failed(timed out,0)"])
        harness.session.release()
    }

    @Test func everyWaiterOfASharedCallGetsTheRetryAfterATimeout() async throws {
        let harness = Harness()
        let first = Task { try await harness.engine.send(TestRequest(timeout: 5)) }
        await harness.firstCallHangs()
        let second = Task { try await harness.engine.send(TestRequest(timeout: 5)) }
        await harness.recorder.waitForDeduplicated(1)
        harness.fireTimeout()
        #expect(String(decoding: try await first.value.0, as: UTF8.self) == "second")
        #expect(String(decoding: try await second.value.0, as: UTF8.self) == "second")
        #expect(harness.session.callCount == 2)
        harness.session.release()
    }

    @Test func aCallAbandonedBeforeItsTimeoutFiresEndsCancelledWithoutAnotherAttempt() async {
        let harness = Harness()
        let task = Task { await networkError { try await harness.engine.send(TestRequest(timeout: 5)) } }
        await harness.firstCallHangs()
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")  // answered while the transport still hangs
        harness.fireTimeout()  // the timeout fires for a call nobody waits for
        await harness.recorder.waitForFailed()
        #expect(harness.recorder.timeline == ["started", "failed(cancelled,0)"])
        #expect(harness.session.callCount == 1)
        harness.session.release()
    }

    @Test func aLateAnswerDuringTheRetryLeavesTheRetrysTimeoutArmed() async {
        // Attempts 0 and 1 both hang in a transport that ignores cancellation. Attempt 0's late
        // answer arrives while attempt 1 is in flight: dropping it must not unregister attempt
        // 1's deadline, or that request would wait for its transport forever.
        let harness = Harness(hangingCalls: 2)
        let (dropped, droppedContinuation) = AsyncStream.makeStream(of: Void.self)
        harness.engine.testHooks.droppedLateAnswer.withLock { $0 = .init { droppedContinuation.yield() } }
        let task = Task { await networkError { try await harness.engine.send(TestRequest(timeout: 5)) } }
        await harness.firstCallHangs()
        harness.fireTimeout()
        await harness.session.waitForCalls(2)
        await harness.clock.waitForSleepers(1)  // attempt 1's deadline, 5 s from now
        harness.session.release(call: 1)
        for await _ in dropped { break }  // attempt 0's task has seen its answer and dropped it
        harness.fireTimeout()
        // Were the retry's deadline lost, the request would wait forever: the suite's time limit
        // cancels this test, which cancels the request, so the test fails instead of hanging.
        let outcome = await withTaskCancellationHandler {
            await task.value
        } onCancel: {
            task.cancel()
        }
        #expect(outcome?.caseName == "timedOut")
        #expect(harness.recorder.timeline == ["started", "retry(0,0.0)", "failed(timed out,1)"])
        #expect(harness.engine.inFlightCount == 0)
        harness.session.release(call: 2)
    }

    @Test func exactlyOneSideClaimsAnAttempt() async {
        // The response first: the timeout that fires afterwards finds nothing to claim.
        let call = SharedCall.unstarted()
        call.open(attempt: 0)
        #expect(call.claim(attempt: 0))
        let successorRan = Locked(false)
        call.timeOut(attempt: 0, priority: nil) { _ in successorRan.withLock { $0 = true } }
        // The timeout first: the late response's claim fails, also for an older attempt number.
        let other = SharedCall.unstarted()
        let (handedOff, continuation) = AsyncStream.makeStream(of: Void.self)
        other.open(attempt: 3)
        other.timeOut(attempt: 3, priority: nil) { _ in
            continuation.yield(); continuation.finish()
        }
        #expect(!other.claim(attempt: 3))
        for await _ in handedOff {}
        other.open(attempt: 4)
        #expect(!other.claim(attempt: 3))
        #expect(other.claim(attempt: 4))
        // After completion no successor starts.
        let done = SharedCall.unstarted()
        done.open(attempt: 0)
        done.complete(.failure(.cancelled))
        done.timeOut(attempt: 0, priority: nil) { _ in successorRan.withLock { $0 = true } }
        #expect(!successorRan.withLock { $0 })
    }

    @Test func aTimeoutAfterTheLastWaiterLeftTellsTheSuccessorTheCallWasAbandoned() async {
        let call = SharedCall.unstarted()
        call.open(attempt: 0)
        let waiter = Task { await call.wait(call.firstTicket) }
        waiter.cancel()
        let answer = await waiter.value
        #expect(answer.failure?.caseName == "cancelled")
        let (told, continuation) = AsyncStream.makeStream(of: Bool.self)
        call.timeOut(attempt: 0, priority: nil) { expired in
            continuation.yield(expired.abandoned)
            continuation.finish()
        }
        var flags: [Bool] = []
        for await flag in told { flags.append(flag) }
        #expect(flags == [true])
    }
}

extension SharedCall {
    /// A call that no task runs, for tests of its claim and hand-off rules on their own.
    static func unstarted(key: SingleFlightTable.Key? = nil) -> SharedCall {
        let url = URL(string: "https://api.example.test/resource")!
        let execution = Execution(
            url: url, method: .get, urlRequest: URLRequest(url: url), invalid: nil, timeout: .seconds(5), maximumBodySize: nil,
            mayRetry: false, traceID: UUID(), started: .zero, priority: .medium, key: key
        )
        return SharedCall(execution: execution, parts: AsyncRequestEngine(session: ScriptedNetworkSession([])).parts)
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
