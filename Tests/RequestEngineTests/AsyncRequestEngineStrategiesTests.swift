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

/// Hears hedges as well as request events.
final class HedgeRecorder: HedgingEventSink {
    private let state = Locked<(events: [RequestEvent], hedges: [HedgeEvent])>(([], []))
    func record(_ event: RequestEvent) async { state.withLock { $0.events.append(event) } }
    func recordHedge(_ event: HedgeEvent) async { state.withLock { $0.hedges.append(event) } }
    var hedges: [HedgeEvent] { state.withLock { $0.hedges } }
    var events: [RequestEvent] { state.withLock { $0.events } }
}

/// The total deadline on a ManualClock: what it bounds, which error says it fired, how it meets
/// the attempt timeout and retries.
@Suite("AsyncRequestEngine: total deadline", .timeLimit(.minutes(1)))
struct AsyncRequestEngineDeadlineTests {
    @Test func theDeadlineCutsTheAttemptInFlightWithDeadlineExceeded() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(5)), clock: clock)
        let task = Task { await networkError { try await engine.send(TestRequest()) } }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)  // the watchdog, at the deadline
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))
        clock.advance(by: .seconds(5))
        #expect(await task.value?.caseName == "deadlineExceeded")
        await session.waitUntilNoneSuspended()  // the attempt was cancelled
    }

    @Test func anAttemptTimeoutSoonerThanTheDeadlineIsTimedOut() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(10)), clock: clock)
        let task = Task { await networkError { try await engine.send(TestRequest(timeout: 1)) } }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(1)))
        clock.advance(by: .seconds(1))
        #expect(await task.value?.caseName == "timedOut")
    }

    @Test func theDeadlineSpansAttemptsAndBackoffs() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .hang])
        let engine = AsyncRequestEngine(session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 2)), deadline: .seconds(5)), clock: clock)
        let task = Task { await networkError { try await engine.send(TestRequest(timeout: 4)) } }
        // The backoff (due at 2 s) and the watchdog's sleeper, armed at 4 s for the first attempt
        // (it stays armed after that attempt answered; it re-arms when it wakes).
        await clock.waitForSleepers(2)
        clock.advance(by: .seconds(2))
        await session.waitForCalls(2)
        clock.advance(to: .init(offset: .seconds(4)))
        await clock.waitForSleepers(1)
        // 3 s of the deadline were left at 2 s, sooner than the attempt's own 4 s: due at 5, not 6.
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))
        clock.advance(to: .init(offset: .seconds(5)))
        #expect(await task.value?.caseName == "deadlineExceeded")
    }

    @Test func aRetryWhoseDelayWouldCrossTheDeadlineIsNotScheduled() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .ok("later")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 5)), deadline: .seconds(3), eventSink: recorder), clock: clock)
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "httpError(503)")  // the last failure, as with an empty budget
        #expect(session.callCount == 1)
        #expect(recorder.timeline == ["started", "failed(HTTP 503 (0 body bytes),0)"])  // no retryScheduled
    }

    @Test func aRequestsOwnDeadlineReplacesTheEnginesAndANonPositiveOneSendsNothing() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(60)), clock: clock)
        var request = TestRequest()
        request.deadline = .seconds(2)
        let task = Task { [request] in await networkError { try await engine.send(request) } }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(2)))
        clock.advance(by: .seconds(2))
        #expect(await task.value?.caseName == "deadlineExceeded")

        request.deadline = .zero
        #expect(await networkError { try await engine.send(request) }?.caseName == "deadlineExceeded")
        #expect(session.callCount == 1)
    }

    @Test func identicalReadsWithDifferentOwnDeadlinesAreNotShared() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        var short = TestRequest()
        short.deadline = .seconds(1)
        var long = TestRequest()
        long.deadline = .seconds(100)
        async let first = networkError { try await engine.send(short) }
        async let second = networkError { try await engine.send(long) }
        await session.waitForCalls(2)
        session.releaseHeld()
        _ = await (first, second)
        #expect(session.callCount == 2)
    }

    @Test func withoutADeadlineNothingIsScheduled() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(1)
        #expect(clock.sleeperCount == 0)
        session.releaseHeld()
        _ = try await task.value
    }
}

