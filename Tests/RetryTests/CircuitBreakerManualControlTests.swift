import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

/// Manual control (`isolate()`, `reset()`) and the state-change stream.
@Suite("CircuitBreaker manual control and state changes", .timeLimit(.minutes(1)))
struct CircuitBreakerManualControlTests {
    private let clock = ManualClock()

    private func breaker(halfOpenProbes: Int = 1) -> CircuitBreaker {
        CircuitBreaker(
            configuration: .init(windowSize: 4, minimumCalls: 2, failureRateThreshold: 0.5, openDuration: .seconds(30), halfOpenProbes: halfOpenProbes),
            clock: clock
        )
    }

    private func fail(_ breaker: CircuitBreaker, times: Int) throws {
        for _ in 0..<times {
            breaker.record(.failure, for: try #require(breaker.acquire()))
        }
    }

    private func change(_ from: CircuitBreaker.State, _ to: CircuitBreaker.State) -> CircuitBreakerStateChange {
        CircuitBreakerStateChange(host: nil, from: from, to: to)
    }

    // MARK: isolate / reset

    @Test func isolateHoldsTheBreakerOpenWhateverTheClockSays() throws {
        let breaker = breaker()
        breaker.isolate()
        #expect(breaker.isIsolated)
        #expect(breaker.state == .open)
        #expect(breaker.acquire() == nil)
        clock.advance(by: .seconds(3_600))
        #expect(breaker.state == .open)
        #expect(breaker.acquire() == nil)
        #expect(breaker.retryAfter == .seconds(30))  // a hint: only reset() ends it
    }

    @Test func runWhileIsolatedThrowsOpenErrorWithoutRunning() async {
        let breaker = breaker()
        breaker.isolate()
        let ran = Log<Int>()
        await #expect(throws: CircuitBreaker.OpenError(retryAfter: .seconds(30))) {
            try await breaker.run { ran.append(1) }
        }
        #expect(ran.count == 0)
    }

    @Test func outcomesOfCallsRunningWhenIsolatedAreIgnored() throws {
        let breaker = breaker()
        let running = try #require(breaker.acquire())
        breaker.isolate()
        breaker.record(.success, for: running)
        #expect(breaker.isIsolated)
        breaker.reset()
        breaker.record(.failure, for: running)  // stale after the reset too
        try fail(breaker, times: 1)
        #expect(breaker.state == .closed)  // one failure counted, not two
    }

    @Test func resetClosesAnIsolatedBreakerWithAnEmptyWindow() throws {
        let breaker = breaker()
        try fail(breaker, times: 1)
        breaker.isolate()
        breaker.reset()
        #expect(!breaker.isIsolated)
        #expect(breaker.state == .closed)
        #expect(breaker.retryAfter == .zero)
        try fail(breaker, times: 1)
        #expect(breaker.state == .closed)  // the failure before the isolation was forgotten
        try fail(breaker, times: 1)
        #expect(breaker.state == .open)
    }

    @Test func resetClosesAnOpenOrHalfOpenBreaker() throws {
        let breaker = breaker(halfOpenProbes: 2)
        try fail(breaker, times: 2)
        #expect(breaker.state == .open)
        breaker.reset()
        #expect(breaker.state == .closed)
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        let probe = try #require(breaker.acquire())
        breaker.reset()
        #expect(breaker.state == .closed)
        breaker.record(.failure, for: probe)  // the old probe's failure does not reopen it
        #expect(breaker.state == .closed)
    }

    @Test func isolatingAnOpenBreakerOutlastsItsOpenDuration() throws {
        let breaker = breaker()
        try fail(breaker, times: 2)
        breaker.isolate()
        clock.advance(by: .seconds(31))
        #expect(breaker.state == .open)
        #expect(breaker.acquire() == nil)
    }

    // MARK: stateChanges

    @Test func theStreamReportsEachTransitionInOrder() async throws {
        let breaker = breaker()
        let changes = StreamCollector(breaker.stateChanges)
        try fail(breaker, times: 2)  // closed → open
        clock.advance(by: .seconds(30))
        #expect(breaker.state == .halfOpen)  // seen by `state`, not reported yet
        let probe = try #require(breaker.acquire())  // open → half-open, when the probe goes through
        breaker.record(.failure, for: probe)  // half-open → open
        clock.advance(by: .seconds(30))
        let second = try #require(breaker.acquire())  // open → half-open
        breaker.record(.success, for: second)  // half-open → closed
        await changes.wait(for: 5)
        #expect(
            changes.items == [
                change(.closed, .open),
                change(.open, .halfOpen),
                change(.halfOpen, .open),
                change(.open, .halfOpen),
                change(.halfOpen, .closed),
            ])
    }

    @Test func manualControlIsReportedAndNoOpsAreNot() async throws {
        let breaker = breaker()
        let changes = StreamCollector(breaker.stateChanges)
        breaker.reset()  // closed already: nothing
        breaker.isolate()  // closed → open
        breaker.isolate()  // open already: nothing
        breaker.reset()  // open → closed
        try fail(breaker, times: 2)
        breaker.isolate()  // open (by failures) → open (isolated): still open, nothing
        breaker.reset()
        await changes.wait(for: 4)
        #expect(changes.items == [change(.closed, .open), change(.open, .closed), change(.closed, .open), change(.open, .closed)])
    }

    @Test func everySubscriberGetsEveryChangeFromWhenItSubscribed() async throws {
        let breaker = breaker()
        let early = StreamCollector(breaker.stateChanges)
        breaker.isolate()
        let late = StreamCollector(breaker.stateChanges)
        breaker.reset()
        await early.wait(for: 2)
        await late.wait(for: 1)
        #expect(early.items == [change(.closed, .open), change(.open, .closed)])
        #expect(late.items == [change(.open, .closed)])
    }

    @Test func aBreakerOnItsOwnReportsNoHost() async {
        let breaker = breaker()
        #expect(breaker.host == nil)
        let changes = StreamCollector(breaker.stateChanges)
        breaker.isolate()
        await changes.wait(for: 1)
        #expect(changes.items.first?.host == nil)
    }
}
