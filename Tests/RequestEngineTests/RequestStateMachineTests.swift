import Foundation
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("RequestStateMachine: a request's attempts, transition by transition")
struct RequestStateMachineTests {
    typealias Machine = RequestStateMachine

    private static let url = URL(string: "https://api.example.test/items")!

    private func response(_ status: Int, headers: [String: String] = [:]) -> Machine.Outcome {
        .success((Data("body".utf8), ResponseHead(HTTPURLResponse(url: Self.url, statusCode: status, httpVersion: nil, headerFields: headers)!)))
    }

    private func request(
        mayRetry: Bool = true,
        deadline: Duration? = nil,
        breaker: CircuitBreaker? = nil,
        throttle: RetryThrottle? = nil
    ) -> Execution {
        Execution(
            url: Self.url, method: .get, urlRequest: URLRequest(url: Self.url), invalid: nil, timeout: .seconds(10),
            maximumBodySize: nil, mayRetry: mayRetry, traceID: UUID(), started: .zero, priority: .medium, key: nil,
            deadline: deadline, breaker: breaker, throttle: throttle
        )
    }

    private func rules(
        policy: (any RetryPolicy)? = FixedIntervalRetryPolicy(maxRetries: 2, interval: 1),
        budget: RetryBudget? = nil,
        retryAfterCap: Duration? = .seconds(60)
    ) -> Machine.Rules {
        Machine.Rules(policy: policy, budget: budget, retryAfterCap: retryAfterCap, maximumDelay: .seconds(300))
    }

