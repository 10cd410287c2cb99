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

/// A scripted session that says it bounds each call (`honorsTimeoutAndCancellation`, as
/// AsyncHTTPClient's does; the script's `.hang` ends on cancellation) and records, for each call,
/// which task made it.
private final class BoundingSession: NetworkSession {
    let script: ScriptedNetworkSession
    let honorsTimeoutAndCancellation: Bool
    private let tasks = Locked<[Int]>([])

    init(_ steps: [ScriptedNetworkSession.Step], honors: Bool = true) {
        script = ScriptedNetworkSession(steps)
        honorsTimeoutAndCancellation = honors
    }

    /// The task of each call so far (a hash of the running task: equal for the same live task).
    var callingTasks: [Int] { tasks.withLock { $0 } }

    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let task = currentTaskHash()
        tasks.withLock { $0.append(task) }
        return try await script.data(for: request)
    }
}

private func currentTaskHash() -> Int {
    withUnsafeCurrentTask { $0?.hashValue ?? 0 }
}

private struct Request: NetworkRequest {
    var url = URL(string: "https://example.com/items")!
    var method: HTTPMethod = .post
    var headers: [String: String] = [:]
    var timeout: TimeInterval = 5
    var deadline: Duration?
}

@Suite("AsyncRequestEngine: a request that shares nothing runs in its caller's task", .timeLimit(.minutes(1)))
struct CallersTaskTests {
    @Test func aPOSTOverASessionThatBoundsItsCallsRunsInTheCallersTask() async throws {
        let session = BoundingSession([.ok("done")])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let caller = currentTaskHash()
        let (data, _) = try await engine.send(Request())
        #expect(String(decoding: data, as: UTF8.self) == "done")
        #expect(session.callingTasks == [caller])
        // The session bounds the attempt itself: its interval is the timeout, not a backstop past it.
        #expect(session.script.requests.first?.timeoutInterval == 5)
    }

    @Test func aGETWithDeduplicationOffRunsInTheCallersTask() async throws {
        let session = BoundingSession([.ok()])
        let engine = AsyncRequestEngine(session: session, configuration: .init(deduplicatedMethods: []), clock: ManualClock())
        let caller = currentTaskHash()
        _ = try await engine.send(Request(method: .get))
        #expect(session.callingTasks == [caller])
    }

    @Test func whatMayWaitOrRaceStillRunsInATaskOfItsOwn() async throws {
        let caller = currentTaskHash()
        // A session that does not bound its calls (URLSession's interval is an idle timeout).
        let unbounded = BoundingSession([.ok()], honors: false)
        _ = try await AsyncRequestEngine(session: unbounded, clock: ManualClock()).send(Request())
        #expect(unbounded.script.requests.first?.timeoutInterval == 6)
        // A host limit: the wait for a place is timed by the engine.
        let limited = BoundingSession([.ok()])
        _ = try await AsyncRequestEngine(session: limited, configuration: .init(limits: .init(concurrencyPerHost: 4)), clock: ManualClock()).send(Request())
        // Hedging: the copies race in tasks.
        let hedged = BoundingSession([.ok()])
        let hedging = HedgingPolicy(delay: .milliseconds(100), maxAttempts: 2)
        _ = try await AsyncRequestEngine(session: hedged, configuration: .init(hedging: hedging), clock: ManualClock())
            .send(Request(headers: [HTTPHeader.idempotencyKey: "k1"]))
        for session in [unbounded, limited, hedged] {
            #expect(session.callingTasks.count == 1)
            #expect(session.callingTasks.first != caller)
        }
    }

