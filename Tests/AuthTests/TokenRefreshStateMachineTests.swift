import Testing
@testable import Auth

/// Every transition of the coordinator's logic, by hand: no network, no clock, no tasks.
@Suite("TokenRefreshStateMachine: generations, shared refresh, failure, loop guard, expiry")
struct TokenRefreshStateMachineTests {
    typealias Machine = TokenRefreshStateMachine

    static func machine(maxRefreshes: Int = 5, window: Duration = .seconds(30), lead: Duration = .seconds(60)) -> Machine {
        Machine(configuration: .init(maxRefreshes: maxRefreshes, window: window, proactiveRefreshLead: lead))
    }

    /// A machine whose current token is "old" (generation 1), as a first request adopts it.
    static func machineWithOldToken(maxRefreshes: Int = 5, window: Duration = .seconds(30), lead: Duration = .seconds(60)) -> Machine {
        var machine = machine(maxRefreshes: maxRefreshes, window: window, lead: lead)
        _ = machine.tokenRead("old", stamp: machine.stamp, now: .zero)
        return machine
    }

    /// Reads the provider's `token` as a request would and returns the action.
    static func read(_ machine: inout Machine, _ token: String?, at now: Duration = .zero) -> Machine.Action {
        machine.tokenRead(token, stamp: machine.stamp, now: now)
    }

    // MARK: Reading tokens

    @Test func theFirstProviderTokenBecomesGenerationOneAndItsExpiryIsAskedFor() {
        var machine = Self.machine()
        let action = Self.read(&machine, "old")
        guard case .sendAndReadExpiry(let issued) = action else { Issue.record("\(action)"); return }
        #expect(issued.token == "old")
        #expect(issued.stamp == .init(generation: 1, epoch: 0))
        guard case .send(let again) = Self.read(&machine, "old") else { Issue.record("second read"); return }
        #expect(again == issued)
        #expect(!machine.isRefreshing)
    }

    @Test func aStaleProviderReadSendsTheNewestTokenInstead() {
        var machine = Self.machineWithOldToken()
        let old = Self.issued(Self.read(&machine, "old"))
        _ = machine.unauthorized(old.stamp, now: .zero)
        _ = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        // The provider's read began before the refresh persisted "new".
        let action = Self.read(&machine, "old")
        #expect(Self.issued(action).token == "new")
        #expect(Self.issued(action).stamp.generation == 2)
        #expect(machine.newestToken(for: "old") == "new")
        #expect(machine.newestToken(for: "unknown") == "unknown")
        #expect(machine.newestToken(for: nil) == nil)
    }

