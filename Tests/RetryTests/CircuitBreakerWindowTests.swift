import ResilienceTesting
import Testing

@testable import Retry

/// The time-based window and the slow-call threshold, beside the count window.
@Suite("CircuitBreaker windows: time, slow calls")
struct CircuitBreakerWindowTests {
    private let clock = ManualClock()

    private func breaker(
        window: CircuitBreaker.Configuration.Window = .time(.seconds(10)),
        minimumCalls: Int = 2,
        failureRateThreshold: Double = 0.5,
        slowCallDuration: Duration? = nil,
        slowCallRateThreshold: Double = 0.5,
        halfOpenProbes: Int = 1
    ) -> CircuitBreaker {
        CircuitBreaker(
            configuration: .init(
                window: window,
                minimumCalls: minimumCalls,
                failureRateThreshold: failureRateThreshold,
                openDuration: .seconds(30),
                halfOpenProbes: halfOpenProbes,
                slowCallDuration: slowCallDuration,
                slowCallRateThreshold: slowCallRateThreshold
            ),
            clock: clock
        )
    }

    /// One call that takes `duration` on the clock and ends with `outcome`.
    private func call(_ breaker: CircuitBreaker, _ outcome: CircuitBreaker.Outcome, taking duration: Duration = .zero) throws {
        let permit = try #require(breaker.acquire())
        clock.advance(by: duration)
        breaker.record(outcome, for: permit)
    }

    @Test func aZeroSlowCallThresholdNeedsAtLeastOneSlowCall() throws {
        let breaker = breaker(failureRateThreshold: 1, slowCallDuration: .seconds(1), slowCallRateThreshold: 0)
        for _ in 0..<4 { try call(breaker, .success, taking: .milliseconds(10)) }
        #expect(breaker.state == .closed)  // no call was slow
        try call(breaker, .success, taking: .seconds(2))
        #expect(breaker.state == .open)
    }

    // MARK: Configuration

    @Test func windowSizeStillConfiguresACountWindow() {
        var configuration = CircuitBreaker.Configuration(windowSize: 7, minimumCalls: 3)
        #expect(configuration.window == .count(7))
        #expect(configuration.windowSize == 7)
        #expect(configuration.slowCallDuration == nil)
        configuration.windowSize = 0
        #expect(configuration.window == .count(1))
        configuration.window = .time(.seconds(60))
        #expect(configuration.windowSize == .max)
    }

    @Test func hostileWindowAndSlowCallValuesAreClamped() {
        let time = CircuitBreaker.Configuration(window: .time(.seconds(-5)), minimumCalls: 0, slowCallDuration: .seconds(-1), slowCallRateThreshold: .nan)
        #expect(time.window == .time(.milliseconds(1)))
        #expect(time.minimumCalls == 1)
        #expect(time.slowCallDuration == .zero)
        #expect(time.slowCallRateThreshold == 1)
        let count = CircuitBreaker.Configuration(window: .count(-3), minimumCalls: 50, slowCallRateThreshold: 7)
        #expect(count.window == .count(1))
        #expect(count.minimumCalls == 1)
        #expect(count.slowCallRateThreshold == 1)
        #expect(CircuitBreaker.Configuration(window: .time(.seconds(10)), minimumCalls: 500).minimumCalls == 500)
    }

    // MARK: Time window

    @Test func aTimeWindowOpensOnFailuresWithinTheWindow() throws {
        let breaker = breaker()
        try call(breaker, .failure)
        clock.advance(by: .seconds(5))
        try call(breaker, .failure)
        #expect(breaker.state == .open)
    }

    @Test func outcomesOlderThanTheWindowNoLongerCount() throws {
        let breaker = breaker()
        try call(breaker, .failure)
        clock.advance(by: .seconds(10))  // the first failure has left the window
        try call(breaker, .failure)
        #expect(breaker.state == .closed)
        clock.advance(by: .seconds(3))
        try call(breaker, .failure)  // two failures within 10 s
        #expect(breaker.state == .open)
    }

    @Test func anOutcomeLeavesBetweenNineTenthsAndAllOfTheWindow() {
        var machine = CircuitBreakerStateMachine(configuration: .init(window: .time(.seconds(10)), minimumCalls: 100))
        let permit = machine.acquire(now: .zero)
        guard case .allowed(let granted) = permit else { Issue.record("refused"); return }
        machine.record(.failure, for: granted, now: .milliseconds(500))  // bucket [0 s, 1 s)
        #expect(machine.windowTally(now: .milliseconds(9_999)).calls == 1)
        #expect(machine.windowTally(now: .seconds(10)).calls == 0)  // its bucket left at 10 s: 9.5 s after
    }