/// Hedging on a ManualClock: when a copy is sent, which answer wins, what is cancelled, the
/// budget rule, and which requests may be hedged.
@Suite("AsyncRequestEngine: hedging", .timeLimit(.minutes(1)))
struct AsyncRequestEngineHedgingTests {
    func engine(
        _ session: ScriptedNetworkSession,
        _ clock: ManualClock,
        maxAttempts: Int = 2,
        sink: HedgeRecorder? = nil,
        budget: RetryBudget? = nil
    ) -> AsyncRequestEngine {
        AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: nil, budget: budget), hedging: HedgingPolicy(delay: .milliseconds(100), maxAttempts: maxAttempts), eventSink: sink),
            clock: clock)
    }

    @Test func aSlowAttemptIsHedgedAfterTheDelayAndTheFirstAnswerWins() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("slow")), .ok("hedge")])
        let recorder = HedgeRecorder()
        let engine = engine(session, clock, sink: recorder)
        let task = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)  // the hedge timer
        #expect(session.callCount == 1)
        clock.advance(by: .milliseconds(100))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "hedge")
        #expect(session.callCount == 2)
        await session.waitUntilNoneSuspended()  // the slow copy was cancelled
        #expect(recorder.hedges.map(\.copy) == [1])
        #expect(recorder.hedges.first?.after == 0.1)
    }

    @Test func anAttemptAnsweredInTimeIsNotHedged() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.ok("fast")])
        let engine = engine(session, clock)
        _ = try await engine.send(TestRequest())
        #expect(session.callCount == 1)
        await clock.waitForSleepers(0)  // the timer was cancelled
    }

    @Test func atMostMaxAttemptsCopiesAreInFlight() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("held"))])
        let engine = engine(session, clock, maxAttempts: 3)
        let task = Task { try await engine.send(TestRequest()) }
        for copies in 1...3 {
            await session.waitForCalls(copies)
            if copies < 3 {
                await clock.waitForSleepers(1)
                clock.advance(by: .milliseconds(100))
            }
        }
        #expect(clock.sleeperCount == 0)  // no timer after the last copy
        #expect(session.callCount == 3)
        session.releaseHeld()
        _ = try await task.value
        #expect(session.callCount == 3)
    }

    @Test func aRetryableFailureDoesNotWinWhileAnotherCopyIsInFlight() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("slow")), .status(503)])
        let engine = engine(session, clock)
        let task = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        await session.waitForCalls(2)  // the hedge answered 503 at once
        session.releaseHeld()
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "slow")
    }

    @Test func whenEveryCopySentHasFailedTheNextGoesAtOnce() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .ok("second")])
        let engine = engine(session, clock)
        let (data, _) = try await engine.send(TestRequest())  // no clock advance needed
        #expect(String(decoding: data, as: UTF8.self) == "second")
        #expect(session.callCount == 2)
    }

    @Test func anAcceptableNon2xxAnswerWins() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(404)])
        let engine = engine(session, clock)
        #expect(await networkError { try await engine.send(TestRequest()) }?.caseName == "httpError(404)")
        #expect(session.callCount == 1)
    }

    @Test func hedgesDrawFromTheRetryBudgetAndStopWhenItIsEmpty() async throws {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 1, clock: clock)
        let session = ScriptedNetworkSession([.held(.ok("first")), .held(.ok("hedge")), .held(.ok("third"))])
        let engine = engine(session, clock, sink: nil, budget: budget)
        // The first request's hedge takes the only token.
        let first = Task { try await engine.send(TestRequest("/one")) }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        await session.waitForCalls(2)
        session.releaseHeld()
        _ = try await first.value
        #expect(budget.balance < 1)
        // The second request is not hedged: the budget is empty.
        let second = Task { try await engine.send(TestRequest("/two")) }
        await session.waitForCalls(3)
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        await clock.waitForSleepers(0)
        #expect(session.callCount == 3)
        session.releaseHeld()
        _ = try await second.value
        #expect(session.callCount == 3)
    }

    @Test func aPOSTIsHedgedOnlyWithAnIdempotencyKey() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = engine(session, clock)
        let plain = Task { try await engine.send(TestRequest(method: .post)) }
        await session.waitForCalls(1)
        #expect(clock.sleeperCount == 0)  // no hedge timer for a plain POST
        session.releaseHeld()
        _ = try await plain.value

        let keyed = Task { try await engine.send(TestRequest(method: .post, headers: ["Idempotency-Key": "k1"])) }
        await session.waitForCalls(2)
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        await session.waitForCalls(3)
        session.releaseHeld()
        _ = try await keyed.value
    }

    @Test func aCancelledCallerCancelsEveryCopy() async {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = engine(session, clock)
        let task = Task { await networkError { try await engine.send(TestRequest()) } }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        await session.waitForCalls(2)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        await session.waitUntilNoneSuspended()
    }
}

