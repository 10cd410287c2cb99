import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("CircuitBreaker")
struct CircuitBreakerTests {
    private let clock = ManualClock()

    private func breaker(
        windowSize: Int = 4,
        minimumCalls: Int = 2,
        openDuration: Duration = .seconds(30),
        halfOpenProbes: Int = 1
    ) -> CircuitBreaker {
        CircuitBreaker(
            configuration: .init(
                windowSize: windowSize,
                minimumCalls: minimumCalls,
                failureRateThreshold: 0.5,
                openDuration: openDuration,
                halfOpenProbes: halfOpenProbes
            ),
            clock: clock
        )
    }

    private func fail(_ breaker: CircuitBreaker, times: Int) throws {
        for _ in 0..<times {
            breaker.record(.failure, for: try #require(breaker.acquire()))
        }
    }

    @Test func closedBreakerHandsOutPermitsAndCountsOutcomes() throws {
        let breaker = breaker()
        #expect(breaker.state == .closed)
        #expect(breaker.retryAfter == .zero)
        let permit = try #require(breaker.acquire())
        breaker.record(.failure, for: permit)
        #expect(breaker.state == .closed)  // 1 call < minimumCalls
        try fail(breaker, times: 1)
        #expect(breaker.state == .open)
    }

    @Test func openBreakerRefusesUntilOpenDurationHasPassedOnTheClock() throws {
        let breaker = breaker(openDuration: .seconds(30))
        try fail(breaker, times: 2)
        #expect(breaker.acquire() == nil)
        clock.advance(by: .seconds(29))
        #expect(breaker.acquire() == nil)
        #expect(breaker.state == .open)
        clock.advance(by: .seconds(1))
        #expect(breaker.state == .halfOpen)
        let probe = try #require(breaker.acquire())
        #expect(probe.isProbe)
        #expect(breaker.acquire() == nil)  // one probe only
    }

    @Test func openDurationCountsFromTheClockOriginOfTheBreaker() throws {
        clock.advance(by: .seconds(1_000))  // the clock is not at zero when the breaker is made
        let breaker = breaker(openDuration: .seconds(10))
        try fail(breaker, times: 2)
        #expect(breaker.retryAfter == .seconds(10))
        clock.advance(by: .seconds(10))
        #expect(breaker.acquire() != nil)
    }

    @Test func retryAfterCountsDownWhileOpen() throws {
        let breaker = breaker(openDuration: .seconds(30))
        try fail(breaker, times: 2)
        #expect(breaker.retryAfter == .seconds(30))
        clock.advance(by: .seconds(10))
        #expect(breaker.retryAfter == .seconds(20))
        clock.advance(by: .milliseconds(19_500))
        #expect(breaker.retryAfter == .milliseconds(500))
        clock.advance(by: .seconds(1))
        #expect(breaker.retryAfter == .zero)
    }

    @Test func failedProbeReopensForAFullOpenDuration() throws {
        let breaker = breaker(openDuration: .seconds(30))
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        let probe = try #require(breaker.acquire())
        clock.advance(by: .seconds(5))
        breaker.record(.failure, for: probe)
        #expect(breaker.state == .open)
        #expect(breaker.retryAfter == .seconds(30))
        clock.advance(by: .seconds(29))
        #expect(breaker.acquire() == nil)
        clock.advance(by: .seconds(1))
        #expect(breaker.acquire() != nil)
    }

    @Test func allProbesSucceedingCloseTheBreaker() throws {
        let breaker = breaker(halfOpenProbes: 2)
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        let first = try #require(breaker.acquire())
        let second = try #require(breaker.acquire())
        #expect(breaker.acquire() == nil)
        breaker.record(.success, for: first)
        #expect(breaker.state == .halfOpen)
        breaker.record(.success, for: second)
        #expect(breaker.state == .closed)
        try fail(breaker, times: 1)
        #expect(breaker.state == .closed)  // the window restarted empty
    }

    @Test func ignoredProbeFreesItsSlot() throws {
        let breaker = breaker()
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        let probe = try #require(breaker.acquire())
        #expect(breaker.acquire() == nil)
        breaker.record(.ignored, for: probe)
        #expect(breaker.acquire() != nil)
    }

    @Test func stalePermitFromBeforeOpeningCannotCloseTheBreaker() throws {
        let breaker = breaker()
        let slow = try #require(breaker.acquire())  // taken while closed
        try fail(breaker, times: 2)  // opens
        clock.advance(by: .seconds(30))
        let probe = try #require(breaker.acquire())  // half-open
        breaker.record(.success, for: slow)
        #expect(breaker.state == .halfOpen)
        #expect(breaker.acquire() == nil)
        breaker.record(.success, for: probe)
        #expect(breaker.state == .closed)
    }

    // MARK: run(_:)

    @Test func runReturnsTheValueAndRecordsSuccess() async throws {
        let breaker = breaker()
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        #expect(try await breaker.run { 42 } == 42)  // the half-open probe
        #expect(breaker.state == .closed)
    }

    @Test func runRecordsThrownErrorsAsFailures() async throws {
        let breaker = breaker()
        for _ in 0..<2 {
            await #expect(throws: TestError.permanent) {
                try await breaker.run { () async throws -> Int in throw TestError.permanent }
            }
        }
        #expect(breaker.state == .open)
    }

    @Test func runThrowsOpenErrorWithoutRunningTheOperationWhileOpen() async throws {
        let breaker = breaker(openDuration: .seconds(30))
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(10))
        let ran = Log<Int>()
        await #expect(throws: CircuitBreaker.OpenError(retryAfter: .seconds(20))) {
            try await breaker.run { ran.append(1) }
        }
        #expect(ran.count == 0)
    }

    @Test func runThrowsOpenErrorWithZeroRetryAfterWhenAllProbeSlotsAreTaken() async throws {
        let breaker = breaker()
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        let probe = try #require(breaker.acquire())
        await #expect(throws: CircuitBreaker.OpenError(retryAfter: .zero)) {
            try await breaker.run { 1 }
        }
        breaker.record(.success, for: probe)
    }

    @Test func runRecordsCancellationErrorAsIgnored() async throws {
        let breaker = breaker()
        try fail(breaker, times: 2)
        clock.advance(by: .seconds(30))
        await #expect(throws: CancellationError.self) {
            try await breaker.run { () async throws -> Int in throw CancellationError() }
        }
        #expect(breaker.state == .halfOpen)  // not reopened
        #expect(breaker.acquire() != nil)  // and the probe slot is free again
    }

    @Test func runCancellationWhileClosedDoesNotCount() async throws {
        let breaker = breaker(windowSize: 1, minimumCalls: 1)
        for _ in 0..<5 {
            await #expect(throws: CancellationError.self) {
                try await breaker.run { () async throws -> Int in throw CancellationError() }
            }
        }
        #expect(breaker.state == .closed)
    }

    @Test func runCountsErrorsThatIsFailureRejectsAsSuccesses() async throws {
        let breaker = breaker()
        for _ in 0..<4 {
            await #expect(throws: TestError.permanent) {
                try await breaker.run(isFailure: { _ in false }) { () async throws -> Int in throw TestError.permanent }
            }
        }
        #expect(breaker.state == .closed)
    }
}