    @Test func aTimeWindowHoldsAnyNumberOfCallsInFixedMemory() throws {
        let breaker = breaker(minimumCalls: 10_000, failureRateThreshold: 0.5)
        for index in 0..<20_000 {
            try call(breaker, index % 3 == 0 ? .failure : .success, taking: .microseconds(100))
        }
        #expect(breaker.state == .closed)  // a third failed: under the threshold
        var failures = 0
        while breaker.state == .closed, failures < 10_000 {
            try call(breaker, .failure, taking: .microseconds(100))
            failures += 1
        }
        #expect(breaker.state == .open)
        #expect(failures == 6_666)  // (6 667 + 6 666) / 26 666 reaches one half
    }

    @Test func aTimeWindowStartsEmptyAfterTheBreakerCloses() throws {
        let breaker = breaker()
        try call(breaker, .failure)
        try call(breaker, .failure)
        clock.advance(by: .seconds(30))
        try call(breaker, .success)  // the probe closes it
        #expect(breaker.state == .closed)
        try call(breaker, .failure)
        #expect(breaker.state == .closed)  // one failure since closing
    }

    // MARK: Slow calls

    @Test func slowSuccessesOpenTheBreakerAtTheSlowCallRate() throws {
        let breaker = breaker(window: .count(4), slowCallDuration: .seconds(1), slowCallRateThreshold: 0.5)
        try call(breaker, .success, taking: .milliseconds(1_500))
        #expect(breaker.state == .closed)  // 1 call < minimumCalls
        try call(breaker, .success, taking: .seconds(2))
        #expect(breaker.state == .open)
    }

    @Test func aCallExactlyAsLongAsTheThresholdIsNotSlow() throws {
        let breaker = breaker(window: .count(4), slowCallDuration: .seconds(1), slowCallRateThreshold: 0.5)
        for _ in 0..<4 { try call(breaker, .success, taking: .seconds(1)) }
        #expect(breaker.state == .closed)
    }

    @Test func fastCallsKeepTheSlowShareUnderTheThreshold() throws {
        let breaker = breaker(window: .count(10), minimumCalls: 4, slowCallDuration: .milliseconds(200), slowCallRateThreshold: 0.5)
        try call(breaker, .success, taking: .milliseconds(300))
        try call(breaker, .success, taking: .milliseconds(10))
        try call(breaker, .success, taking: .milliseconds(10))
        try call(breaker, .success, taking: .milliseconds(10))
        #expect(breaker.state == .closed)  // 1 of 4 slow
        try call(breaker, .success, taking: .milliseconds(300))
        #expect(breaker.state == .closed)  // 2 of 5
        try call(breaker, .success, taking: .milliseconds(300))
        #expect(breaker.state == .open)  // 3 of 6 reaches 0.5
    }

    @Test func slowCallsDoNotCountWithoutASlowCallDuration() throws {
        let breaker = breaker(window: .count(4), slowCallDuration: nil)
        for _ in 0..<4 { try call(breaker, .success, taking: .seconds(600)) }
        #expect(breaker.state == .closed)
    }

    @Test func aSlowFailureCountsInBothShares() {
        var machine = CircuitBreakerStateMachine(
            configuration: .init(
                windowSize: 10, minimumCalls: 10, slowCallDuration: .seconds(1), slowCallRateThreshold: 1
            ))
        guard case .allowed(let permit) = machine.acquire(now: .zero) else { Issue.record("refused"); return }
        machine.record(.failure, for: permit, now: .seconds(5))
        #expect(machine.windowTally(now: .seconds(5)) == .init(calls: 1, failures: 1, slowCalls: 1))
    }

    @Test func ignoredCallsAreNeverSlow() throws {
        let breaker = breaker(window: .count(2), minimumCalls: 1, slowCallDuration: .seconds(1), slowCallRateThreshold: 0.1)
        try call(breaker, .ignored, taking: .seconds(10))
        #expect(breaker.state == .closed)
    }

    @Test func aSlowProbeReopensTheBreaker() throws {
        let breaker = breaker(window: .count(4), failureRateThreshold: 0.5, slowCallDuration: .seconds(1))
        try call(breaker, .failure)
        try call(breaker, .failure)
        clock.advance(by: .seconds(30))
        try call(breaker, .success, taking: .seconds(2))
        #expect(breaker.state == .open)
        #expect(breaker.retryAfter == .seconds(30))
        clock.advance(by: .seconds(30))
        try call(breaker, .success, taking: .milliseconds(500))
        #expect(breaker.state == .closed)
    }

    @Test func slowCallsInATimeWindow() throws {
        let breaker = breaker(window: .time(.seconds(60)), minimumCalls: 3, slowCallDuration: .seconds(2), slowCallRateThreshold: 0.6)
        try call(breaker, .success, taking: .seconds(3))
        try call(breaker, .success, taking: .seconds(3))
        try call(breaker, .success, taking: .seconds(1))
        #expect(breaker.state == .open)  // 2 of 3 slow ≥ 0.6
    }
}