    @Test func aTokenTheAppChangedBecomesANewGenerationEvenDuringARefresh() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        #expect(machine.isRefreshing)
        let action = Self.read(&machine, "logged-in-again")
        guard case .sendAndReadExpiry(let issued) = action else { Issue.record("\(action)"); return }
        #expect(issued.stamp.generation == 2)  // sent at once, not held behind the refresh
    }

    // MARK: 401s

    @Test func concurrent401sForOneGenerationShareOneRefresh() {
        var machine = Self.machineWithOldToken()
        let stamp = Machine.Stamp(generation: 1, epoch: 0)
        guard case .startRefreshAndWait(let first) = machine.unauthorized(stamp, now: .zero) else { Issue.record("no start"); return }
        var joined: [Machine.WaiterID] = []
        for _ in 0..<99 {
            guard case .wait(let id) = machine.unauthorized(stamp, now: .zero) else { Issue.record("did not join"); return }
            joined.append(id)
        }
        #expect(machine.waiterCount == 100)
        let completion = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        #expect(Set(completion.waiters) == Set([first] + joined))
        guard case .success(let issued) = completion.outcome else { Issue.record("failed"); return }
        #expect(issued == .init(token: "new", stamp: .init(generation: 2, epoch: 1)))
        #expect(!machine.isRefreshing)
    }

    @Test func a401ForAnOlderGenerationRetriesWithTheCurrentTokenAndRefreshesNothing() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        _ = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        // The app changes the token itself, then a request sent with "new" gets 401.
        _ = Self.read(&machine, "newer")
        let action = machine.unauthorized(.init(generation: 2, epoch: 1), now: .zero)
        #expect(Self.issued(action).token == "newer")
        #expect(!machine.isRefreshing)
    }

    @Test func aLate401ArrivingAfterTheRefreshFinishedStartsNoRefresh() {
        var machine = Self.machineWithOldToken()
        let sentEarly = Self.issued(Self.read(&machine, "old"))
        _ = machine.unauthorized(sentEarly.stamp, now: .zero)
        _ = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        // The early request's 401 was delayed and only arrives now.
        let action = machine.unauthorized(sentEarly.stamp, now: .seconds(1))
        guard case .send(let retry) = action else { Issue.record("\(action)"); return }
        #expect(retry.token == "new")
        #expect(!machine.isRefreshing)
    }

    @Test func requestsAboutToSendARejectedTokenWaitForItsReplacement() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        #expect(machine.refreshReason == .unauthorized)
        guard case .wait = Self.read(&machine, "old") else { Issue.record("sent a rejected token"); return }
        #expect(machine.waiterCount == 2)
    }

    @Test func a401DuringAProactiveRefreshJoinsItAndLaterRequestsWait() {
        var machine = Self.machineWithOldToken()
        machine.expiryRead(generation: 1, expiresAt: .seconds(100), now: .zero)
        guard case .sendAndStartRefresh = Self.read(&machine, "old", at: .seconds(50)) else { Issue.record("no proactive refresh"); return }
        guard case .send = Self.read(&machine, "old", at: .seconds(51)) else { Issue.record("held behind a proactive refresh"); return }
        guard case .wait = machine.unauthorized(.init(generation: 1, epoch: 0), now: .seconds(52)) else { Issue.record("401 did not join"); return }
        #expect(machine.refreshReason == .unauthorized)
        guard case .wait = Self.read(&machine, "old", at: .seconds(53)) else { Issue.record("sent a rejected token"); return }
    }

    @Test func aRefreshedTokenThatTheProviderPersistedEarlyKeepsItsGeneration() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        // A request reads "new" from the provider before refreshToken() has returned it.
        let early = Self.issued(Self.read(&machine, "new"))
        #expect(early.stamp.generation == 2)
        let completion = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        guard case .success(let issued) = completion.outcome else { Issue.record("failed"); return }
        #expect(issued.stamp.generation == 2)
        // A 401 for the early request is a genuine rejection of the current token.
        guard case .startRefreshAndWait = machine.unauthorized(early.stamp, now: .zero) else { Issue.record("no refresh"); return }
    }

    @Test func aRefreshReturningTheRejectedStringIsStillANewGenerationSoStragglersDoNotRefreshAgain() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        _ = machine.refreshSucceeded(token: "old", expiresAt: nil, now: .zero)
        #expect(machine.currentGeneration == 2)
        guard case .send = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero) else { Issue.record("refreshed again"); return }
    }

    // MARK: Failure

    @Test func aFailedRefreshFailsEveryWaiterWithTheSameError() {
        var machine = Self.machineWithOldToken()
        let stamp = Machine.Stamp(generation: 1, epoch: 0)
        _ = machine.unauthorized(stamp, now: .zero)
        for _ in 0..<9 { _ = machine.unauthorized(stamp, now: .zero) }
        let completion = machine.refreshFailed(.refreshFailed(underlying: RefreshFailure(id: 7)))
        #expect(completion.waiters.count == 10)
        guard case .failure(let error) = completion.outcome else { Issue.record("succeeded"); return }
        #expect(error.label == "refreshFailed(7)")
        #expect(machine.currentGeneration == 1)
        #expect(!machine.isRefreshing)
    }

    @Test func a401InFlightDuringAFailedRefreshSharesItsErrorInsteadOfRefreshingAgain() {
        var machine = Self.machineWithOldToken()
        let inFlight = Self.issued(Self.read(&machine, "old"))
        _ = machine.unauthorized(inFlight.stamp, now: .zero)
        _ = machine.refreshFailed(.refreshFailed(underlying: RefreshFailure(id: 3)))
        let action = machine.unauthorized(inFlight.stamp, now: .zero)
        guard case .fail(let error) = action else { Issue.record("\(action)"); return }
        #expect(error.label == "refreshFailed(3)")
        #expect(!machine.isRefreshing)
    }

    @Test func a401ForARequestSentAfterAFailedRefreshMayTryAgain() {
        var machine = Self.machineWithOldToken()
        _ = machine.unauthorized(.init(generation: 1, epoch: 0), now: .zero)
        _ = machine.refreshFailed(.refreshFailed(underlying: RefreshFailure(id: 1)))
        let later = Self.issued(Self.read(&machine, "old"))
        #expect(later.stamp.epoch == 1)
        guard case .startRefreshAndWait = machine.unauthorized(later.stamp, now: .zero) else { Issue.record("no second try"); return }
        let completion = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        guard case .success(let issued) = completion.outcome else { Issue.record("failed"); return }
        #expect(issued.token == "new")
    }

    // MARK: Loop guard

    @Test func theLoopGuardRefusesTheSixthRefreshWithinThirtySecondsAndAllowsItOnceTheWindowSlides() {
        var machine = Self.machineWithOldToken()
        for second in 0..<5 {
            let stamp = machine.stamp
            guard case .startRefreshAndWait = machine.unauthorized(stamp, now: .seconds(second)) else { Issue.record("refresh \(second) refused"); return }
            _ = machine.refreshSucceeded(token: "token-\(second)", expiresAt: nil, now: .seconds(second))
        }
        let refused = machine.unauthorized(machine.stamp, now: .seconds(29))
        guard case .fail(let error) = refused else { Issue.record("\(refused)"); return }
        #expect(error.label == "excessiveRefresh(5)")
        #expect(!machine.isRefreshing)
        // At 30 s the first refresh (at 0 s) has left the window.
        guard case .startRefreshAndWait = machine.unauthorized(machine.stamp, now: .seconds(30)) else { Issue.record("still refused"); return }
    }

    @Test func theLoopGuardIsConfigurableAndAZeroWindowDisablesIt() {
        var strict = Self.machineWithOldToken(maxRefreshes: 1, window: .seconds(10))
        _ = strict.unauthorized(strict.stamp, now: .zero)
        _ = strict.refreshSucceeded(token: "a", expiresAt: nil, now: .zero)
        guard case .fail = strict.unauthorized(strict.stamp, now: .seconds(9)) else { Issue.record("not refused"); return }

        var unguarded = Self.machineWithOldToken(maxRefreshes: 1, window: .zero)
        for index in 0..<20 {
            guard case .startRefreshAndWait = unguarded.unauthorized(unguarded.stamp, now: .zero) else { Issue.record("refused"); return }
            _ = unguarded.refreshFailed(.invalidToken)
            _ = Self.read(&unguarded, "old")  // a new request, after the failure
            _ = index
        }
    }

    @Test func explicitRefreshJoinsTheRefreshInFlightOrStartsOne() {
        var machine = Self.machineWithOldToken()
        guard case .startRefreshAndWait = machine.refreshRequested(now: .zero) else { Issue.record("no start"); return }
        #expect(machine.refreshReason == .explicit)
        guard case .wait = machine.refreshRequested(now: .zero) else { Issue.record("no join"); return }
        guard case .send = Self.read(&machine, "old") else { Issue.record("held behind an explicit refresh"); return }
        _ = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        guard case .startRefreshAndWait = machine.refreshRequested(now: .zero) else { Issue.record("sequential refresh refused"); return }
    }

    // MARK: No token

    @Test func noTokenRefreshesFirstAndEveryConcurrentRequestWaitsForIt() {
        var machine = Self.machine()
        guard case .startRefreshAndWait = Self.read(&machine, nil) else { Issue.record("no refresh"); return }
        guard case .wait = Self.read(&machine, nil) else { Issue.record("no join"); return }
        guard case .wait = Self.read(&machine, "") else { Issue.record("empty token not treated as none"); return }
        let completion = machine.refreshSucceeded(token: "first", expiresAt: nil, now: .zero)
        #expect(completion.waiters.count == 3)
        #expect(machine.currentGeneration == 1)
    }

    @Test func aNilReadThatRacedARefreshUsesItsResult() {
        var machine = Self.machine()
        let stampBeforeRead = machine.stamp
        _ = Self.read(&machine, nil)
        _ = machine.refreshSucceeded(token: "first", expiresAt: nil, now: .zero)
        // Another request's read began before the refresh ended and came back nil.
        let action = machine.tokenRead(nil, stamp: stampBeforeRead, now: .zero)
        guard case .send(let issued) = action else { Issue.record("\(action)"); return }
        #expect(issued.token == "first")
    }

    @Test func aProviderThatLostItsTokenMakesTheNextRequestRefreshRatherThanSendTheOldOne() {
        var machine = Self.machineWithOldToken()
        guard case .startRefreshAndWait = Self.read(&machine, nil) else { Issue.record("sent the old token after a logout"); return }
    }

    // MARK: Cancellation

    @Test func aCancelledWaiterLeavesButTheRefreshGoesOnForTheOthers() {
        var machine = Self.machineWithOldToken()
        let stamp = Machine.Stamp(generation: 1, epoch: 0)
        guard case .startRefreshAndWait(let first) = machine.unauthorized(stamp, now: .zero),
              case .wait(let second) = machine.unauthorized(stamp, now: .zero)
        else { Issue.record("setup"); return }
        let leftOnce = machine.waiterLeft(first)
        let leftTwice = machine.waiterLeft(first)
        #expect(leftOnce && !leftTwice)
        #expect(machine.isRefreshing)
        let secondLeft = machine.waiterLeft(second)
        #expect(secondLeft)
        #expect(machine.isRefreshing)  // nobody waits, and it still runs to its end
        let completion = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        #expect(completion.waiters.isEmpty)
        #expect(Self.issued(Self.read(&machine, "old")).token == "new")
    }

    // MARK: Expiry

    @Test func aTokenNearItsExpiryIsRefreshedOnceInTheBackgroundWhileRequestsKeepUsingIt() {
        var machine = Self.machineWithOldToken(lead: .seconds(60))
        machine.expiryRead(generation: 1, expiresAt: .seconds(300), now: .zero)
        guard case .send = Self.read(&machine, "old", at: .seconds(239)) else { Issue.record("too early"); return }
        let action = Self.read(&machine, "old", at: .seconds(240))
        guard case .sendAndStartRefresh(let issued) = action else { Issue.record("\(action)"); return }
        #expect(issued.token == "old")
        #expect(machine.refreshReason == .proactive)
        #expect(machine.waiterCount == 0)
        guard case .send = Self.read(&machine, "old", at: .seconds(241)) else { Issue.record("second refresh or wait"); return }
        let completion = machine.refreshSucceeded(token: "new", expiresAt: .seconds(900), now: .seconds(242))
        #expect(completion.waiters.isEmpty)
        #expect(Self.issued(Self.read(&machine, "old", at: .seconds(243))).token == "new")
    }

    @Test func anExpiredTokenIsReplacedBeforeAnythingIsSent() {
        var machine = Self.machineWithOldToken()
        machine.expiryRead(generation: 1, expiresAt: .seconds(300), now: .zero)
        guard case .startRefreshAndWait = Self.read(&machine, "old", at: .seconds(301)) else { Issue.record("sent an expired token"); return }
        #expect(machine.refreshReason == .expired)
        guard case .wait = Self.read(&machine, "old", at: .seconds(302)) else { Issue.record("sent an expired token"); return }
    }

    @Test func aTokenThatExpiresWhileAProactiveRefreshRunsWaitsForIt() {
        var machine = Self.machineWithOldToken()
        machine.expiryRead(generation: 1, expiresAt: .seconds(100), now: .zero)
        _ = machine.refreshRequested(now: .zero)
        guard case .wait = Self.read(&machine, "old", at: .seconds(100)) else { Issue.record("sent an expired token"); return }
        #expect(machine.refreshReason == .expired)
    }

    @Test func aRefreshedTokenThatLooksExpiredOnArrivalCausesNoRefreshLoop() {
        // A device clock far ahead of the server's: every token looks expired.
        var machine = Self.machineWithOldToken()
        machine.expiryRead(generation: 1, expiresAt: .seconds(10), now: .zero)
        _ = Self.read(&machine, "old", at: .seconds(1_000))
        _ = machine.refreshSucceeded(token: "new", expiresAt: .seconds(500), now: .seconds(1_000))
        guard case .send(let issued) = Self.read(&machine, "new", at: .seconds(1_001)) else { Issue.record("refresh loop"); return }
        #expect(issued.token == "new")
        #expect(!machine.isRefreshing)
    }

    @Test func theLoopGuardRefusingAnExpiryRefreshStillSendsTheToken() {
        var machine = Self.machineWithOldToken(maxRefreshes: 1, window: .seconds(30), lead: .seconds(10))
        _ = machine.refreshRequested(now: .zero)
        _ = machine.refreshSucceeded(token: "new", expiresAt: .seconds(25), now: .zero)
        // At 20 s "new" is within the lead of its expiry, but a refresh started at 0 s fills the window.
        guard case .send(let issued) = Self.read(&machine, "new", at: .seconds(20)) else { Issue.record("failed or waited"); return }
        #expect(!machine.isRefreshing)
        #expect(issued.token == "new")
    }

    @Test func anExpiryReportedForATokenAlreadyReplacedIsIgnored() {
        var machine = Self.machineWithOldToken()
        _ = machine.refreshRequested(now: .zero)
        _ = machine.refreshSucceeded(token: "new", expiresAt: nil, now: .zero)
        machine.expiryRead(generation: 1, expiresAt: .seconds(1), now: .zero)  // "old"'s expiry, late
        guard case .send = Self.read(&machine, "new", at: .seconds(100)) else { Issue.record("applied a stale expiry"); return }
    }

    static func issued(_ action: Machine.Action) -> Machine.IssuedToken {
        switch action {
        case .send(let issued), .sendAndReadExpiry(let issued), .sendAndStartRefresh(let issued):
            return issued
        default:
            Issue.record("expected a token to send, got \(action)")
            return .init(token: "", stamp: .init(generation: 0, epoch: 0))
        }
    }
}