    private func breaker() -> CircuitBreaker {
        CircuitBreaker(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5), clock: ManualClock())
    }

    /// A machine with attempt `attempt` on the wire (started with no breaker, not cancelled).
    private func attempting(_ attempt: Int = 0) -> Machine {
        var machine = Machine(attempt: attempt)
        _ = machine.startAttempt(cancelled: false, deadline: nil, now: { .zero }, breaker: nil)
        return machine
    }

    private func name(_ action: Machine.Action) -> String {
        switch action {
        case .send(let attempt, let permit): "send(\(attempt), permit: \(permit != nil))"
        case .backOff(let delay, let attempt, let until): "backOff(\(delay), after: \(attempt), until: \(until))"
        case .succeed(_, let attempt): "succeed(\(attempt))"
        case .fail(let error, let response, let attempt, let throttled):
            "fail(\(label(error)), response: \(response != nil), \(attempt)\(throttled ? ", throttled" : ""))"
        case .leave(let attempt, let resumingAt, let notBefore):
            "leave(\(attempt), resumingAt: \(resumingAt), notBefore: \(notBefore.map { "\($0)" } ?? "nil"))"
        }
    }

    private func label(_ error: NetworkError) -> String {
        switch error {
        case .httpError(let status, _): "\(status)"
        case .deadlineExceeded: "deadline_exceeded"
        case .circuitOpen: "circuit_open"
        case .cancelled: "cancelled"
        case .timedOut: "timed_out"
        default: "\(error)"
        }
    }

    // MARK: Starting an attempt

    @Test func aReadyAttemptIsSentAndTheClockIsNotReadWithoutADeadline() {
        var machine = Machine()
        var reads = 0
        let action = machine.startAttempt(
            cancelled: false, deadline: nil,
            now: {
                reads += 1; return .zero
            }, breaker: nil)
        #expect(name(action) == "send(0, permit: false)")
        #expect(machine.state == .attempting(attempt: 0))
        #expect(reads == 0)
    }

    /// Race guarded: the caller cancelled between two attempts. Nothing is sent; the rest may go
    /// on in another task from the same attempt (a shared read others still wait for).
    @Test func aCancelledTaskLeavesBeforeSendingAndTheSameAttemptMayGoOn() {
        var machine = Machine(attempt: 2)
        let action = machine.startAttempt(cancelled: true, deadline: nil, now: { .zero }, breaker: nil)
        #expect(name(action) == "leave(2, resumingAt: 2, notBefore: nil)")
        #expect(machine.state == .finished)
    }

    @Test func anAttemptAtOrPastTheDeadlineFailsWithoutSendingAndOneJustBeforeIsSent() {
        for now in [Duration.seconds(5), .seconds(6)] {
            var machine = Machine(attempt: 1)
            let action = machine.startAttempt(cancelled: false, deadline: .seconds(5), now: { now }, breaker: nil)
            #expect(name(action) == "fail(deadline_exceeded, response: false, 1)")
            #expect(machine.state == .finished)
        }
        var before = Machine(attempt: 1)
        #expect(name(before.startAttempt(cancelled: false, deadline: .seconds(5), now: { .milliseconds(4_999) }, breaker: nil)) == "send(1, permit: false)")
    }

    @Test func anOpenBreakerFailsTheAttemptFastAndAClosedOneGivesAPermit() {
        let breaker = breaker()
        var first = Machine()
        #expect(name(first.startAttempt(cancelled: false, deadline: nil, now: { .zero }, breaker: breaker)) == "send(0, permit: true)")
        breaker.isolate()
        var second = Machine()
        #expect(name(second.startAttempt(cancelled: false, deadline: nil, now: { .zero }, breaker: breaker)) == "fail(circuit_open, response: false, 0)")
        #expect(second.state == .finished)
    }

    // MARK: An attempt's result

    @Test func a2xxSucceedsAndEndsTheRequest() {
        var machine = attempting()
        let action = machine.attemptEnded(response(204), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero })
        #expect(name(action) == "succeed(0)")
        #expect(machine.state == .finished)
    }

    @Test func aRetryableFailureBacksOffByThePolicyThenTheNextAttemptIsReady() {
        var machine = attempting()
        let action = machine.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .seconds(7) })
        #expect(name(action) == "backOff(1.0 seconds, after: 0, until: 8.0 seconds)")
        #expect(machine.state == .backingOff(attempt: 1, until: .seconds(8)))
        machine.backoffEnded()
        #expect(machine.state == .ready(attempt: 1))
        #expect(name(machine.startAttempt(cancelled: false, deadline: nil, now: { .seconds(8) }, breaker: nil)) == "send(1, permit: false)")
    }

    @Test func aFailureThatIsNotRetryableFailsAtOnceWithItsResponse() {
        var machine = attempting()
        let action = machine.attemptEnded(response(404), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero })
        #expect(name(action) == "fail(404, response: true, 0)")
    }

    @Test func withoutAPolicyOrOnceItGivesUpARetryableFailureFails() {
        var noPolicy = attempting()
        #expect(
            name(noPolicy.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(policy: nil), now: { .zero }))
                == "fail(503, response: true, 0)")
        var exhausted = attempting(2)  // FixedIntervalRetryPolicy(maxRetries: 2): attempts 0 and 1 are retried
        #expect(
            name(exhausted.attemptEnded(.failure(.timedOut), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero }))
                == "fail(timed_out, response: false, 2)")
    }

    @Test func aRequestThatMayNotBeRetriedIsNot() {
        var machine = attempting()
        let action = machine.attemptEnded(response(503), permit: nil, cancelled: false, request: request(mayRetry: false), rules: rules(), now: { .zero })
        #expect(name(action) == "fail(503, response: true, 0)")
    }

    @Test func retryAfterOn503ReplacesThePolicysDelayUpToItsCap() {
        var honoured = attempting()
        #expect(
            name(honoured.attemptEnded(response(503, headers: ["Retry-After": "3"]), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero }))
                == "backOff(3.0 seconds, after: 0, until: 3.0 seconds)")
        var capped = attempting()
        #expect(
            name(capped.attemptEnded(response(503, headers: ["Retry-After": "120"]), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero }))
                == "backOff(60.0 seconds, after: 0, until: 60.0 seconds)")
        var ignored = attempting()
        #expect(
            name(ignored.attemptEnded(response(503, headers: ["Retry-After": "3"]), permit: nil, cancelled: false, request: request(), rules: rules(retryAfterCap: nil), now: { .zero }))
                == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
    }

    @Test func aRetryThatWouldStartAtOrPastTheDeadlineIsNotScheduledAndOneJustBeforeIs() {
        for now in [Duration.seconds(9), .milliseconds(9_500)] {  // + 1 s of backoff: at, past the deadline
            var machine = attempting()
            let action = machine.attemptEnded(response(503), permit: nil, cancelled: false, request: request(deadline: .seconds(10)), rules: rules(), now: { now })
            #expect(name(action) == "fail(503, response: true, 0)")
            #expect(machine.state == .finished)
        }
        var before = attempting()
        let action = before.attemptEnded(response(503), permit: nil, cancelled: false, request: request(deadline: .seconds(10)), rules: rules(), now: { .milliseconds(8_999) })
        #expect(name(action) == "backOff(1.0 seconds, after: 0, until: 9.999 seconds)")
    }

    @Test func aRetryAfterThatWouldStartPastTheDeadlineIsNotScheduled() {
        var machine = attempting()
        let action = machine.attemptEnded(
            response(429, headers: ["Retry-After": "30"]), permit: nil, cancelled: false, request: request(deadline: .seconds(20)), rules: rules(), now: { .zero })
        #expect(name(action) == "fail(429, response: true, 0)")
    }

    /// The deadline and the throttle are asked before the budget: a retry they refuse spends no
    /// budget token.
    @Test func aRetryRefusedByTheDeadlineOrTheThrottleSpendsNoBudgetToken() throws {
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 1, clock: ManualClock())
        let throttle = RetryThrottle(try RetryThrottling(maxTokens: 2, tokenRatio: 1))
        var pastDeadline = attempting()
        _ = pastDeadline.attemptEnded(response(503), permit: nil, cancelled: false, request: request(deadline: .seconds(1)), rules: rules(budget: budget), now: { .zero })
        var throttled = attempting()
        #expect(
            name(throttled.attemptEnded(response(503), permit: nil, cancelled: false, request: request(throttle: throttle), rules: rules(budget: budget), now: { .zero }))
                == "fail(503, response: true, 0, throttled)")
        var allowed = attempting()
        #expect(
            name(allowed.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(budget: budget), now: { .zero }))
                == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
    }

    @Test func theHostsRetryThrottleRefusesARetryAtHalfItsTokensAndAnAnswerGivesOneBack() throws {
        let throttle = RetryThrottle(try RetryThrottling(maxTokens: 4, tokenRatio: 1))
        // 4 → 3 → 2 tokens: at half, no more retries.
        var first = attempting()
        #expect(
            name(first.attemptEnded(response(503), permit: nil, cancelled: false, request: request(throttle: throttle), rules: rules(), now: { .zero }))
                == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
        var second = attempting()
        #expect(
            name(second.attemptEnded(response(503), permit: nil, cancelled: false, request: request(throttle: throttle), rules: rules(), now: { .zero }))
                == "fail(503, response: true, 0, throttled)")
        #expect(throttle.tokenCount == 2)
        var answered = attempting()
        _ = answered.attemptEnded(response(200), permit: nil, cancelled: false, request: request(throttle: throttle), rules: rules(), now: { .zero })
        #expect(throttle.tokenCount == 3)
    }

    @Test func anEmptyRetryBudgetFailsTheRequest() {
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 1, clock: ManualClock())
        var first = attempting()
        #expect(
            name(first.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(budget: budget), now: { .zero }))
                == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
        var second = attempting()
        #expect(name(second.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(budget: budget), now: { .zero })) == "fail(503, response: true, 0)")
    }

    @Test func failuresCountAgainstTheBreakerThroughTheirPermits() {
        let breaker = breaker()
        for _ in 0..<2 {
            var machine = Machine()
            guard case .send(_, let permit) = machine.startAttempt(cancelled: false, deadline: nil, now: { .zero }, breaker: breaker) else {
                Issue.record("no permit")
                return
            }
            _ = machine.attemptEnded(.failure(.transport(.connectionLost)), permit: permit, cancelled: false, request: request(breaker: breaker), rules: rules(policy: nil), now: { .zero })
        }
        #expect(breaker.state == .open)
    }

    /// Race guarded: the caller cancelled while its attempt was on the wire. The transport's
    /// cancellation is not a failure to retry: the task leaves and the attempt may be sent anew by
    /// whoever carries the request on.
    @Test func anAttemptCancelledWithItsTaskLeavesAndIsNotRetriedNorCountedAgainstTheHost() {
        let breaker = breaker()
        var machine = Machine(attempt: 1)
        guard case .send(_, let permit) = machine.startAttempt(cancelled: false, deadline: nil, now: { .zero }, breaker: breaker) else {
            Issue.record("no permit")
            return
        }
        let action = machine.attemptEnded(.failure(.cancelled), permit: permit, cancelled: true, request: request(breaker: breaker), rules: rules(), now: { .zero })
        #expect(name(action) == "leave(1, resumingAt: 1, notBefore: nil)")
        #expect(machine.state == .finished)
        // The cancellation was ignored: one failure now is one call in the window, below minimumCalls.
        _ = breaker.acquire().map { breaker.record(.failure, for: $0) }
        #expect(breaker.state == .closed)
    }

    /// A transport's own cancellation (the task was not cancelled) ends the request: it is not a
    /// failure to retry, and says nothing of the host.
    @Test func anAttemptCancelledWhileItsTaskIsNotFailsAsCancelled() {
        var machine = attempting()
        let action = machine.attemptEnded(.failure(.cancelled), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .zero })
        #expect(name(action) == "fail(cancelled, response: false, 0)")
    }

    /// A transport may report the caller's cancellation as another failure: a cancelled task
    /// never schedules a retry.
    @Test func aCancelledTaskDoesNotRetryWhateverTheFailure() {
        var machine = attempting()
        let action = machine.attemptEnded(.failure(.timedOut), permit: nil, cancelled: true, request: request(), rules: rules(), now: { .zero })
        #expect(name(action) == "fail(timed_out, response: false, 0)")
    }

    // MARK: An attempt cut by its limit (the timeout hand-over)

    @Test func anAttemptCutByItsTimeoutIsRetriedAndCountsAgainstTheHost() {
        let breaker = breaker()
        var permits: [CircuitBreaker.Permit] = []
        for _ in 0..<2 { permits.append(breaker.acquire()!) }
        for permit in permits {
            var machine = Machine(cutAttempt: 0)
            let action = machine.attemptCut(
                TimedOutAttempt(permit: permit, abandoned: false), cancelled: false, request: request(breaker: breaker), rules: rules(), now: { .zero })
            #expect(name(action) == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
        }
        #expect(breaker.state == .open)
    }

    @Test func anAttemptCutByTheDeadlineFailsAsDeadlineExceededAndCountsOnlyIfItWasOnTheWire() {
        let breaker = breaker()
        var onTheWire = Machine(cutAttempt: 0)
        let cut = onTheWire.attemptCut(
            TimedOutAttempt(permit: breaker.acquire(), abandoned: false, endsAtDeadline: true), cancelled: false, request: request(breaker: breaker), rules: rules(), now: { .zero })
        #expect(name(cut) == "fail(deadline_exceeded, response: false, 0)")
        var waiting = Machine(cutAttempt: 0)
        _ = waiting.attemptCut(
            TimedOutAttempt(permit: breaker.acquire(), abandoned: false, endsAtDeadline: true, sent: false), cancelled: false, request: request(breaker: breaker),
            rules: rules(), now: { .zero })
        #expect(breaker.state == .closed)  // one failure and one ignored: below minimumCalls
        var another = Machine(cutAttempt: 0)
        _ = another.attemptCut(
            TimedOutAttempt(permit: breaker.acquire(), abandoned: false, endsAtDeadline: true), cancelled: false, request: request(breaker: breaker), rules: rules(), now: { .zero })
        #expect(breaker.state == .open)
    }

    @Test func anAttemptCutByItsTimeoutBeforeItWasOnTheWireIsRetriedAndNotCounted() {
        let breaker = breaker()
        for _ in 0..<2 {
            var machine = Machine(cutAttempt: 0)
            let action = machine.attemptCut(
                TimedOutAttempt(permit: breaker.acquire(), abandoned: false, sent: false), cancelled: false, request: request(breaker: breaker), rules: rules(),
                now: { .zero })
            #expect(name(action) == "backOff(1.0 seconds, after: 0, until: 1.0 seconds)")
        }
        #expect(breaker.state == .closed)
    }

    /// Race guarded: the timeout fires after every waiter left. The request ends as cancelled, as
    /// it would have without the timeout: no retry, nothing counted against the host.
    @Test func anAttemptCutAfterEveryWaiterLeftEndsAsCancelled() {
        let breaker = breaker()
        for abandoned in [true, false] {
            var machine = Machine(cutAttempt: 3)
            let action = machine.attemptCut(
                TimedOutAttempt(permit: breaker.acquire(), abandoned: abandoned), cancelled: !abandoned, request: request(breaker: breaker), rules: rules(), now: { .zero })
            #expect(name(action) == "fail(cancelled, response: false, 3)")
        }
        #expect(breaker.state == .closed)
    }

    // MARK: Backoff

    /// Race guarded: the caller cancelled during the backoff. The task leaves; the next attempt
    /// may be sent by whoever carries the request on, not before the backoff would have ended.
    @Test func aBackoffInterruptedLeavesWithTheNextAttemptAndWhenItWasDue() {
        var machine = attempting(1)
        _ = machine.attemptEnded(response(503), permit: nil, cancelled: false, request: request(), rules: rules(), now: { .seconds(2) })
        let action = machine.backoffInterrupted()
        #expect(name(action) == "leave(1, resumingAt: 2, notBefore: 3.0 seconds)")
        #expect(machine.state == .finished)
    }
}

