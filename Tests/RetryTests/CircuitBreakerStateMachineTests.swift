import Testing

@testable import Retry

private typealias Machine = CircuitBreakerStateMachine
private typealias Permit = CircuitBreaker.Permit

extension CircuitBreakerStateMachine.Decision {
    fileprivate var permit: CircuitBreaker.Permit? {
        if case .allowed(let permit) = self { permit } else { nil }
    }
}

extension CircuitBreakerStateMachine {
    /// Acquires a permit that must be granted.
    fileprivate mutating func permit(at now: Duration, sourceLocation: SourceLocation = #_sourceLocation) throws -> CircuitBreaker.Permit {
        try #require(acquire(now: now).permit, sourceLocation: sourceLocation)
    }

    /// One whole call: acquire (must be granted) and record `outcome` at the same instant.
    fileprivate mutating func call(_ outcome: CircuitBreaker.Outcome, at now: Duration, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let permit = try permit(at: now, sourceLocation: sourceLocation)
        record(outcome, for: permit, now: now)
    }

    /// Records `outcomes` one call each, all at `now`.
    fileprivate mutating func calls(_ outcomes: [CircuitBreaker.Outcome], at now: Duration, sourceLocation: SourceLocation = #_sourceLocation) throws {
        for outcome in outcomes {
            try call(outcome, at: now, sourceLocation: sourceLocation)
        }
    }
}

@Suite("CircuitBreakerStateMachine")
struct CircuitBreakerStateMachineTests {
    private static func machine(
        windowSize: Int = 10,
        minimumCalls: Int = 4,
        failureRateThreshold: Double = 0.5,
        openDuration: Duration = .seconds(30),
        halfOpenProbes: Int = 1
    ) -> Machine {
        Machine(
            configuration: .init(
                windowSize: windowSize,
                minimumCalls: minimumCalls,
                failureRateThreshold: failureRateThreshold,
                openDuration: openDuration,
                halfOpenProbes: halfOpenProbes
            ))
    }

    /// A machine opened at `t = 0` by `minimumCalls` failures.
    private static func openedMachine(openDuration: Duration = .seconds(30), halfOpenProbes: Int = 1) throws -> Machine {
        var machine = machine(windowSize: 4, minimumCalls: 2, openDuration: openDuration, halfOpenProbes: halfOpenProbes)
        try machine.calls([.failure, .failure], at: .zero)
        #expect(machine.remainingOpenTime(now: .zero) == openDuration)
        return machine
    }

    // MARK: Configuration

    @Test func configurationDefaultsMatchTheDocumentation() {
        let configuration = CircuitBreaker.Configuration()
        #expect(configuration.windowSize == 20)
        #expect(configuration.minimumCalls == 10)
        #expect(configuration.failureRateThreshold == 0.5)
        #expect(configuration.openDuration == .seconds(30))
        #expect(configuration.halfOpenProbes == 1)
    }

    @Test func configurationNormalisesOutOfRangeValues() {
        let tooSmall = CircuitBreaker.Configuration(
            windowSize: 0, minimumCalls: 0, failureRateThreshold: -1, openDuration: .seconds(-5), halfOpenProbes: 0
        )
        #expect(tooSmall.windowSize == 1)
        #expect(tooSmall.minimumCalls == 1)
        #expect(tooSmall.failureRateThreshold == 0)
        #expect(tooSmall.openDuration == .zero)
        #expect(tooSmall.halfOpenProbes == 1)

        let tooLarge = CircuitBreaker.Configuration(windowSize: 5, minimumCalls: 50, failureRateThreshold: 7)
        #expect(tooLarge.minimumCalls == 5)
        #expect(tooLarge.failureRateThreshold == 1)

        #expect(CircuitBreaker.Configuration(failureRateThreshold: .nan).failureRateThreshold == 0.5)
    }

    // MARK: Closed

    @Test func newMachineIsClosedAndAllowsCalls() throws {
        var machine = Self.machine()
        #expect(machine.state(now: .zero) == .closed)
        #expect(machine.remainingOpenTime(now: .zero) == .zero)
        let permit = try machine.permit(at: .zero)
        #expect(!permit.isProbe)
    }

