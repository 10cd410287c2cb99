import Testing

@testable import Retry

@Suite("FixedIntervalRetryPolicy and NoRetryPolicy")
struct RetryPolicyTests {
    @Test func fixedIntervalDefaultsAreThreeRetriesOneSecondApart() {
        let policy = FixedIntervalRetryPolicy()
        #expect((0..<5).map { policy.delay(forAttempt: $0) } == [1, 1, 1, nil, nil])
    }

    @Test func fixedIntervalRepeatsTheConfiguredInterval() {
        let policy = FixedIntervalRetryPolicy(maxRetries: 5, interval: 0.25)
        #expect((0..<6).map { policy.delay(forAttempt: $0) } == [0.25, 0.25, 0.25, 0.25, 0.25, nil])
    }

    @Test func fixedIntervalNegativeMaxRetriesMeansNoRetries() {
        let policy = FixedIntervalRetryPolicy(maxRetries: -2, interval: 1)
        #expect(policy.maxRetries == 0)
        #expect(policy.delay(forAttempt: 0) == nil)
    }

    @Test func fixedIntervalRejectsNegativeAttempts() {
        let policy = FixedIntervalRetryPolicy(maxRetries: 3)
        #expect(policy.delay(forAttempt: -1) == nil)
        #expect(policy.delay(forAttempt: .min) == nil)
    }

    @Test func fixedIntervalWithMaximalRetriesNeverOverflows() {
        let policy = FixedIntervalRetryPolicy(maxRetries: .max, interval: 2)
        #expect(policy.delay(forAttempt: .max - 1) == 2)
        #expect(policy.delay(forAttempt: .max) == nil)
    }

    @Test func noRetryPolicyNeverRetries() {
        let policy = NoRetryPolicy()
        for attempt in [Int.min, -1, 0, 1, 100, .max] {
            #expect(policy.delay(forAttempt: attempt) == nil)
        }
    }
}

@Suite("RetryPolicyDelay.sanitized")
struct RetryPolicyDelayTests {
    @Test func defaultMaximumIsFiveMinutes() {
        #expect(RetryPolicyDelay.defaultMaximum == .seconds(300))
    }

    @Test(arguments: [-1.0, -0.0, 0.0, .nan, -.nan, .signalingNaN, -.infinity, -1e300, -.leastNonzeroMagnitude])
    func negativeZeroAndNaNBecomeZero(seconds: Double) {
        #expect(RetryPolicyDelay.sanitized(seconds) == .zero)
    }

    @Test(arguments: [Double.infinity, 1e300, .greatestFiniteMagnitude, 300.000_000_1, 301, 1e10])
    func infiniteOrAboveMaximumBecomesTheMaximum(seconds: Double) {
        #expect(RetryPolicyDelay.sanitized(seconds) == .seconds(300))
    }

    @Test(arguments: [
        (2.5, Duration.milliseconds(2_500)),
        (1, .seconds(1)),
        (0.001, .milliseconds(1)),
        (0.000_000_001, .nanoseconds(1)),
        (299.999, .milliseconds(299_999)),
        (300, .seconds(300)),
    ])
    func normalValuesConvertExactly(seconds: Double, expected: Duration) {
        #expect(RetryPolicyDelay.sanitized(seconds) == expected)
    }

    @Test func valuesBelowOneNanosecondRoundToZero() {
        #expect(RetryPolicyDelay.sanitized(1e-12) == .zero)
        #expect(RetryPolicyDelay.sanitized(.leastNonzeroMagnitude) == .zero)
    }

    @Test func customMaximumCapsAndPassesSmallerValues() {
        let maximum = Duration.seconds(5)
        #expect(RetryPolicyDelay.sanitized(10, maximum: maximum) == .seconds(5))
        #expect(RetryPolicyDelay.sanitized(.infinity, maximum: maximum) == .seconds(5))
        #expect(RetryPolicyDelay.sanitized(4, maximum: maximum) == .seconds(4))
        #expect(RetryPolicyDelay.sanitized(-4, maximum: maximum) == .zero)
        #expect(RetryPolicyDelay.sanitized(.nan, maximum: maximum) == .zero)
    }

    @Test func zeroOrNegativeMaximumAllowsNoWaitAtAll() {
        for maximum in [Duration.zero, .seconds(-5)] {
            #expect(RetryPolicyDelay.sanitized(10, maximum: maximum) == .zero)
            #expect(RetryPolicyDelay.sanitized(.infinity, maximum: maximum) == .zero)
            #expect(RetryPolicyDelay.sanitized(1e300, maximum: maximum) == .zero)
        }
    }

    @Test func hugeMaximumNeverTraps() {
        let maximum = Duration.seconds(Int64.max)
        #expect(RetryPolicyDelay.sanitized(.infinity, maximum: maximum) == maximum)
        #expect(RetryPolicyDelay.sanitized(1e300, maximum: maximum) == maximum)
        #expect(RetryPolicyDelay.sanitized(60, maximum: maximum) == .seconds(60))
    }

    @Test func valuesBelowAHugeMaximumAreNotInflatedToIt() {
        // 1e10 s (~317 years) is far below Int64.max seconds, but too many nanoseconds for Int64.
        let maximum = Duration.seconds(Int64.max)
        #expect(RetryPolicyDelay.sanitized(1e10, maximum: maximum) == .seconds(10_000_000_000))
    }
}