@Suite("RequestStateMachine.HedgedAttempt: one attempt's hedged copies, transition by transition")
struct HedgedAttemptTests {
    typealias Machine = RequestStateMachine.HedgedAttempt

    private static let url = URL(string: "https://api.example.test/items")!

    private func response(_ status: Int, headers: [String: String] = [:]) -> RequestStateMachine.Outcome {
        .success((Data(), ResponseHead(HTTPURLResponse(url: Self.url, statusCode: status, httpVersion: nil, headerFields: headers)!)))
    }

    private func name(_ step: Machine.Step) -> String {
        switch step {
        case .launch(let copy, let armTimer): "launch(\(copy)\(armTimer ? ", timer" : ""))"
        case .decide(.success(let (_, response))): "decide(\(response.statusCode))"
        case .decide(.failure(let error)): "decide(\(error))"
        case .wait: "wait"
        }
    }

    @Test func theFirstCopyGoesWithATimerAndTheLastWithout() {
        var machine = Machine(maxCopies: 2)
        #expect(name(machine.start()) == "launch(0, timer)")
        #expect(name(machine.timerFired(mayHedge: { true })) == "launch(1)")
        #expect(name(machine.timerFired(mayHedge: { true })) == "wait")  // no copy left
        var single = Machine(maxCopies: 1)
        #expect(name(single.start()) == "launch(0)")
    }