/// The per-host concurrency limit and the per-host breakers, wired into the engine.
@Suite("AsyncRequestEngine: per-host limits and breakers", .timeLimit(.minutes(1)))
struct AsyncRequestEngineHostLimitTests {
    @Test func attemptsBeyondTheHostsLimitWaitInLine() async throws {
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(limits: .init(concurrencyPerHost: 1)))
        let first = Task { try await engine.send(TestRequest(method: .post)) }
        await session.waitForCalls(1)
        let second = Task { try await engine.send(TestRequest(method: .post)) }
        let other = Task { try await engine.send(TestRequest(url: URL(string: "https://other.example.test/x")!, method: .post)) }
        await session.waitForCalls(2)  // the other host is not held back
        #expect(session.callCount == 2)
        session.releaseHeld()
        _ = try await first.value
        await session.waitForCalls(3)  // the waiting one got the place
        session.releaseHeld()
        _ = try await (second.value, other.value)
    }

    @Test func aFullWaitLineFailsWithLimitedAndSendsNothing() async throws {
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0)), limits: .init(concurrencyPerHost: 1, waitingPerHost: 0)))
        let first = Task { try await engine.send(TestRequest(method: .post)) }
        await session.waitForCalls(1)
        let error = await networkError { try await engine.send(TestRequest()) }
        guard case .limited(let rejection) = error else {
            Issue.record("expected limited, got \(String(describing: error))")
            return
        }
        #expect(rejection.reason == .concurrencyLimit(maxConcurrent: 1, maxWaiting: 0))
        #expect(error?.isRetryable == false)
        #expect(session.callCount == 1)
        session.releaseHeld()
        _ = try await first.value
    }

    @Test func theWaitForAPlaceCountsAgainstTheAttemptsTimeout() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(limits: .init(concurrencyPerHost: 1)), clock: clock)
        let first = Task { try await engine.send(TestRequest(method: .post)) }
        await session.waitForCalls(1)
        let second = Task { await networkError { try await engine.send(TestRequest(method: .post, timeout: 1)) } }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        #expect(await second.value?.caseName == "timedOut")
        #expect(session.callCount == 1)
        session.releaseHeld()
        _ = try await first.value
    }

    @Test func theRegistryKeepsOneBreakerPerHost() async throws {
        let clock = ManualClock()
        let registry = CircuitBreakerRegistry(
            configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5, openDuration: .seconds(30)),
            clock: clock
        )
        let session = ScriptedNetworkSession([.status(503), .status(503), .ok("b")])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perHost(registry)), clock: clock)
        let a = TestRequest(url: URL(string: "https://a.example.test/x")!)
        _ = await networkError { try await engine.send(a) }
        _ = await networkError { try await engine.send(a) }
        #expect(registry.states["a.example.test"] == .open)
        #expect(await networkError { try await engine.send(a) }?.caseName == "circuitOpen")
        #expect(session.callCount == 2)
        let b = TestRequest(url: URL(string: "https://b.example.test/x")!)
        _ = try await engine.send(b)
        #expect(registry.states["b.example.test"] == .closed)
        registry.reset(host: "a.example.test")
        _ = try await engine.send(a)  // the session now answers 200
    }

    @Test func hostLimitersAreBoundedByDroppingIdleOnes() {
        let limiters = HostLimiters<ConcurrencyLimiter>(maxConcurrent: 1, maxWaiting: 0)
        for index in 0..<(HostLimiters<ConcurrencyLimiter>.maximumHosts * 3) {
            _ = limiters.limiter(forAuthority: "h\(index).example.test")
        }
        #expect(limiters.count <= HostLimiters<ConcurrencyLimiter>.maximumHosts)
    }

    @Test func aHostWithoutATokenIsRefusedWithWhenOneIsDueAndOtherHostsAreNot() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.ok("a")])
        let engine = AsyncRequestEngine(session: session, configuration: .init(limits: .init(ratePerHost: HostRateLimit(permitsPerSecond: 2, burst: 1))), clock: clock)
        _ = try await engine.send(TestRequest())
        let error = await networkError { try await engine.send(TestRequest()) }
        guard case .limited(let rejection) = error else {
            Issue.record("expected limited, got \(String(describing: error))")
            return
        }
        #expect(rejection.reason == .rateLimit(retryAfter: .milliseconds(500)))
        _ = try await engine.send(TestRequest(url: URL(string: "https://other.example.test/x")!))
        #expect(session.callCount == 2)
        clock.advance(by: .milliseconds(500))
        _ = try await engine.send(TestRequest())
        #expect(session.callCount == 3)
    }

    @Test func aRateLimitWithMaxWaitWaitsOnTheEnginesClock() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.ok("a")])
        let engine = AsyncRequestEngine(session: session, configuration: .init(limits: .init(ratePerHost: HostRateLimit(permitsPerSecond: 1, burst: 1, maxWait: .seconds(2)))), clock: clock)
        _ = try await engine.send(TestRequest())
        let waiting = Task { try await engine.send(TestRequest()) }
        await clock.waitForSleepers(1)
        #expect(session.callCount == 1)
        clock.advance(by: .seconds(1))
        _ = try await waiting.value
        #expect(session.callCount == 2)
    }
}