    @Test func staysClosedBelowMinimumCallsEvenIfAllFail() throws {
        var machine = Self.machine(windowSize: 10, minimumCalls: 5)
        try machine.calls(Array(repeating: .failure, count: 4), at: .zero)
        #expect(machine.state(now: .zero) == .closed)
        try machine.call(.failure, at: .zero)
        #expect(machine.state(now: .zero) == .open)
    }

    @Test func opensExactlyWhenTheFailureRateReachesTheThreshold() throws {
        var machine = Self.machine(windowSize: 10, minimumCalls: 4, failureRateThreshold: 0.5)
        try machine.calls([.success, .success, .success, .failure], at: .zero)  // 1/4
        #expect(machine.state(now: .zero) == .closed)
        try machine.calls([.failure], at: .zero)  // 2/5
        #expect(machine.state(now: .zero) == .closed)
        try machine.calls([.failure], at: .zero)  // 3/6 = threshold
        #expect(machine.state(now: .zero) == .open)
    }

    @Test func successesKeepItClosed() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 1)
        try machine.calls(Array(repeating: .success, count: 100), at: .zero)
        #expect(machine.state(now: .zero) == .closed)
    }

    @Test func ignoredOutcomesDoNotCountWhileClosed() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 2, failureRateThreshold: 0.5)
        try machine.calls([.success, .ignored, .ignored, .ignored, .failure], at: .zero)  // 1/2 if ignored were left out
        #expect(machine.state(now: .zero) == .open)

        var other = Self.machine(windowSize: 4, minimumCalls: 2, failureRateThreshold: 0.5)
        try other.calls([.failure, .ignored, .ignored, .ignored], at: .zero)  // only one counted call: below minimumCalls
        #expect(other.state(now: .zero) == .closed)
    }

    @Test func slidingWindowForgetsOldSuccesses() throws {
        // Cumulatively 2 failures in 5 calls (40 %) — but the last 4 calls hold 2 failures (50 %).
        var machine = Self.machine(windowSize: 4, minimumCalls: 4, failureRateThreshold: 0.5)
        try machine.calls([.success, .success, .success, .failure], at: .zero)
        #expect(machine.state(now: .zero) == .closed)
        try machine.call(.failure, at: .zero)
        #expect(machine.state(now: .zero) == .open)
    }

    @Test func slidingWindowForgetsOldFailures() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 4, failureRateThreshold: 0.75)
        try machine.calls([.failure, .failure, .success, .success], at: .zero)  // 2/4
        try machine.calls([.success, .success], at: .zero)  // both failures pushed out: 0/4
        try machine.calls([.failure, .failure], at: .zero)  // 2/4 — would be 4 failures if old ones were kept
        #expect(machine.state(now: .zero) == .closed)
        try machine.call(.failure, at: .zero)  // 3/4
        #expect(machine.state(now: .zero) == .open)
    }

    // MARK: Open

    @Test func openRejectsUntilOpenDurationHasPassed() throws {
        var machine = try Self.openedMachine(openDuration: .seconds(30))
        for now in [Duration.zero, .seconds(1), .seconds(29), .seconds(30) - .nanoseconds(1)] {
            #expect(machine.acquire(now: now) == .rejected)
            #expect(machine.state(now: now) == .open)
        }
        #expect(machine.state(now: .seconds(30)) == .halfOpen)
        let probe = try machine.permit(at: .seconds(30))
        #expect(probe.isProbe)
    }

    @Test func remainingOpenTimeCountsDown() throws {
        let machine = try Self.openedMachine(openDuration: .seconds(30))
        #expect(machine.remainingOpenTime(now: .zero) == .seconds(30))
        #expect(machine.remainingOpenTime(now: .seconds(10)) == .seconds(20))
        #expect(machine.remainingOpenTime(now: .milliseconds(29_999)) == .milliseconds(1))
        #expect(machine.remainingOpenTime(now: .seconds(30)) == .zero)
        #expect(machine.remainingOpenTime(now: .seconds(3_000)) == .zero)
    }

    @Test func openDurationIsMeasuredFromTheFailureThatOpenedIt() throws {
        var machine = Self.machine(windowSize: 2, minimumCalls: 2, openDuration: .seconds(10))
        try machine.call(.failure, at: .seconds(100))
        try machine.call(.failure, at: .seconds(105))
        #expect(machine.acquire(now: .seconds(114)) == .rejected)
        #expect(machine.acquire(now: .seconds(115)).permit != nil)
    }

    @Test func zeroOpenDurationGoesStraightToHalfOpen() throws {
        var machine = try Self.openedMachine(openDuration: .zero)
        #expect(machine.state(now: .zero) == .halfOpen)
        #expect(try machine.permit(at: .zero).isProbe)
    }

    // MARK: Half-open

    @Test(arguments: [1, 2, 3])
    func halfOpenAllowsExactlyHalfOpenProbes(probes: Int) throws {
        var machine = try Self.openedMachine(halfOpenProbes: probes)
        for _ in 0..<probes {
            #expect(try machine.permit(at: .seconds(30)).isProbe)
        }
        #expect(machine.acquire(now: .seconds(30)) == .rejected)
        #expect(machine.acquire(now: .seconds(1_000)) == .rejected)
        #expect(machine.state(now: .seconds(1_000)) == .halfOpen)
        #expect(machine.remainingOpenTime(now: .seconds(1_000)) == .zero)
    }

    @Test func failedProbeReopensForAFullOpenDuration() throws {
        var machine = try Self.openedMachine(openDuration: .seconds(30))
        let probe = try machine.permit(at: .seconds(30))
        machine.record(.failure, for: probe, now: .seconds(35))
        #expect(machine.state(now: .seconds(35)) == .open)
        #expect(machine.remainingOpenTime(now: .seconds(35)) == .seconds(30))
        #expect(machine.acquire(now: .seconds(64)) == .rejected)
        #expect(try machine.permit(at: .seconds(65)).isProbe)
    }

    @Test func oneFailedProbeReopensEvenIfOthersSucceeded() throws {
        var machine = try Self.openedMachine(halfOpenProbes: 3)
        let first = try machine.permit(at: .seconds(30))
        let second = try machine.permit(at: .seconds(30))
        let third = try machine.permit(at: .seconds(30))
        machine.record(.success, for: first, now: .seconds(31))
        machine.record(.success, for: second, now: .seconds(31))
        machine.record(.failure, for: third, now: .seconds(31))
        #expect(machine.state(now: .seconds(31)) == .open)
    }

    @Test func allProbesSucceedingClosesWithAnEmptyWindow() throws {
        var machine = try Self.openedMachine(halfOpenProbes: 2)  // windowSize 4, minimumCalls 2, threshold 0.5
        let first = try machine.permit(at: .seconds(30))
        let second = try machine.permit(at: .seconds(30))
        machine.record(.success, for: first, now: .seconds(31))
        #expect(machine.state(now: .seconds(31)) == .halfOpen)
        machine.record(.success, for: second, now: .seconds(31))
        #expect(machine.state(now: .seconds(31)) == .closed)
        // The two failures that opened it are gone: one new failure is below minimumCalls.
        try machine.call(.failure, at: .seconds(32))
        #expect(machine.state(now: .seconds(32)) == .closed)
        try machine.call(.failure, at: .seconds(32))
        #expect(machine.state(now: .seconds(32)) == .open)
    }

    @Test func ignoredProbeFreesItsSlotWithoutCounting() throws {
        var machine = try Self.openedMachine(halfOpenProbes: 1)
        let probe = try machine.permit(at: .seconds(30))
        #expect(machine.acquire(now: .seconds(30)) == .rejected)
        machine.record(.ignored, for: probe, now: .seconds(31))
        #expect(machine.state(now: .seconds(31)) == .halfOpen)
        let retry = try machine.permit(at: .seconds(31))
        #expect(retry.isProbe)
        #expect(machine.acquire(now: .seconds(31)) == .rejected)
        machine.record(.success, for: retry, now: .seconds(32))
        #expect(machine.state(now: .seconds(32)) == .closed)
    }

    @Test func ignoredProbeDoesNotDiscardEarlierProbeSuccesses() throws {
        var machine = try Self.openedMachine(halfOpenProbes: 2)
        let first = try machine.permit(at: .seconds(30))
        let second = try machine.permit(at: .seconds(30))
        machine.record(.success, for: first, now: .seconds(30))
        machine.record(.ignored, for: second, now: .seconds(30))
        let third = try machine.permit(at: .seconds(30))
        #expect(machine.acquire(now: .seconds(30)) == .rejected)
        machine.record(.success, for: third, now: .seconds(30))
        #expect(machine.state(now: .seconds(30)) == .closed)
    }

    // MARK: Stale permits

    @Test func stalePermitFromClosedCannotCloseAHalfOpenBreaker() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 2, openDuration: .seconds(30), halfOpenProbes: 1)
        let slow = try machine.permit(at: .zero)  // a slow call starts while closed
        try machine.calls([.failure, .failure], at: .seconds(1))  // ... the breaker opens
        let probe = try machine.permit(at: .seconds(31))  // ... and half-opens
        machine.record(.success, for: slow, now: .seconds(32))  // the slow call finally succeeds
        #expect(machine.state(now: .seconds(32)) == .halfOpen)
        #expect(machine.acquire(now: .seconds(32)) == .rejected)  // the probe slot is still taken
        machine.record(.success, for: probe, now: .seconds(33))
        #expect(machine.state(now: .seconds(33)) == .closed)
    }

    @Test func stalePermitFromClosedCannotReopenAHalfOpenBreaker() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 2, openDuration: .seconds(30), halfOpenProbes: 1)
        let slow = try machine.permit(at: .zero)
        try machine.calls([.failure, .failure], at: .seconds(1))
        _ = try machine.permit(at: .seconds(31))
        machine.record(.failure, for: slow, now: .seconds(32))
        #expect(machine.state(now: .seconds(32)) == .halfOpen)
    }

    @Test func stalePermitDoesNotCountInTheWindowAfterClosingAgain() throws {
        var machine = Self.machine(windowSize: 4, minimumCalls: 2, openDuration: .seconds(30), halfOpenProbes: 1)
        let slowA = try machine.permit(at: .zero)
        let slowB = try machine.permit(at: .zero)
        try machine.calls([.failure, .failure], at: .seconds(1))  // open
        try machine.call(.success, at: .seconds(31))  // probe succeeds: closed again
        #expect(machine.state(now: .seconds(31)) == .closed)
        machine.record(.failure, for: slowA, now: .seconds(32))
        machine.record(.failure, for: slowB, now: .seconds(32))
        #expect(machine.state(now: .seconds(32)) == .closed)
    }

    @Test func staleProbeFromAnEarlierHalfOpenRoundIsIgnored() throws {
        var machine = try Self.openedMachine(openDuration: .seconds(30), halfOpenProbes: 2)
        let failing = try machine.permit(at: .seconds(30))
        let late = try machine.permit(at: .seconds(30))
        machine.record(.failure, for: failing, now: .seconds(30))  // reopens until 60
        let probe = try machine.permit(at: .seconds(60))
        machine.record(.failure, for: late, now: .seconds(61))  // stale: must not reopen
        #expect(machine.state(now: .seconds(61)) == .halfOpen)
        machine.record(.success, for: probe, now: .seconds(61))
        #expect(machine.state(now: .seconds(61)) == .halfOpen)  // one of two probes so far
        try machine.call(.success, at: .seconds(61))
        #expect(machine.state(now: .seconds(61)) == .closed)
    }

    @Test func everyTransitionChangesTheGeneration() throws {
        var machine = Self.machine(windowSize: 2, minimumCalls: 2, openDuration: .seconds(1))
        let closed = machine.generation
        try machine.calls([.failure, .failure], at: .zero)
        let open = machine.generation
        let probe = try machine.permit(at: .seconds(1))
        let halfOpen = machine.generation
        machine.record(.success, for: probe, now: .seconds(1))
        let closedAgain = machine.generation
        #expect(Set([closed, open, halfOpen, closedAgain]).count == 4)
        #expect(probe.generation == halfOpen)
    }
}