    @Test func theSessionsTimeoutIsRetriedWithTheSameEventsAsTheEnginesOwn() async throws {
        let session = BoundingSession([.urlError(.timedOut), .ok()])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), eventSink: recorder,
            clock: ManualClock()
        )
        let caller = currentTaskHash()
        _ = try await engine.send(Request(headers: [HTTPHeader.idempotencyKey: "k1"]))
        #expect(session.callingTasks == [caller, caller])
        #expect(recorder.timeline == ["started", "retry(0,0.0)", "succeeded(200,1)"])
    }

    @Test func aDeadlineSoonerThanTheTimeoutBoundsTheCallAndItsTimeoutIsDeadlineExceeded() async throws {
        let clock = ManualClock()
        let session = BoundingSession([.urlError(.timedOut), .ok()])
        let breaker = CircuitBreaker(configuration: .init(windowSize: 1, minimumCalls: 1, failureRateThreshold: 0.5), clock: clock)
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0)), circuitBreaker: .shared(breaker)), clock: clock)
        let error = await networkError { try await engine.send(Request(method: .put, timeout: 30, deadline: .seconds(2))) }
        #expect(error?.caseName == "deadlineExceeded")
        // One attempt, bounded by what was left of the deadline; not retried.
        #expect(session.script.requests.map(\.timeoutInterval) == [2])
        // Cut on the wire by the deadline: it counts against the host, as the engine's own cut does.
        #expect(breaker.state == .open)
    }

    @Test func aTimeoutSoonerThanTheDeadlineStaysTimedOut() async throws {
        let session = BoundingSession([.urlError(.timedOut)])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let error = await networkError { try await engine.send(Request(timeout: 1, deadline: .seconds(10))) }
        #expect(error?.caseName == "timedOut")
        #expect(session.script.requests.map(\.timeoutInterval) == [1])
    }

    @Test func aCancelledCallerGetsCancelledAndTheCallEnds() async throws {
        let session = BoundingSession([.hang])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let task = Task { try await engine.send(Request()) }
        await session.script.waitForCalls(1)
        task.cancel()
        let error = await networkError { _ = try await task.value }
        #expect(error?.caseName == "cancelled")
        // Run in the caller's task, the call has ended and the request has been reported when send throws.
        #expect(session.script.suspendedCount == 0)
        #expect(recorder.timeline == ["started", "failed(\(NetworkError.cancelled),0)"])
    }

    @Test func anInvalidRequestFailsBeforeAnythingIsSent() async throws {
        let session = BoundingSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let error = await networkError { try await engine.send(Request(url: URL(string: "ftp://example.com/x")!)) }
        #expect(error?.caseName == "invalidRequest")
        #expect(session.callingTasks.isEmpty)
    }

    // MARK: A shared read, run by the caller that starts it

    @Test func aDeduplicatedGETRunsInTheTaskOfTheCallerThatStartsItAndOthersJoinIt() async throws {
        let session = BoundingSession([.held(.ok("shared"))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let first = Task { (currentTaskHash(), try await engine.send(Request(method: .get)).0) }
        await session.script.waitForCalls(1)
        let second = Task { try await engine.send(Request(method: .get)).0 }
        await recorder.waitForDeduplicated(1)
        session.script.releaseHeld()
        let (firstTask, firstData) = try await first.value
        #expect(String(decoding: firstData, as: UTF8.self) == "shared")
        #expect(String(decoding: try await second.value, as: UTF8.self) == "shared")
        #expect(session.callingTasks == [firstTask])
    }

    @Test func whenTheCallerRunningASharedReadIsCancelledTheOthersKeepIt() async throws {
        let session = BoundingSession([.hang, .ok("for the joiner")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let runner = Task { (currentTaskHash(), await networkError { _ = try await engine.send(Request(method: .get)) }) }
        await session.script.waitForCalls(1)
        let joiner = Task { (currentTaskHash(), try await engine.send(Request(method: .get)).0) }
        await recorder.waitForDeduplicated(1)
        runner.cancel()
        let (runnerTask, runnerError) = await runner.value
        #expect(runnerError?.caseName == "cancelled")
        let (joinerTask, data) = try await joiner.value
        #expect(String(decoding: data, as: UTF8.self) == "for the joiner")
        // The attempt the runner's cancellation cut is sent again, from a task of the call's own.
        #expect(session.callingTasks.count == 2)
        #expect(session.callingTasks.first == runnerTask)
        #expect(session.callingTasks.last != runnerTask && session.callingTasks.last != joinerTask)
        #expect(recorder.timeline == ["started", "dedup", "succeeded(200,0)"])
    }

    @Test func aCancelledRunnerThatNobodyJoinedEndsTheCallAndTheNextReadStartsAfresh() async throws {
        let session = BoundingSession([.hang, .ok("fresh")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let runner = Task { await networkError { _ = try await engine.send(Request(method: .get)) } }
        await session.script.waitForCalls(1)
        runner.cancel()
        #expect(await runner.value?.caseName == "cancelled")
        #expect(session.script.callCount == 1)
        #expect(recorder.timeline == ["started", "failed(\(NetworkError.cancelled),0)"])
        #expect(engine.inFlightCount == 0)
        let (data, _) = try await engine.send(Request(method: .get))
        #expect(String(decoding: data, as: UTF8.self) == "fresh")
    }

    @Test func aJoinerThatLeavesLeavesTheRunnerItsAnswer() async throws {
        let session = BoundingSession([.held(.ok("kept"))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let runner = Task { try await engine.send(Request(method: .get)).0 }
        await session.script.waitForCalls(1)
        let joiner = Task { await networkError { _ = try await engine.send(Request(method: .get)) } }
        await recorder.waitForDeduplicated(1)
        joiner.cancel()
        #expect(await joiner.value?.caseName == "cancelled")
        session.script.releaseHeld()
        #expect(String(decoding: try await runner.value, as: UTF8.self) == "kept")
        #expect(session.script.callCount == 1)
    }

    @Test func aRunnerCancelledInABackoffLeavesTheRestOfTheBackoffToTheSuccessor() async throws {
        let clock = ManualClock()
        let session = BoundingSession([.status(503), .ok("after the backoff")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 10), eventSink: recorder, clock: clock
        )
        let runner = Task { await networkError { _ = try await engine.send(Request(method: .get)) } }
        await clock.waitForSleepers(1)  // attempt 0 answered 503; the 10 s backoff began
        let joiner = Task { try await engine.send(Request(method: .get)).0 }
        await recorder.waitForDeduplicated(1)
        clock.advance(by: .seconds(4))
        runner.cancel()
        #expect(await runner.value?.caseName == "cancelled")
        await clock.waitForSleepers(1)  // the successor waits out the 6 s left
        #expect(session.script.callCount == 1)
        clock.advance(by: .seconds(5))
        #expect(session.script.callCount == 1)
        clock.advance(by: .seconds(1))
        #expect(String(decoding: try await joiner.value, as: UTF8.self) == "after the backoff")
        #expect(session.script.callCount == 2)
        #expect(recorder.timeline == ["started", "retry(0,10.0)", "dedup", "succeeded(200,1)"])
    }
}
