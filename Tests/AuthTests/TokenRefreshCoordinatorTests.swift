import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Auth

/// The coordinator with real tasks: one provider call per storm, failure and cancellation
/// delivered to every waiter, the loop guard and expiry on a ManualClock.
@Suite("TokenRefreshCoordinator: shared refresh, cancellation, loop guard, expiry", .timeLimit(.minutes(1)))
struct TokenRefreshCoordinatorTests {
    @Test func concurrentRefreshCallsShareOneProviderCall() async throws {
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider)
        let tasks = (0..<5).map { _ in Task { try await coordinator.refresh() } }
        await coordinator.waitForWaiters(5)
        gate.open()
        for task in tasks { #expect(try await task.value == "fresh-1") }
        #expect(provider.refreshCount == 1)
        #expect(await coordinator.currentToken() == "fresh-1")
    }

    @Test func sequentialRefreshCallsEachRefresh() async throws {
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider)
        #expect(try await coordinator.refresh() == "fresh-1")
        #expect(try await coordinator.refresh() == "fresh-2")
        #expect(provider.refreshCount == 2)
    }

    @Test func aFailedRefreshReachesEveryWaiterAsRefreshFailedAndALaterOneMaySucceed() async throws {
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", behaviour: .fail(id: 9), gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider)
        let tasks = (0..<3).map { _ in Task { await thrownError { _ = try await coordinator.refresh() } } }
        await coordinator.waitForWaiters(3)
        gate.open()
        for task in tasks { #expect(await task.value?.label == "refreshFailed(9)") }
        #expect(provider.refreshCount == 1)

        provider.setBehaviour(.rotate)
        #expect(try await coordinator.refresh() == "fresh-2")
    }

    @Test func aCancelledWaiterIsAnsweredAtOnceWhileTheOthersGetTheToken() async throws {
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider)
        let leaving = Task { await thrownError { _ = try await coordinator.refresh() } }
        let staying = Task { try await coordinator.refresh() }
        await coordinator.waitForWaiters(2)
        leaving.cancel()
        #expect(await leaving.value?.label == "CancellationError")
        #expect(coordinator.isRefreshing)
        gate.open()
        #expect(try await staying.value == "fresh-1")
        #expect(provider.refreshCount == 1)
    }

    @Test func theRefreshRunsToItsEndAndIsKeptWhenEveryWaiterLeaves() async throws {
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider)
        #expect(try await coordinator.tokenForRequest().token == "old")
        let only = Task { await thrownError { _ = try await coordinator.refresh() } }
        await coordinator.waitForWaiters(1)
        only.cancel()
        #expect(await only.value?.label == "CancellationError")
        #expect(coordinator.isRefreshing)
        gate.open()
        await coordinator.waitUntilIdle()
        #expect(!provider.sawCancellation)
        provider.setCurrent("old")  // even if the provider had not persisted it, the coordinator has it
        let next = try await coordinator.tokenForRequest()
        #expect(next.token == "fresh-1")
        #expect(provider.refreshCount == 1)
    }

    @Test func aWaiterCancelledBeforeItJoinsGetsCancellationErrorAndNoHang() async throws {
        let gate = Gate()
        let provider = TestTokenProvider(current: nil, gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider)
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await thrownError { _ = try await coordinator.tokenForRequest() }
        }
        #expect(await task.value?.label == "CancellationError")
        gate.open()
    }

    @Test func theLoopGuardStopsTheSixthRefreshWithinTheWindowOnAManualClock() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider, clock: clock)
        for _ in 0..<5 {
            _ = try await coordinator.refresh()
            clock.advance(by: .seconds(5))
        }
        // Now at 25 s: five refreshes started within the last 30 s.
        let error = await thrownError { _ = try await coordinator.refresh() }
        #expect(error?.label == "excessiveRefresh(5)")
        #expect(provider.refreshCount == 5)
        clock.advance(by: .seconds(5))  // 30 s: the refresh at 0 s leaves the window
        #expect(try await coordinator.refresh() == "fresh-6")
    }

    @Test func theLoopGuardLimitsAreConfigurable() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider, maxRefreshes: 2, window: .seconds(60), clock: clock)
        _ = try await coordinator.refresh()
        _ = try await coordinator.refresh()
        clock.advance(by: .seconds(59))
        #expect(await thrownError { _ = try await coordinator.refresh() }?.label == "excessiveRefresh(2)")
        #expect(String(describing: AuthError.excessiveRefresh(refreshes: 2, window: .seconds(60))).contains("2"))
    }

    @Test func aTokenNearItsExpiryIsRefreshedInTheBackgroundOnAManualClock() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, proactiveRefreshLead: .seconds(60), clock: clock)
        provider.setExpiry(Date().addingTimeInterval(300), afterRefresh: Date().addingTimeInterval(3_600))

        #expect(try await coordinator.tokenForRequest().token == "old")  // reads the expiry
        clock.advance(by: .seconds(239))
        #expect(try await coordinator.tokenForRequest().token == "old")
        #expect(provider.refreshCount == 0)

        clock.advance(by: .seconds(2))  // 241 s: within 60 s of the expiry at 300 s
        #expect(try await coordinator.tokenForRequest().token == "old")  // sent at once, not held
        await provider.waitForRefreshStart()
        #expect(try await coordinator.tokenForRequest().token == "old")
        #expect(provider.refreshCount == 1)
        gate.open()
        await coordinator.waitUntilIdle()
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
        clock.advance(by: .seconds(3_000))  // the new token's expiry (1 h) is still 5+ minutes away
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
        #expect(provider.refreshCount == 1)
    }

    @Test func anExpiredTokenIsReplacedBeforeTheRequestIsSentOnAManualClock() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider, clock: clock)
        provider.setExpiry(Date().addingTimeInterval(300), afterRefresh: Date().addingTimeInterval(3_600))
        _ = try await coordinator.tokenForRequest()
        clock.advance(by: .seconds(301))
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
        #expect(provider.refreshCount == 1)
    }

    @Test func currentTokenReportsTheNewestTokenWhenTheProviderLagsBehind() async throws {
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider)
        #expect(await coordinator.currentToken() == "old")
        _ = try await coordinator.tokenForRequest()
        _ = try await coordinator.refresh()
        provider.setCurrent("old")  // a provider that did not persist the refreshed token
        #expect(await coordinator.currentToken() == "fresh-1")
        provider.setCurrent(nil)
        #expect(await coordinator.currentToken() == nil)
    }

    @Test(arguments: ["", "abc\r\nX-Injected: 1", "nul\u{0}byte"])
    func aRefreshedTokenThatCannotTravelInAHeaderIsRejected(token: String) async throws {
        let provider = TestTokenProvider(current: "old", behaviour: .returns(token))
        let coordinator = TokenRefreshCoordinator(provider: provider)
        let error = await thrownError { _ = try await coordinator.refresh() }
        #expect(error?.label == "invalidToken")
        #expect(coordinator.currentGeneration == 0)  // not adopted
        #expect(!coordinator.isRefreshing)
    }

    // MARK: Refresh timeout (a provider whose refreshToken() never returns unless released)

    @Test func aRefreshThatNeverReturnsFailsEveryWaiterWithRefreshTimedOutOnceTheClockPassesTheTimeout() async throws {
        let clock = ManualClock()
        let gate = Gate()  // never opened until the end: the provider hangs
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(10), clock: clock)
        let tasks = (0..<3).map { _ in Task { await thrownError { _ = try await coordinator.refresh() } } }
        await coordinator.waitForWaiters(3)
        await clock.waitForSleepers(1)  // the refresh's timer
        clock.advance(by: .seconds(9))
        #expect(coordinator.waiterCount == 3)  // not yet
        clock.advance(by: .seconds(1))
        for task in tasks { #expect(await task.value?.label == "refreshTimedOut(10.0 seconds)") }
        #expect(!coordinator.isRefreshing)
        #expect(provider.refreshCount == 1)
        gate.open()
        await provider.waitForRefreshCompletion()
        #expect(!provider.sawCancellation)  // abandoned, never cancelled
    }

    @Test func aWaiterThatJoinsLateFailsAtTheRefreshsDeadlineNotATimeoutLater() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(10), clock: clock)
        let early = Task { await thrownError { _ = try await coordinator.refresh() } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(6))
        let late = Task { await thrownError { _ = try await coordinator.refresh() } }
        await coordinator.waitForWaiters(2)
        clock.advance(by: .seconds(4))  // 10 s after the start, 4 s after the late waiter joined
        #expect(await early.value?.label == "refreshTimedOut(10.0 seconds)")
        #expect(await late.value?.label == "refreshTimedOut(10.0 seconds)")
        #expect(clock.sleeperCount == 0)
        gate.open()
    }

    @Test func theAbandonedRefreshsLateTokenIsKeptWhenNothingNewerWasIssued() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(10), clock: clock)
        #expect(try await coordinator.tokenForRequest().token == "old")
        let waiter = Task { await thrownError { _ = try await coordinator.refresh() } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(10))
        #expect(await waiter.value?.label == "refreshTimedOut(10.0 seconds)")

        gate.open()  // the hung call returns after all
        await coordinator.waitUntil { $0.abandonedCount == 0 }
        #expect(coordinator.currentGeneration == 2)
        provider.setCurrent("old")  // even if the provider had not persisted it, the coordinator has it
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
        #expect(provider.refreshCount == 1)
    }

    @Test func theAbandonedRefreshsLateTokenNeverReplacesOneObtainedByALaterRefresh() async throws {
        let clock = ManualClock()
        let hung = Gate()
        let provider = TestTokenProvider(current: "old", behaviour: .returns("newer"), gate: hung)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(10), clock: clock)
        _ = try await coordinator.tokenForRequest()
        let first = Task { await thrownError { _ = try await coordinator.refresh() } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(10))
        #expect(await first.value?.label == "refreshTimedOut(10.0 seconds)")

        // The next refresh is not held behind the hung one, and succeeds.
        provider.setGate(nil)
        #expect(try await coordinator.refresh() == "newer")
        #expect(coordinator.currentGeneration == 2)

        // Now the first call returns, with an older token.
        provider.setBehaviour(.returns("older"))
        hung.open()
        await coordinator.waitUntil { $0.abandonedCount == 0 }
        #expect(coordinator.currentGeneration == 2)
        provider.setCurrent("old")  // a stale read gets the newest token the coordinator knows
        #expect(try await coordinator.tokenForRequest().token == "newer")
        #expect(provider.refreshCount == 2)
    }

    @Test func refreshesThatTimeOutStillCountForTheLoopGuard() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, maxRefreshes: 2, window: .seconds(60), refreshTimeout: .seconds(10), clock: clock)
        for round in 1...2 {
            let waiter = Task { await thrownError { _ = try await coordinator.refresh() } }
            await coordinator.waitForWaiters(1)
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(10))
            #expect(await waiter.value?.label == "refreshTimedOut(10.0 seconds)")
            #expect(provider.refreshCount == round)
        }
        // Two hung refreshes within 60 s: the third is refused at once, nothing hangs or loops.
        #expect(await thrownError { _ = try await coordinator.refresh() }?.label == "excessiveRefresh(2)")
        #expect(provider.refreshCount == 2)
        gate.open()
    }

    @Test func aRefreshThatEndsInTimeDisarmsItsTimer() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "old")
        let coordinator = TokenRefreshCoordinator(provider: provider, clock: clock)
        #expect(try await coordinator.refresh() == "fresh-1")
        #expect(clock.sleeperCount == 0)
        clock.advance(by: .seconds(60))
        #expect(try await coordinator.tokenForRequest().token == "fresh-1")
    }

    @Test func aZeroRefreshTimeoutWaitsAsLongAsTheRefreshTakes() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "old", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .zero, clock: clock)
        let waiter = Task { try await coordinator.refresh() }
        await coordinator.waitForWaiters(1)
        #expect(clock.sleeperCount == 0)  // no timer armed
        clock.advance(by: .seconds(3_600))
        #expect(coordinator.waiterCount == 1)
        gate.open()
        #expect(try await waiter.value == "fresh-1")
    }

    @Test func theRefreshTimedOutDescriptionNamesTheTimeoutAndNoSecret() {
        let description = String(describing: AuthError.refreshTimedOut(after: .seconds(30)))
        #expect(description == "token refresh did not finish within 30.0 seconds: abandoned")
    }
}
