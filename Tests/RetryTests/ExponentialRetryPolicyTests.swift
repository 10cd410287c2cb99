import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("ExponentialRetryPolicy")
struct ExponentialRetryPolicyTests {
    // MARK: Schedule without jitter

    @Test func exponentialDefaultsAreOneTwoFourSecondsThenStop() {
        let policy = ExponentialRetryPolicy()
        #expect(policy.delay(forAttempt: 0) == 1)
        #expect(policy.delay(forAttempt: 1) == 2)
        #expect(policy.delay(forAttempt: 2) == 4)
        #expect(policy.delay(forAttempt: 3) == nil)
        #expect(policy.delay(forAttempt: 4) == nil)
        #expect(policy.delay(forAttempt: .max) == nil)
    }

    @Test func negativeAttemptGetsNoDelay() {
        let policy = ExponentialRetryPolicy(maxRetries: 10)
        #expect(policy.delay(forAttempt: -1) == nil)
        #expect(policy.delay(forAttempt: .min) == nil)
    }

    @Test func multiplierScalesEachStep() {
        let policy = ExponentialRetryPolicy(maxRetries: 4, baseDelay: 0.5, multiplier: 3)
        #expect(policy.delay(forAttempt: 0) == 0.5)
        #expect(policy.delay(forAttempt: 1) == 1.5)
        #expect(policy.delay(forAttempt: 2) == 4.5)
        #expect(policy.delay(forAttempt: 3) == 13.5)
        #expect(policy.delay(forAttempt: 4) == nil)
    }

    @Test func maxDelayCapsEveryLaterStep() {
        let policy = ExponentialRetryPolicy(maxRetries: 6, baseDelay: 1, multiplier: 2, maxDelay: 5)
        let delays = (0..<7).map { policy.delay(forAttempt: $0) }
        #expect(delays == [1, 2, 4, 5, 5, 5, nil])
    }

    @Test func baseDelayAboveMaxDelayIsCappedFromTheFirstRetry() {
        let policy = ExponentialRetryPolicy(maxRetries: 2, baseDelay: 10, maxDelay: 3)
        #expect(policy.delay(forAttempt: 0) == 3)
        #expect(policy.delay(forAttempt: 1) == 3)
    }

    @Test func hugeAttemptNumbersSaturateAtMaxDelayWithoutTrapping() {
        let policy = ExponentialRetryPolicy(maxRetries: .max, baseDelay: 1, multiplier: 2, maxDelay: 60)
        #expect(policy.delay(forAttempt: 1_023) == 60)  // 2^1023 is still finite, but above the cap
        #expect(policy.delay(forAttempt: 1_024) == 60)  // 2^1024 overflows to +inf
        #expect(policy.delay(forAttempt: 10_000) == 60)
        #expect(policy.delay(forAttempt: .max - 1) == 60)
        #expect(policy.delay(forAttempt: .max) == nil)  // attempt must be below maxRetries
    }

    @Test func hugeMultiplierAndBaseDelaySaturateAtMaxDelay() {
        let greatest = Double.greatestFiniteMagnitude
        let hugeMultiplier = ExponentialRetryPolicy(maxRetries: 5, baseDelay: 1, multiplier: greatest, maxDelay: 60)
        #expect(hugeMultiplier.delay(forAttempt: 0) == 1)
        #expect(hugeMultiplier.delay(forAttempt: 1) == 60)
        #expect(hugeMultiplier.delay(forAttempt: 4) == 60)

        let hugeBase = ExponentialRetryPolicy(maxRetries: 5, baseDelay: greatest, maxDelay: 60)
        #expect(hugeBase.delay(forAttempt: 0) == 60)
        #expect(hugeBase.delay(forAttempt: 4) == 60)

        let everythingHuge = ExponentialRetryPolicy(
            maxRetries: .max, baseDelay: greatest, multiplier: greatest, maxDelay: greatest
        )
        #expect(everythingHuge.delay(forAttempt: 0) == greatest)
        #expect(everythingHuge.delay(forAttempt: 10_000) == greatest)
    }

    @Test(arguments: ExponentialRetryPolicy.Jitter.allCases)
    func hugeAttemptsStayWithinMaxDelayForEveryJitter(jitter: ExponentialRetryPolicy.Jitter) throws {
        let policy = ExponentialRetryPolicy(maxRetries: .max, baseDelay: 1, multiplier: 2, maxDelay: 60, jitter: jitter)
        var generator = SplitMix64(seed: 7)
        for attempt in [1_024, 10_000, Int.max - 1] {
            for _ in 0..<100 {
                let delay = try #require(policy.delay(forAttempt: attempt, using: &generator))
                #expect((0...60).contains(delay))
            }
        }
    }

