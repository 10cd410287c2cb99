import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("AsyncRequestEngine: retries, Retry-After, budget, breaker", .timeLimit(.minutes(1)))
struct AsyncRequestEngineRetryTests {
    @Test func successReturnsBodyAndEmitsStartedThenSucceeded() async throws {
        let session = ScriptedNetworkSession([.ok("hello")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let (data, response) = try await engine.send(TestRequest())
        #expect(String(decoding: data, as: UTF8.self) == "hello")
        #expect(response.statusCode == 200)
        #expect(recorder.timeline == ["started", "succeeded(200,0)"])
        #expect(Set(recorder.events.map(\.traceID)).count == 1)
    }

    @Test func serverErrorsAreRetriedWithThePolicysDelaysUntilSuccess() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .status(503), .ok("done")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0),
            eventSink: recorder,
            clock: clock
        )
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(1)))
        clock.advance(by: .seconds(1))
        await session.waitForCalls(2)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(3)))
        clock.advance(by: .seconds(2))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "done")
        #expect(session.callCount == 3)
        #expect(recorder.timeline == ["started", "retry(0,1.0)", "retry(1,2.0)", "succeeded(200,2)"])
        #expect(Set(recorder.events.map(\.traceID)).count == 1)
    }

    /// The backoff counts from the retry decision: an event sink that takes time before the
    /// sleep does not lengthen it (the next attempt is due at the decision plus the delay).
    @Test func aSlowEventSinkDoesNotLengthenTheBackoff() async throws {
        final class SlowSink: RequestEventSink {
            let clock: ManualClock
            init(clock: ManualClock) { self.clock = clock }
            func record(_ event: RequestEvent) async {
                if case .retryScheduled = event { clock.advance(by: .milliseconds(400)) }
            }
        }
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .ok("done")])
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 1),
            eventSink: SlowSink(clock: clock),
            clock: clock
        )
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(1)))  // not 1.4 s
        clock.advance(by: .seconds(1))
        _ = try await task.value
        #expect(session.callCount == 2)
    }

    @Test func withoutAPolicyNothingIsRetried() async {
        let session = ScriptedNetworkSession([.status(503), .ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "httpError(503)")
        #expect(session.callCount == 1)
    }

    @Test func retriesStopWhenThePolicyGivesUpAndTheLastErrorIsThrown() async {
        let session = ScriptedNetworkSession([.status(500), .status(502), .status(504)])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0),
            eventSink: recorder, clock: ManualClock()
        )
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "httpError(504)")
        #expect(session.callCount == 3)
        #expect(recorder.timeline.last == "failed(HTTP 504 (0 body bytes),2)")
    }

    @Test(arguments: [400, 401, 403, 404, 409, 422, 501])
    func clientErrorsAnd501AreNotRetried(status: Int) async {
        let session = ScriptedNetworkSession([.status(status), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0), clock: ManualClock())
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "httpError(\(status))")
        #expect(session.callCount == 1)
    }

    @Test(arguments: [408, 429, 500, 502, 503, 504])
    func transientStatusesAreRetried(status: Int) async throws {
        let session = ScriptedNetworkSession([.status(status), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), clock: ManualClock())
        try await engine.send(TestRequest())
        #expect(session.callCount == 2)
    }

    @Test func postWithoutIdempotencyKeyIsNotRetried() async {
        let session = ScriptedNetworkSession([.status(503), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0), clock: ManualClock())
        let error = await networkError { try await engine.send(TestRequest(method: .post, body: Data("x".utf8))) }
        #expect(error?.caseName == "httpError(503)")
        #expect(session.callCount == 1)
    }

    @Test func postWithIdempotencyKeyIsRetriedWithTheSameKey() async throws {
        let session = ScriptedNetworkSession([.urlError(.networkConnectionLost), .status(503), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0), clock: ManualClock())
        try await engine.send(TestRequest(method: .post, headers: ["idempotency-key": "k-1"], body: Data("x".utf8)))
        #expect(session.callCount == 3)
        #expect(session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") } == ["k-1", "k-1", "k-1"])
    }

    @Test func patchWithoutKeyIsNotRetriedButPutAndDeleteAre() async throws {
        let patch = ScriptedNetworkSession([.status(503), .ok()])
        let policy = FixedIntervalRetryPolicy(maxRetries: 1, interval: 0)
        _ = await networkError { try await AsyncRequestEngine(session: patch, retryPolicy: policy, clock: ManualClock()).send(TestRequest(method: .patch)) }
        #expect(patch.callCount == 1)
        for method in [HTTPMethod.put, .delete] {
            let session = ScriptedNetworkSession([.status(503), .ok()])
            try await AsyncRequestEngine(session: session, retryPolicy: policy, clock: ManualClock()).send(TestRequest(method: method))
            #expect(session.callCount == 2)
        }
    }

    @Test func retryAfterSecondsOn429ReplacesThePolicyDelay() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(429, headers: ["Retry-After": "7"]), .ok()])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 1), eventSink: recorder, clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(7)))
        clock.advance(by: .seconds(7))
        _ = try await task.value
        #expect(recorder.timeline == ["started", "retry(0,7.0)", "succeeded(200,1)"])
    }

    @Test func retryAfterHTTPDateOn503IsHonoured() async throws {
        let clock = ManualClock()
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        // The date is read against the wall clock when the response arrives, somewhere between
        // `before` and `after` (seconds apart on a loaded machine); the header drops the fraction.
        let before = Date()
        let target = before.addingTimeInterval(50)
        let date = formatter.string(from: target)
        let session = ScriptedNetworkSession([.status(503, headers: ["Retry-After": date]), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 1), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        let after = Date()
        let deadline = try #require(clock.nextDeadline).offset
        let latest = target.timeIntervalSince(before)  // 50 s: below the 60 s default cap
        let earliest = max(0, target.timeIntervalSince(after) - 1)
        #expect(deadline <= .seconds(latest) && deadline >= .seconds(earliest), "\(deadline) not in \(earliest)...\(latest) s")
        clock.advance(by: .seconds(50))
        _ = try await task.value
    }

    @Test func retryAfterIsCappedByTheConfiguredMaximum() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503, headers: ["Retry-After": "86400"]), .ok()])
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 1), retryAfter: .honored(atMost: .seconds(30)))), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(30)))
        clock.advance(by: .seconds(30))
        _ = try await task.value
    }

    @Test(arguments: ["soon", "-3", "1.5", "Tue, 99 Foo 2026 00:00:00 GMT", ""])
    func garbageRetryAfterFallsBackToThePolicyDelay(value: String) async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503, headers: ["Retry-After": value]), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 2), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(2)))
        clock.advance(by: .seconds(2))
        _ = try await task.value
    }

    @Test func retryAfterOnOtherStatusesIsIgnored() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(500, headers: ["Retry-After": "50"]), .ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 2), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(2)))
        clock.advance(by: .seconds(2))
        _ = try await task.value
    }

    @Test func hostilePolicyDelaysAreClampedNotTrapped() async throws {
        // -1, NaN and -infinity retry at once; +infinity and 1e300 wait exactly the maximum.
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .status(503), .status(503), .status(503), .status(503), .ok()])
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: ListPolicy(delays: [-1, .nan, -.infinity, .infinity, 1e300]), maximumDelay: .seconds(10))), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(4)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(10)))
        clock.advance(by: .seconds(10))
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(20)))
        clock.advance(by: .seconds(10))
        _ = try await task.value
        #expect(session.callCount == 6)
    }

    @Test func exhaustedRetryBudgetStopsRetriesAcrossRequests() async {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 1, clock: clock)
        let session = ScriptedNetworkSession([.status(503)])
        let engine = AsyncRequestEngine(session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0), budget: budget)), clock: clock)
        _ = await networkError { try await engine.send(TestRequest("/a")) }
        #expect(session.callCount == 2)  // one retry spent the only token
        _ = await networkError { try await engine.send(TestRequest("/b")) }
        #expect(session.callCount == 3)  // no token left: no retry
    }

    @Test func budgetRefillsFromRequestsAndTime() async {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0.5, minRetriesPerSecond: 1, maxBalance: 1, clock: clock)
        #expect(budget.tryWithdraw())
        #expect(!budget.tryWithdraw())
        budget.recordRequest()
        budget.recordRequest()
        #expect(budget.tryWithdraw())
        clock.advance(by: .seconds(1))
        #expect(budget.tryWithdraw())
        #expect(!budget.tryWithdraw())
    }

    @Test func openCircuitFailsFastWithoutCallingTheNetwork() async throws {
        let clock = ManualClock()
        let breaker = CircuitBreaker(configuration: .init(windowSize: 4, minimumCalls: 2, failureRateThreshold: 0.5, openDuration: .seconds(30)), clock: clock)
        let session = ScriptedNetworkSession([.status(500), .status(500), .ok()])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .shared(breaker)), clock: clock)
        _ = await networkError { try await engine.send(TestRequest()) }
        _ = await networkError { try await engine.send(TestRequest()) }
        #expect(breaker.state == .open)
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "circuitOpen")
        #expect(session.callCount == 2)
        clock.advance(by: .seconds(30))
        try await engine.send(TestRequest())  // the half-open probe succeeds
        #expect(breaker.state == .closed)
        #expect(session.callCount == 3)
    }

    @Test func clientErrorsDoNotOpenTheCircuit() async {
        let breaker = CircuitBreaker(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5), clock: ManualClock())
        let session = ScriptedNetworkSession([.status(404)])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .shared(breaker)), clock: ManualClock())
        for _ in 0..<5 { _ = await networkError { try await engine.send(TestRequest()) } }
        #expect(breaker.state == .closed)
        #expect(session.callCount == 5)
    }

    @Test func perRequestTimeoutFailsTheAttemptAsTimedOut() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        let task = Task { await networkError { try await engine.send(TestRequest(timeout: 5)) } }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))
        clock.advance(by: .seconds(5))
        #expect(await task.value?.caseName == "timedOut")
        await session.waitUntilNoneSuspended()
        #expect(session.suspendedCount == 0)  // the hanging call was cancelled, not leaked
    }

    @Test func timedOutAttemptIsRetriedWithAFreshTimeout() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang, .ok("second")])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), clock: clock)
        let task = Task { try await engine.send(TestRequest(timeout: 5)) }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(5))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "second")
    }

    @Test func cancellationDuringBackoffEndsWithCancelled() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503)])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 60), eventSink: recorder, clock: clock)
        let task = Task { await networkError { try await engine.send(TestRequest(method: .put)) } }
        await clock.waitForSleepers(1)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        // The caller is answered at once; the request's own task emits `failed` as it winds down.
        await recorder.waitForFailed()
        #expect(session.callCount == 1)
        #expect(recorder.timeline.last == "failed(cancelled,0)")
    }

    @Test func cancellationDuringAnAttemptEndsWithCancelled() async {
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0), clock: ManualClock())
        let task = Task { await networkError { try await engine.send(TestRequest(method: .post)) } }
        await session.waitForCalls(1)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        #expect(session.callCount == 1)
    }

    @Test func responseForReturnsTheFinalNonSuccessResponseWithItsHeaders() async throws {
        let session = ScriptedNetworkSession([.status(503, headers: ["Retry-After": "120"])])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), retryAfter: .ignored), eventSink: recorder), clock: ManualClock())
        for method in [HTTPMethod.get, .put] {  // deduplicated and direct paths
            let (_, response) = try await engine.response(for: TestRequest(method: method))
            #expect(response.statusCode == 503)
            #expect(response.value(forHTTPHeaderField: "Retry-After") == "120")
        }
        #expect(session.callCount == 4)
        #expect(recorder.timeline.filter { $0.hasPrefix("failed") }.count == 2)
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "httpError(503)")
    }

    @Test func responseForStillThrowsWhenNoResponseArrived() async {
        let engine = AsyncRequestEngine(session: ScriptedNetworkSession([.urlError(.notConnectedToInternet)]), clock: ManualClock())
        #expect(await networkError { _ = try await engine.response(for: TestRequest()) }?.caseName == "noConnection")
    }

    @Test func aShorterTimeoutRegisteredLaterStillFiresFirst() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        let long = Task { await networkError { try await engine.send(TestRequest("/long", method: .post, timeout: 60)) } }
        await session.waitForCalls(1)
        let short = Task { await networkError { try await engine.send(TestRequest("/short", method: .post, timeout: 5)) } }
        await session.waitForCalls(2)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))  // one watchdog sleeper, re-armed
        clock.advance(by: .seconds(5))
        #expect(await short.value?.caseName == "timedOut")
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(60)))
        clock.advance(by: .seconds(55))
        #expect(await long.value?.caseName == "timedOut")
    }

    @Test func fastRequestsWithTimeoutsShareOneWatchdogSleeper() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        for index in 0..<200 {
            _ = try await engine.send(TestRequest("/\(index)", timeout: 30))
        }
        #expect(clock.sleeperCount <= 1)
        #expect(session.callCount == 200)
    }
}
