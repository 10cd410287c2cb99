import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("retrying", .timeLimit(.minutes(1)))
struct RetryingTests {
    private let clock = ManualClock()

    @Test func firstSuccessReturnsWithoutSleeping() async throws {
        let attempts = Log<Int>()
        let value = try await retrying(policy: ExponentialRetryPolicy(), clock: clock) { attempt in
            attempts.append(attempt)
            return "ok"
        }
        #expect(value == "ok")
        #expect(attempts.values == [0])
        #expect(clock.now == ManualClock.Instant(offset: .zero))
    }

    @Test func succeedsAfterFailuresSleepingThePolicyDelaysOnTheClock() async throws {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            try await retrying(policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1), clock: clock) { attempt in
                attempts.append(attempt)
                if attempt < 3 { throw TestError.transient(attempt: attempt) }
                return "ok after \(attempt)"
            }
        }
        for (retry, delay) in [Duration.seconds(1), .seconds(2), .seconds(4)].enumerated() {
            await clock.waitForSleepers(1)
            #expect(attempts.count == retry + 1)  // no further attempt until the sleep ends
            #expect(clock.nextDeadline == clock.now.advanced(by: delay))
            clock.advance(by: delay)
        }
        #expect(try await task.value == "ok after 3")
        #expect(attempts.values == [0, 1, 2, 3])
        #expect(clock.now == ManualClock.Instant(offset: .seconds(7)))
        #expect(clock.sleeperCount == 0)
    }

    @Test func advancingShortOfTheDeadlineDoesNotStartTheNextAttempt() async throws {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 10), clock: clock) { attempt in
                attempts.append(attempt)
                if attempt == 0 { throw TestError.transient(attempt: attempt) }
                return attempt
            }
        }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(9))
        #expect(clock.sleeperCount == 1)
        #expect(attempts.count == 1)
        clock.advance(by: .seconds(1))
        #expect(try await task.value == 1)
    }

    @Test func givesUpAndRethrowsTheLastErrorWhenThePolicyStops() async {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 5), clock: clock) { attempt -> Int in
                attempts.append(attempt)
                throw TestError.transient(attempt: attempt)
            }
        }
        for _ in 0..<2 {
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(5))
        }
        let result = await task.result
        #expect(throws: TestError.transient(attempt: 2)) { try result.get() }
        #expect(attempts.values == [0, 1, 2])
        #expect(clock.sleeperCount == 0)
    }

    @Test func noRetryPolicyRunsOnceAndRethrows() async {
        let attempts = Log<Int>()
        await #expect(throws: TestError.permanent) {
            try await retrying(policy: NoRetryPolicy(), clock: clock) { attempt -> Int in
                attempts.append(attempt)
                throw TestError.permanent
            }
        }
        #expect(attempts.values == [0])
    }

    @Test func shouldRetryFalseStopsAtOnceWithoutSleeping() async {
        let attempts = Log<Int>()
        let seen = Log<String>()
        await #expect(throws: TestError.permanent) {
            try await retrying(
                policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 1),
                clock: clock,
                shouldRetry: { error in
                    seen.append(String(describing: error))
                    return false
                }
            ) { attempt -> Int in
                attempts.append(attempt)
                throw TestError.permanent
            }
        }
        #expect(attempts.values == [0])
        #expect(seen.values == [String(describing: TestError.permanent)])
        #expect(clock.sleeperCount == 0)
    }

    @Test func shouldRetrySeesEachErrorAndCanStopMidway() async {
        let attempts = Log<Int>()
        await #expect(throws: TestError.permanent) {
            try await retrying(
                policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0),
                clock: clock,
                shouldRetry: { $0 as? TestError != .permanent }
            ) { attempt -> Int in
                attempts.append(attempt)
                throw attempt < 2 ? TestError.transient(attempt: attempt) : TestError.permanent
            }
        }
        #expect(attempts.values == [0, 1, 2])
    }

    @Test func cancellationErrorFromTheOperationIsNotRetriedByDefault() async {
        let attempts = Log<Int>()
        await #expect(throws: CancellationError.self) {
            try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0), clock: clock) { attempt -> Int in
                attempts.append(attempt)
                throw CancellationError()
            }
        }
        #expect(attempts.values == [0])
    }

    @Test func zeroDelayRetriesImmediatelyWithoutSleeping() async throws {
        let attempts = Log<Int>()
        let value = try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0), clock: clock) { attempt in
            attempts.append(attempt)
            if attempt < 3 { throw TestError.transient(attempt: attempt) }
            return attempt
        }
        #expect(value == 3)
        #expect(clock.now == ManualClock.Instant(offset: .zero))
    }

    @Test func hostilePolicyDelaysAreSanitisedInsteadOfTrapping() async {
        let attempts = Log<Int>()
        let clock = clock
        let maximum = Duration.seconds(10)
        // -1 and NaN: retry without sleeping; +inf and 1e300: sleep exactly `maximumDelay`; then stop.
        let policy = ScriptedPolicy(answers: [-1, .nan, -.infinity, .infinity, 1e300])
        let task = Task {
            try await retrying(policy: policy, clock: clock, maximumDelay: maximum) { attempt -> Int in
                attempts.append(attempt)
                throw TestError.transient(attempt: attempt)
            }
        }
        await clock.waitForSleepers(1)
        #expect(attempts.values == [0, 1, 2, 3])  // three retries happened with no time passing
        #expect(clock.now == ManualClock.Instant(offset: .zero))
        #expect(clock.nextDeadline == ManualClock.Instant(offset: maximum))
        clock.advance(by: maximum)

        await clock.waitForSleepers(1)
        #expect(attempts.count == 5)
        #expect(clock.nextDeadline == ManualClock.Instant(offset: maximum * 2))
        clock.advance(by: maximum)

        let result = await task.result
        #expect(throws: TestError.transient(attempt: 5)) { try result.get() }
        #expect(attempts.values == [0, 1, 2, 3, 4, 5])
    }

    @Test func defaultMaximumDelayCapsAnInfiniteDelayAtFiveMinutes() async throws {
        let clock = clock
        let task = Task {
            try await retrying(policy: ScriptedPolicy(answers: [.infinity]), clock: clock) { attempt in
                if attempt == 0 { throw TestError.transient(attempt: attempt) }
                return attempt
            }
        }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == ManualClock.Instant(offset: .seconds(300)))
        clock.advance(by: .seconds(300))
        #expect(try await task.value == 1)
    }

    @Test func cancellationDuringTheSleepEndsWithCancellationErrorWithoutAdvancing() async {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 60), clock: clock) { attempt -> Int in
                attempts.append(attempt)
                throw TestError.transient(attempt: attempt)
            }
        }
        await clock.waitForSleepers(1)
        task.cancel()
        let result = await task.result
        #expect(throws: CancellationError.self) { try result.get() }
        #expect(attempts.values == [0])  // no attempt after the cancellation
        #expect(clock.sleeperCount == 0)
        #expect(clock.now == ManualClock.Instant(offset: .zero))
    }

    @Test func cancelledTaskDoesNotStartAnotherAttempt() async {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            try await retrying(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0), clock: clock) { attempt -> Int in
                attempts.append(attempt)
                withUnsafeCurrentTask { $0?.cancel() }  // cancelled while the attempt is failing
                throw TestError.transient(attempt: attempt)
            }
        }
        let result = await task.result
        #expect(throws: TestError.transient(attempt: 0)) { try result.get() }  // the attempt's own error, unchanged
        #expect(attempts.values == [0])
    }

    @Test func alreadyCancelledTaskRunsNoAttempt() async {
        let attempts = Log<Int>()
        let clock = clock
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await retrying(policy: NoRetryPolicy(), clock: clock) { attempt in
                attempts.append(attempt)
                return attempt
            }
        }
        let result = await task.result
        #expect(throws: CancellationError.self) { try result.get() }
        #expect(attempts.count == 0)
    }
}