/// What review found in the strategies, each pinned by the test that failed before its fix.
@Suite("AsyncRequestEngine: strategies under review's scenarios", .timeLimit(.minutes(1)))
struct AsyncRequestEngineStrategiesReviewTests {
    @Test func aHugeTotalDeadlineOrHedgingDelayNeverTraps() async throws {
        let session = ScriptedNetworkSession([.ok("x")])
        // The real clock: ContinuousClock traps when asked to sleep past its range.
        let deadlined = AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(Int64.max)))
        _ = try await deadlined.send(TestRequest())
        let hedged = AsyncRequestEngine(session: session, configuration: .init(hedging: HedgingPolicy(delay: .seconds(Int64.max))))
        _ = try await hedged.send(TestRequest())
        #expect(HedgingPolicy(delay: .seconds(Int64.max)).delay == .seconds(Int64.max / 2))
        #expect(session.callCount == 2)
    }

    @Test func aHedgeRefusedByTheHostsRateLimitDoesNotMaskTheRetryable503() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503), .ok("x")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(
                retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 1)), limits: .init(ratePerHost: HostRateLimit(permitsPerSecond: 1, burst: 1)),
                hedging: HedgingPolicy(delay: .milliseconds(100), maxAttempts: 2), eventSink: recorder), clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        // The 503 was retried, not the refusal of the copy sent at once after it.
        await recorder.wait { $0.contains { if case .retryScheduled = $0 { true } else { false } } }
        #expect(recorder.timeline == ["started", "retry(0,1.0)"])
        #expect(session.callCount == 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "x")
    }

    @Test func aRetryAfterFromOneCopyEndsTheRaceWithoutFurtherCopies() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503, headers: ["Retry-After": "2"]), .ok("x")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0.1)), hedging: HedgingPolicy(delay: .milliseconds(100), maxAttempts: 3), eventSink: recorder),
            clock: clock)
        let task = Task { try await engine.send(TestRequest()) }
        await recorder.wait { $0.contains { if case .retryScheduled = $0 { true } else { false } } }
        // The server's pause is honoured: no copy was sent at once after its 503.
        #expect(recorder.timeline == ["started", "retry(0,2.0)"])
        #expect(session.callCount == 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(2))
        _ = try await task.value
        #expect(session.callCount == 2)
    }

    @Test func attemptsThatTimeOutWaitingForAPlaceDoNotCountAgainstTheBreaker() async throws {
        let clock = ManualClock()
        let breaker = CircuitBreaker(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5), clock: clock)
        let session = ScriptedNetworkSession([.held(.ok("a"))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .shared(breaker), limits: .init(concurrencyPerHost: 1)), clock: clock)
        let first = Task { try await engine.send(TestRequest(method: .post)) }
        await session.waitForCalls(1)
        let waiting = (0..<2).map { _ in
            Task { await networkError { try await engine.send(TestRequest(method: .post, timeout: 1)) } }
        }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        for task in waiting { #expect(await task.value?.caseName == "timedOut") }
        #expect(breaker.state == .closed)  // the host never saw them
        session.releaseHeld()
        _ = try await first.value
    }

    @Test func attemptsCutByTheDeadlineOnTheWireCountAgainstTheBreaker() async {
        let clock = ManualClock()
        let breaker = CircuitBreaker(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5), clock: clock)
        let session = ScriptedNetworkSession([.hang])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .shared(breaker), deadline: .seconds(1)), clock: clock)
        for _ in 0..<2 {
            let task = Task { await networkError { try await engine.send(TestRequest(method: .post)) } }
            await session.waitUntilNoneSuspended()
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(1))
            #expect(await task.value?.caseName == "deadlineExceeded")
        }
        #expect(breaker.state == .open)  // a host that never answers opens its breaker
    }

    @Test func aFullTableOfBusyHostLimitersKeepsNoMore() async throws {
        let time = TimeSource(ManualClock())
        let limiters = HostLimiters<RateLimiter>(HostRateLimit(permitsPerSecond: 0, burst: 1), time: time)
        for index in 0..<HostLimiters<RateLimiter>.maximumHosts {
            try await limiters.limiter(forAuthority: "h\(index)").withPermit {}  // its only token: busy for good
        }
        let extra = limiters.limiter(forAuthority: "one-more")
        #expect(limiters.count == HostLimiters<RateLimiter>.maximumHosts)
        #expect(extra !== limiters.limiter(forAuthority: "one-more"))  // not kept
    }
}
