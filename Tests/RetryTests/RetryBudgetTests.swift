import ResilienceTesting
import Testing

@testable import Retry

@Suite("RetryBudget")
struct RetryBudgetTests {
    /// Withdraws until refused; returns how many withdrawals succeeded (bounded, so a bug cannot hang the test).
    private func drain(_ budget: RetryBudget, limit: Int = 10_000) -> Int {
        var count = 0
        while count < limit, budget.tryWithdraw() { count += 1 }
        return count
    }

    @Test func startsFullAtMaxBalance() {
        let budget = RetryBudget(retryRatio: 0.2, minRetriesPerSecond: 10, maxBalance: 7, clock: ManualClock())
        #expect(budget.balance == 7)
    }

    @Test func withdrawalsExhaustTheBalanceAndThenAreRefused() {
        let budget = RetryBudget(retryRatio: 0.2, minRetriesPerSecond: 0, maxBalance: 5, clock: ManualClock())
        for _ in 0..<5 {
            #expect(budget.tryWithdraw())
        }
        #expect(budget.balance == 0)
        #expect(!budget.tryWithdraw())
        #expect(!budget.tryWithdraw())
        #expect(budget.balance == 0)  // a refusal takes nothing
    }

    @Test func fractionalBalanceBelowOneIsRefused() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0.5, minRetriesPerSecond: 0, maxBalance: 1, clock: clock)
        #expect(budget.tryWithdraw())
        budget.recordRequest()
        #expect(budget.balance == 0.5)
        #expect(!budget.tryWithdraw())
        budget.recordRequest()
        #expect(budget.tryWithdraw())
    }

    @Test func eachRequestDepositsRetryRatio() {
        let budget = RetryBudget(retryRatio: 0.25, minRetriesPerSecond: 0, maxBalance: 10, clock: ManualClock())
        #expect(drain(budget) == 10)
        for _ in 0..<8 { budget.recordRequest() }
        #expect(budget.balance == 2)
        #expect(drain(budget) == 2)
    }

    @Test func tenRequestsAtTwentyPercentFundTwoRetries() {
        let budget = RetryBudget(retryRatio: 0.2, minRetriesPerSecond: 0, maxBalance: 10, clock: ManualClock())
        #expect(drain(budget) == 10)
        for _ in 0..<10 { budget.recordRequest() }
        #expect(drain(budget) == 2)
    }

    @Test func depositsNeverRaiseTheBalanceAboveMaxBalance() {
        let budget = RetryBudget(retryRatio: 0.5, minRetriesPerSecond: 0, maxBalance: 3, clock: ManualClock())
        for _ in 0..<100 { budget.recordRequest() }
        #expect(budget.balance == 3)
        #expect(drain(budget) == 3)
    }

    @Test func timeRefillsMinRetriesPerSecond() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 2, maxBalance: 10, clock: clock)
        #expect(drain(budget) == 10)
        clock.advance(by: .milliseconds(500))
        #expect(budget.balance == 1)
        clock.advance(by: .milliseconds(500))
        #expect(budget.balance == 2)
        #expect(drain(budget) == 2)
        clock.advance(by: .seconds(3))
        #expect(drain(budget) == 6)
    }

    @Test func timeRefillNeverExceedsMaxBalance() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 2, maxBalance: 10, clock: clock)
        #expect(drain(budget) == 10)
        clock.advance(by: .seconds(3_600))
        #expect(budget.balance == 10)
        #expect(drain(budget) == 10)
    }

    @Test func noTimePassedMeansNoRefill() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 1_000, maxBalance: 2, clock: clock)
        #expect(drain(budget) == 2)
        #expect(budget.balance == 0)
        #expect(!budget.tryWithdraw())
    }

    @Test func manySmallTimeStepsAddUpLikeOneBigStep() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 1, maxBalance: 1, clock: clock)
        #expect(budget.tryWithdraw())
        for _ in 0..<10 {
            clock.advance(by: .milliseconds(100))
            _ = budget.balance  // each read refills by 0.1
        }
        #expect(budget.tryWithdraw())
    }

    @Test func requestsAndTimeBothDeposit() {
        let clock = ManualClock()
        let budget = RetryBudget(retryRatio: 0.5, minRetriesPerSecond: 1, maxBalance: 5, clock: clock)
        #expect(drain(budget) == 5)
        clock.advance(by: .seconds(1))
        budget.recordRequest()
        budget.recordRequest()
        #expect(budget.balance == 2)
        #expect(drain(budget) == 2)
    }

    @Test func invalidParametersAreNormalised() {
        let clock = ManualClock()
        let negative = RetryBudget(retryRatio: -1, minRetriesPerSecond: -5, maxBalance: -3, clock: clock)
        #expect(negative.retryRatio == 0)
        #expect(negative.minRetriesPerSecond == 0)
        #expect(negative.maxBalance == 1)

        let nonFinite = RetryBudget(retryRatio: .nan, minRetriesPerSecond: .infinity, maxBalance: .infinity, clock: clock)
        #expect(nonFinite.retryRatio == 0)
        #expect(nonFinite.minRetriesPerSecond == 0)
        #expect(nonFinite.maxBalance == 1)

        let fractional = RetryBudget(retryRatio: 0.1, minRetriesPerSecond: 0, maxBalance: 0.5, clock: clock)
        #expect(fractional.maxBalance == 1)
        #expect(drain(fractional) == 1)
    }

    /// The largest finite settings work: each is clamped to 10¹² tokens, and deposits on a full
    /// bucket of that size neither overflow nor pass it.
    @Test func hugeSettingsAreClampedAndNeverOverflow() {
        let clock = ManualClock()
        for huge in [Double.greatestFiniteMagnitude, 1e13, 5e12] {
            let budget = RetryBudget(retryRatio: huge, minRetriesPerSecond: huge, maxBalance: huge, clock: clock)
            #expect(budget.retryRatio == 1e12 && budget.minRetriesPerSecond == 1e12 && budget.maxBalance == 1e12)
            budget.recordRequest()
            budget.recordRequest()
            #expect(budget.balance == 1e12)
            #expect(budget.tryWithdraw())
            clock.advance(by: .seconds(Int64.max / 2))
            #expect(budget.balance == 1e12)
            budget.recordRequest()
            #expect(budget.balance == 1e12)
        }
    }

    @Test func concurrentWithdrawalsNeverOverspend() async {
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 100, clock: ManualClock())
        let successes = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var won = 0
                    for _ in 0..<50 {
                        if budget.tryWithdraw() { won += 1 }
                    }
                    return won
                }
            }
            return await group.reduce(0, +)
        }
        #expect(successes == 100)
        #expect(budget.balance == 0)
        #expect(!budget.tryWithdraw())
    }

    @Test func concurrentDepositsAndWithdrawalsConserveTokens() async {
        let budget = RetryBudget(retryRatio: 0.5, minRetriesPerSecond: 0, maxBalance: 1_000, clock: ManualClock())
        #expect(drain(budget) == 1_000)
        let successes = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var won = 0
                    for _ in 0..<100 {
                        budget.recordRequest()
                        if budget.tryWithdraw() { won += 1 }
                    }
                    return won
                }
            }
            return await group.reduce(0, +)
        }
        // 800 requests deposit exactly 400 tokens (0.5 is exact in binary): none lost, none duplicated.
        #expect(Double(successes) + budget.balance == 400)
    }
}
