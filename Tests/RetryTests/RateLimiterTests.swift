import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("RateLimiter", .timeLimit(.minutes(1)))
struct RateLimiterTests {
    private let clock = ManualClock()

    /// Takes a permit; returns `nil` when admitted, the rejection's `retryAfter` when refused.
    private func take(_ limiter: RateLimiter) async -> Duration? {
        do {
            try await limiter.withPermit {}
            return nil
        } catch let rejection as LimiterRejection {
            return rejection.retryAfter
        } catch {
            Issue.record("unexpected \(error)")
            return .zero
        }
    }

    @Test func theBucketStartsFullAndAdmitsABurst() async {
        let limiter = RateLimiter(permitsPerSecond: 10, burst: 3, clock: clock)
        #expect(limiter.availablePermits == 3)
        for _ in 0..<3 { #expect(await take(limiter) == nil) }
        #expect(limiter.availablePermits == 0)
        #expect(await take(limiter) == .milliseconds(100))
    }

    @Test func aRejectionIsTypedAndCarriesTheTimeUntilTheNextToken() async {
        let limiter = RateLimiter(permitsPerSecond: 2, burst: 1, clock: clock)
        #expect(await take(limiter) == nil)
        var ran = false
        let error = await thrownError { try await limiter.withPermit { ran = true } }
        #expect(error as? LimiterRejection == LimiterRejection(reason: .rateLimit(retryAfter: .milliseconds(500))))
        #expect(!ran)
        clock.advance(by: .milliseconds(200))
        #expect(await take(limiter) == .milliseconds(300))  // counts down on the clock
        #expect(limiter.availablePermits == 0)  // a rejection takes nothing
    }

    @Test func tokensRefillAtTheRateInWholeTokens() async {
        let limiter = RateLimiter(permitsPerSecond: 10, burst: 5, clock: clock)
        for _ in 0..<5 { #expect(await take(limiter) == nil) }
        clock.advance(by: .milliseconds(100))
        #expect(limiter.availablePermits == 1)
        #expect(await take(limiter) == nil)
        clock.advance(by: .milliseconds(250))  // 2.5 tokens: two whole ones
        #expect(limiter.availablePermits == 2)
        #expect(await take(limiter) == nil)
        #expect(await take(limiter) == nil)
        #expect(await take(limiter) == .milliseconds(50))  // the half token needs 50 ms more
        clock.advance(by: .milliseconds(50))
        #expect(await take(limiter) == nil)
    }

    @Test func theBucketNeverHoldsMoreThanBurst() async {
        let limiter = RateLimiter(permitsPerSecond: 100, burst: 4, clock: clock)
        #expect(await take(limiter) == nil)
        clock.advance(by: .seconds(3_600))
        #expect(limiter.availablePermits == 4)
        for _ in 0..<4 { #expect(await take(limiter) == nil) }
        #expect(await take(limiter) == .milliseconds(10))
    }

    @Test func refillsAddUpExactlyOverManySmallSteps() async {
        // 3 per second is 333 333 333 ns per token; a thousand 1 ms steps make exactly one second.
        let limiter = RateLimiter(permitsPerSecond: 3, burst: 3, clock: clock)
        for _ in 0..<3 { #expect(await take(limiter) == nil) }
        for _ in 0..<1_000 { clock.advance(by: .milliseconds(1)) }
        #expect(limiter.availablePermits == 3)
        // 100 s of a call every 10 ms: the 3 tokens on hand, then 3 per second (the first 10 ms
        // of refill are lost to the full bucket, so 302 or 303, never more).
        var admitted = 0
        for _ in 0..<10_000 {
            clock.advance(by: .milliseconds(10))
            if await take(limiter) == nil { admitted += 1 }
        }
        #expect((302...303).contains(admitted))
        #expect(limiter.availablePermits == 0)
    }

    @Test func slowRatesGiveLongRetryAfters() async {
        let limiter = RateLimiter(permitsPerSecond: 0.1, burst: 1, clock: clock)
        #expect(await take(limiter) == nil)
        #expect(await take(limiter) == .seconds(10))
    }

    @Test(arguments: [Double.nan, -1, 0, -Double.infinity])
    func aNonPositiveOrNaNRateNeverRefillsButNeverTraps(rate: Double) async {
        let limiter = RateLimiter(permitsPerSecond: rate, burst: 2, clock: clock)
        #expect(limiter.permitsPerSecond == 0)
        #expect(await take(limiter) == nil)
        #expect(await take(limiter) == nil)
        clock.advance(by: .seconds(86_400 * 365))
        let retryAfter = await take(limiter)
        #expect(retryAfter != nil)
        #expect((retryAfter ?? .zero) > .seconds(86_400 * 365 * 50))
    }

    @Test func anInfiniteRateIsClampedToOneTokenPerNanosecond() async {
        let limiter = RateLimiter(permitsPerSecond: .infinity, burst: 1, clock: clock)
        #expect(limiter.permitsPerSecond == 1e9)
        #expect(await take(limiter) == nil)
        #expect(await take(limiter) == .nanoseconds(1))
        clock.advance(by: .nanoseconds(1))
        #expect(await take(limiter) == nil)
    }

    @Test func hostileBurstAndMaxWaitAreClamped() async {
        let small = RateLimiter(permitsPerSecond: 1, burst: -5, maxWait: .seconds(-3), clock: clock)
        #expect(small.burst == 1)
        #expect(small.maxWait == .zero)
        let huge = RateLimiter(permitsPerSecond: 1e-9, burst: .max, maxWait: .seconds(Int64.max), clock: clock)
        #expect(huge.burst == .max)
        #expect(huge.maxWait > .seconds(86_400 * 365 * 50))
        #expect(await take(huge) == nil)
        #expect(huge.availablePermits > 0)
    }

    @Test func anAlreadyCancelledCallerTakesNoToken() async {
        let limiter = RateLimiter(permitsPerSecond: 1, burst: 1, clock: clock)
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await limiter.withPermit {}
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(limiter.availablePermits == 1)
    }

    @Test func withMaxWaitACallWaitsOnTheClockForItsToken() async throws {
        let limiter = RateLimiter(permitsPerSecond: 1, burst: 1, maxWait: .seconds(2), clock: clock)
        #expect(await take(limiter) == nil)
        let order = Log<String>()
        let second = Task { try await limiter.withPermit { order.append("second") } }
        await clock.waitForSleepers(1)
        let third = Task { try await limiter.withPermit { order.append("third") } }
        await clock.waitForSleepers(2)
        #expect(await take(limiter) == .seconds(3))  // beyond maxWait: refused at once
        #expect(order.count == 0)
        clock.advance(by: .seconds(1))
        try await second.value
        #expect(order.values == ["second"])
        clock.advance(by: .seconds(1))
        try await third.value
        #expect(order.values == ["second", "third"])
        #expect(clock.sleeperCount == 0)
    }

    @Test func aWaiterCancelledWhileWaitingGivesItsTokenBack() async {
        let limiter = RateLimiter(permitsPerSecond: 1, burst: 1, maxWait: .seconds(5), clock: clock)
        #expect(await take(limiter) == nil)
        let waiter = Task { try await limiter.withPermit { Issue.record("must not run") } }
        await clock.waitForSleepers(1)
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        // The reservation is gone: the next token is due in 1 s, not 2 s.
        #expect(limiter.availablePermits == 0)
        clock.advance(by: .seconds(1))
        #expect(limiter.availablePermits == 1)
    }
}