    @Test func theTimerSendsNoCopyTheThrottleOrBudgetRefuses() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        #expect(name(machine.timerFired(mayHedge: { false })) == "wait")
        #expect(machine.launched == 1)
    }

    /// Race guarded: two copies answering together. The first answer fed decides; the other,
    /// and a timer that fires after, change nothing.
    @Test func theFirstAcceptableAnswerDecidesOnceAndLaterAnswersAndTimersAreDropped() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        _ = machine.timerFired(mayHedge: { true })
        #expect(name(machine.answered(response(200), mayHedge: { true })) == "decide(200)")
        #expect(name(machine.answered(response(201), mayHedge: { true })) == "wait")
        #expect(name(machine.timerFired(mayHedge: { true })) == "wait")
        #expect(name(machine.cancelled()) == "wait")
    }

    @Test func aRetryableFailureWaitsForTheOtherCopiesAndWhenAllFailedTheNextGoesAtOnce() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        _ = machine.timerFired(mayHedge: { true })
        #expect(name(machine.answered(response(503), mayHedge: { true })) == "wait")  // copy 1 still out
        #expect(name(machine.answered(.failure(.timedOut), mayHedge: { true })) == "launch(2)")
        #expect(name(machine.answered(response(502), mayHedge: { true })) == "decide(502)")  // none left
    }

    @Test func whenAllFailedAndNoCopyMayGoTheLastFailureDecides() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        #expect(name(machine.answered(response(503), mayHedge: { false })) == "decide(503)")
    }

    @Test func aRetryableStatusWithRetryAfterEndsTheRaceAtOnce() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        _ = machine.timerFired(mayHedge: { true })
        #expect(name(machine.answered(response(503, headers: ["Retry-After": "2"]), mayHedge: { true })) == "decide(503)")
    }

    @Test func aLimitersRefusalSaysNothingAndTheRaceEndsWithARealFailureIfThereWasOne() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        _ = machine.timerFired(mayHedge: { true })
        #expect(name(machine.answered(response(500), mayHedge: { true })) == "wait")
        let refused = machine.answered(.failure(.limited(LimiterRejection(reason: .concurrencyLimit(maxConcurrent: 1, maxWaiting: 0)))), mayHedge: { true })
        #expect(name(refused) == "decide(500)")  // the server's failure, and no copy at once after a refusal
        var onlyRefused = Machine(maxCopies: 2)
        _ = onlyRefused.start()
        let alone = onlyRefused.answered(.failure(.limited(LimiterRejection(reason: .concurrencyLimit(maxConcurrent: 1, maxWaiting: 0)))), mayHedge: { true })
        guard case .decide(.failure(.limited)) = alone else {
            Issue.record("expected the refusal itself, got \(name(alone))")
            return
        }
    }

    @Test func aCopyCancelledOnItsOwnSaysNothingWhileAnotherIsOut() {
        var machine = Machine(maxCopies: 3)
        _ = machine.start()
        _ = machine.timerFired(mayHedge: { true })
        #expect(name(machine.answered(.failure(.cancelled), mayHedge: { true })) == "wait")
        #expect(machine.lastFailure == nil)
        #expect(name(machine.answered(response(200), mayHedge: { true })) == "decide(200)")
    }

    /// Race guarded: the attempt cancelled before the race installed its continuation. The
    /// decision is recorded; whoever installs later takes it.
    @Test func aCancelledAttemptDecidesCancelledOnce() {
        var machine = Machine(maxCopies: 2)
        #expect(name(machine.cancelled()) == "decide(cancelled)")
        #expect(machine.decided)
        #expect(name(machine.cancelled()) == "wait")
    }
}