    // MARK: Normalisation at init

    @Test func negativeMaxRetriesMeansNoRetries() {
        let policy = ExponentialRetryPolicy(maxRetries: -3)
        #expect(policy.maxRetries == 0)
        #expect(policy.delay(forAttempt: 0) == nil)
    }

    @Test(arguments: [-1.0, -.infinity, .infinity, .nan, -.nan])
    func negativeOrNonFiniteBaseDelayIsTreatedAsZero(baseDelay: Double) {
        let policy = ExponentialRetryPolicy(maxRetries: 3, baseDelay: baseDelay)
        #expect(policy.baseDelay == 0)
        #expect(policy.delay(forAttempt: 0) == 0)
        #expect(policy.delay(forAttempt: 2) == 0)
    }

    @Test(arguments: [0.5, 0.0, -2.0, .infinity, -.infinity, .nan])
    func multiplierBelowOneOrNonFiniteIsTreatedAsOne(multiplier: Double) {
        let policy = ExponentialRetryPolicy(maxRetries: 3, baseDelay: 2, multiplier: multiplier)
        #expect(policy.multiplier == 1)
        #expect(policy.delay(forAttempt: 0) == 2)
        #expect(policy.delay(forAttempt: 2) == 2)
    }

    @Test(arguments: [-1.0, -.infinity, .nan])
    func negativeOrNaNMaxDelayIsTreatedAsZero(maxDelay: Double) {
        let policy = ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1, maxDelay: maxDelay)
        #expect(policy.maxDelay == 0)
        #expect(policy.delay(forAttempt: 0) == 0)
        #expect(policy.delay(forAttempt: 2) == 0)
    }

    @Test func infiniteMaxDelayStillYieldsAFiniteDelay() throws {
        let policy = ExponentialRetryPolicy(maxRetries: .max, maxDelay: .infinity)
        #expect(policy.delay(forAttempt: 3) == 8)  // below the overflow, the schedule is unchanged
        let delay = try #require(policy.delay(forAttempt: 10_000))
        #expect(delay.isFinite)
    }

    @Test(arguments: [ExponentialRetryPolicy.Jitter.full, .equal, .decorrelated])
    func infiniteMaxDelayWithJitterDoesNotTrap(jitter: ExponentialRetryPolicy.Jitter) async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [jitter] in
                let policy = ExponentialRetryPolicy(maxRetries: .max, maxDelay: .infinity, jitter: jitter)
                var generator = SplitMix64(seed: 1)
                let delay = policy.delay(forAttempt: 10_000, using: &generator)
                precondition(delay.map { $0.isFinite && $0 >= 0 } ?? false)
            }
        }
    }

    // MARK: Jitter

    @Test func noJitterIsExactAndIgnoresTheGenerator() throws {
        let policy = ExponentialRetryPolicy(maxRetries: 5, baseDelay: 0.25, multiplier: 3, maxDelay: 10, jitter: .none)
        let expected: [Double] = [0.25, 0.75, 2.25, 6.75, 10]
        for seed in UInt64(0)..<100 {
            var generator = SplitMix64(seed: seed)
            var untouched = generator
            for (attempt, value) in expected.enumerated() {
                #expect(policy.delay(forAttempt: attempt, using: &generator) == value)
            }
            #expect(generator.next() == untouched.next())
        }
    }

    @Test func fullJitterDrawsUniformlyBetweenZeroAndTheExponentialDelay() throws {
        let policy = ExponentialRetryPolicy(maxRetries: 6, baseDelay: 1, multiplier: 2, maxDelay: 10, jitter: .full)
        var generator = SplitMix64(seed: 0xF011)
        for (attempt, ceiling) in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (5, 10.0)] {
            let draws = try (0..<10_000).map { _ in
                try #require(policy.delay(forAttempt: attempt, using: &generator))
            }
            #expect(draws.allSatisfy { (0...ceiling).contains($0) }, "attempt \(attempt)")
            #expect(Set(draws).count > 9_000, "attempt \(attempt): draws repeat")
            // The whole range is reached, not a corner of it.
            #expect(try #require(draws.min()) < ceiling * 0.01)
            #expect(try #require(draws.max()) > ceiling * 0.99)
            let mean = draws.reduce(0, +) / Double(draws.count)
            #expect(abs(mean - ceiling / 2) < ceiling * 0.02, "attempt \(attempt): mean \(mean)")
        }
    }

    @Test func equalJitterDrawsBetweenHalfAndAllOfTheExponentialDelay() throws {
        let policy = ExponentialRetryPolicy(maxRetries: 6, baseDelay: 1, multiplier: 2, maxDelay: 10, jitter: .equal)
        var generator = SplitMix64(seed: 0xE9A1)
        for (attempt, ceiling) in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (5, 10.0)] {
            let draws = try (0..<10_000).map { _ in
                try #require(policy.delay(forAttempt: attempt, using: &generator))
            }
            #expect(draws.allSatisfy { (ceiling / 2...ceiling).contains($0) }, "attempt \(attempt)")
            #expect(Set(draws).count > 9_000, "attempt \(attempt): draws repeat")
            #expect(try #require(draws.min()) < ceiling * 0.51)
            #expect(try #require(draws.max()) > ceiling * 0.99)
        }
    }

    @Test func decorrelatedJitterDrawsBetweenBaseAndThreeTimesThePreviousStep() throws {
        // Previous un-jittered steps: base (for attempt 0), then 1, 2, 4, 8 -> upper 3, 3, 6, 12 capped at 10, 24 capped at 10.
        let policy = ExponentialRetryPolicy(maxRetries: 6, baseDelay: 1, multiplier: 2, maxDelay: 10, jitter: .decorrelated)
        var generator = SplitMix64(seed: 0xDEC0)
        for (attempt, upper) in [(0, 3.0), (1, 3.0), (2, 6.0), (3, 10.0), (4, 10.0), (5, 10.0)] {
            let draws = try (0..<10_000).map { _ in
                try #require(policy.delay(forAttempt: attempt, using: &generator))
            }
            #expect(draws.allSatisfy { (1...upper).contains($0) }, "attempt \(attempt)")
            #expect(Set(draws).count > 9_000, "attempt \(attempt): draws repeat")
            #expect(try #require(draws.min()) < 1 + (upper - 1) * 0.01)
            #expect(try #require(draws.max()) > upper - (upper - 1) * 0.01)
        }
    }

    @Test func decorrelatedJitterWithBaseAboveMaxDelayReturnsMaxDelay() {
        let policy = ExponentialRetryPolicy(maxRetries: 3, baseDelay: 5, maxDelay: 2, jitter: .decorrelated)
        var generator = SplitMix64(seed: 3)
        for attempt in 0..<3 {
            #expect(policy.delay(forAttempt: attempt, using: &generator) == 2)
        }
    }

    @Test(arguments: ExponentialRetryPolicy.Jitter.allCases)
    func zeroBaseDelayGivesZeroForEveryJitter(jitter: ExponentialRetryPolicy.Jitter) {
        let policy = ExponentialRetryPolicy(maxRetries: 3, baseDelay: 0, jitter: jitter)
        var generator = SplitMix64(seed: 11)
        for attempt in 0..<3 {
            #expect(policy.delay(forAttempt: attempt, using: &generator) == 0)
        }
    }

    @Test(arguments: ExponentialRetryPolicy.Jitter.allCases)
    func jitterStopsAfterMaxRetriesLikeTheSchedule(jitter: ExponentialRetryPolicy.Jitter) {
        let policy = ExponentialRetryPolicy(maxRetries: 2, jitter: jitter)
        var generator = SplitMix64(seed: 5)
        #expect(policy.delay(forAttempt: 1, using: &generator) != nil)
        #expect(policy.delay(forAttempt: 2, using: &generator) == nil)
        #expect(policy.delay(forAttempt: -1, using: &generator) == nil)
    }

    @Test(arguments: [ExponentialRetryPolicy.Jitter.full, .equal, .decorrelated])
    func sameSeedGivesSameDrawsAndOtherSeedsDiffer(jitter: ExponentialRetryPolicy.Jitter) {
        let policy = ExponentialRetryPolicy(maxRetries: 5, jitter: jitter)
        func draws(seed: UInt64) -> [Double?] {
            var generator = SplitMix64(seed: seed)
            return (0..<5).map { policy.delay(forAttempt: $0, using: &generator) }
        }
        #expect(draws(seed: 42) == draws(seed: 42))
        #expect(draws(seed: 42) != draws(seed: 43))
    }

    @Test(arguments: ExponentialRetryPolicy.Jitter.allCases)
    func systemRandomDrawsStayWithinZeroAndMaxDelay(jitter: ExponentialRetryPolicy.Jitter) throws {
        let policy = ExponentialRetryPolicy(maxRetries: 8, baseDelay: 1, maxDelay: 20, jitter: jitter)
        for attempt in 0..<8 {
            for _ in 0..<500 {
                let delay = try #require(policy.delay(forAttempt: attempt))
                #expect((0...20).contains(delay))
            }
        }
    }
}
