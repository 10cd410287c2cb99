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
        guard case .startRefreshAndWait(let first, _) = machine.unauthorized(stamp, now: .zero) else { Issue.record("no start"); return }
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
        guard case .startRefreshAndWait(let first, _) = machine.unauthorized(stamp, now: .zero),
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
        guard case .sendAndStartRefresh(let issued, _) = action else { Issue.record("\(action)"); return }
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

    // MARK: Refresh timeout

    /// Starts a refresh for a 401 to the current token, as a request would; returns its first
    /// waiter and its id.
    static func start401Refresh(_ machine: inout Machine, at now: Duration = .zero) -> (waiter: Machine.WaiterID, refresh: Machine.RefreshID)? {
        let action = machine.unauthorized(machine.stamp, now: now)
        guard case .startRefreshAndWait(let waiter, let refresh) = action else { Issue.record("no start: \(action)"); return nil }
        return (waiter, refresh)
    }

    @Test func theRefreshTimeoutDefaultsToThirtySecondsAndZeroOrLessDisablesIt() {
        #expect(Machine.Configuration(maxRefreshes: 5, window: .seconds(30), proactiveRefreshLead: .seconds(60)).refreshTimeout == .seconds(30))
        #expect(Machine.Configuration(maxRefreshes: 5, window: .seconds(30), proactiveRefreshLead: .seconds(60)).hasRefreshTimeout)
        #expect(!Machine.Configuration(maxRefreshes: 5, window: .seconds(30), proactiveRefreshLead: .seconds(60), refreshTimeout: .zero).hasRefreshTimeout)
        #expect(!Machine.Configuration(maxRefreshes: 5, window: .seconds(30), proactiveRefreshLead: .seconds(60), refreshTimeout: .seconds(-1)).hasRefreshTimeout)
    }

    @Test func everyRefreshGetsItsOwnID() {
        var machine = Self.machineWithOldToken()
        guard let first = Self.start401Refresh(&machine) else { return }
        #expect(machine.refreshInFlight == first.refresh)
        _ = machine.refreshFailed(first.refresh, .invalidToken)
        #expect(machine.refreshInFlight == nil)
        _ = Self.read(&machine, "old")
        guard let second = Self.start401Refresh(&machine) else { return }
        #expect(second.refresh != first.refresh)
        #expect(machine.refreshInFlight == second.refresh)
    }

    @Test func aTimedOutRefreshFailsEveryWaiterWithRefreshTimedOutAndTheMachineGoesIdle() {
        var machine = Self.machineWithOldToken()
        guard let started = Self.start401Refresh(&machine) else { return }
        var waiters = [started.waiter]
        for _ in 0..<2 {
            guard case .wait(let id) = machine.unauthorized(.init(generation: 1, epoch: 0), now: .seconds(5)) else { Issue.record("did not join"); return }
            waiters.append(id)
        }
        let completion = machine.refreshTimedOut(started.refresh)
        #expect(Set(completion.waiters) == Set(waiters))
        guard case .failure(let error) = completion.outcome else { Issue.record("succeeded"); return }
        #expect(error.label == "refreshTimedOut(30.0 seconds)")
        #expect(!machine.isRefreshing)
        #expect(machine.currentGeneration == 1)  // the current token is unchanged
        #expect(machine.stamp.epoch == 1)  // a timeout ends the refresh, like a failure
        #expect(machine.abandonedCount == 1)
    }

    @Test func aTimerThatFiresAfterItsRefreshEndedChangesNothing() {
        var machine = Self.machineWithOldToken()
        guard let first = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshSucceeded(first.refresh, token: "new", expiresAt: nil, now: .seconds(1))
        // The result won the race; the timer fires anyway.
        let late = machine.refreshTimedOut(first.refresh)
        #expect(late.waiters.isEmpty)
        #expect(machine.abandonedCount == 0)
        #expect(Self.issued(Self.read(&machine, "new")).token == "new")
        // Nor does it abandon a later refresh that is in flight.
        guard let second = Self.start401Refresh(&machine, at: .seconds(2)) else { return }
        #expect(machine.refreshTimedOut(first.refresh).waiters.isEmpty)
        #expect(machine.refreshInFlight == second.refresh)
        #expect(machine.waiterCount == 1)
    }

    @Test func a401InFlightDuringATimedOutRefreshSharesItsErrorAndALaterRequestMayStartANewRefresh() {
        var machine = Self.machineWithOldToken()
        let inFlight = Self.issued(Self.read(&machine, "old"))
        guard let first = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(first.refresh)
        let straggler = machine.unauthorized(inFlight.stamp, now: .seconds(31))
        guard case .fail(let error) = straggler else { Issue.record("\(straggler)"); return }
        #expect(error.label == "refreshTimedOut(30.0 seconds)")
        #expect(!machine.isRefreshing)
        // A request that starts after the timeout (its stamp is taken now) may try again: the hung
        // refresh wedges nothing.
        guard let second = Self.start401Refresh(&machine, at: .seconds(33)) else { return }
        #expect(second.refresh != first.refresh)
    }

    @Test func aLateResultOfAnAbandonedRefreshIsAdoptedWhenNothingNewerWasIssued() {
        var machine = Self.machineWithOldToken()
        guard let started = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(started.refresh)
        let late = machine.refreshSucceeded(started.refresh, token: "late", expiresAt: nil, now: .seconds(40))
        #expect(late.waiters.isEmpty)  // they were answered at the timeout
        guard case .success(let issued) = late.outcome else { Issue.record("dropped"); return }
        #expect(issued == .init(token: "late", stamp: .init(generation: 2, epoch: 1)))
        #expect(machine.abandonedCount == 0)
        // A provider that did not persist it still gets it for the next request.
        #expect(Self.issued(Self.read(&machine, "old", at: .seconds(41))).token == "late")
    }

    @Test func aLateResultNeverReplacesATokenObtainedByALaterRefresh() {
        var machine = Self.machineWithOldToken()
        guard let first = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(first.refresh)
        _ = Self.read(&machine, "old", at: .seconds(31))
        guard let second = Self.start401Refresh(&machine, at: .seconds(31)) else { return }
        _ = machine.refreshSucceeded(second.refresh, token: "newer", expiresAt: nil, now: .seconds(32))
        #expect(machine.currentGeneration == 2)

        let late = machine.refreshSucceeded(first.refresh, token: "older", expiresAt: nil, now: .seconds(33))
        guard case .failure = late.outcome else { Issue.record("a late token replaced a newer one"); return }
        #expect(late.waiters.isEmpty)
        #expect(machine.currentGeneration == 2)
        #expect(machine.abandonedCount == 0)
        #expect(Self.issued(Self.read(&machine, "newer", at: .seconds(34))).token == "newer")
    }

    @Test func aLateResultNeverReplacesATokenTheAppSetMeanwhile() {
        var machine = Self.machineWithOldToken()
        guard let started = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(started.refresh)
        _ = Self.read(&machine, "signed-in-again", at: .seconds(31))  // generation 2
        let late = machine.refreshSucceeded(started.refresh, token: "late", expiresAt: nil, now: .seconds(32))
        guard case .failure = late.outcome else { Issue.record("a late token replaced a newer one"); return }
        #expect(machine.currentGeneration == 2)
        #expect(machine.newestToken(for: "old") == "signed-in-again")
    }

    @Test func aLateResultWhileALaterRefreshRunsIsUsedButDoesNotAnswerThatRefreshsWaiters() {
        var machine = Self.machineWithOldToken()
        guard let first = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(first.refresh)
        _ = Self.read(&machine, "old", at: .seconds(31))
        guard let second = Self.start401Refresh(&machine, at: .seconds(31)) else { return }

        let late = machine.refreshSucceeded(first.refresh, token: "late", expiresAt: nil, now: .seconds(32))
        #expect(late.waiters.isEmpty)
        #expect(machine.currentGeneration == 2)
        #expect(machine.refreshInFlight == second.refresh)
        #expect(machine.waiterCount == 1)
        // New requests send the late token rather than wait for a refresh of a token nobody uses now.
        guard case .send(let sent) = Self.read(&machine, "old", at: .seconds(33)) else { Issue.record("waited"); return }
        #expect(sent.token == "late")
        // The later refresh still answers its own waiter, and its (newer) token becomes current.
        let completion = machine.refreshSucceeded(second.refresh, token: "newest", expiresAt: nil, now: .seconds(34))
        #expect(completion.waiters == [second.waiter])
        guard case .success(let issued) = completion.outcome else { Issue.record("failed"); return }
        #expect(issued.token == "newest")
        #expect(issued.stamp.generation == 3)
    }

    @Test func aLateFailureOfAnAbandonedRefreshChangesNothing() {
        var machine = Self.machineWithOldToken()
        guard let first = Self.start401Refresh(&machine) else { return }
        _ = machine.refreshTimedOut(first.refresh)
        _ = Self.read(&machine, "old", at: .seconds(31))
        guard let second = Self.start401Refresh(&machine, at: .seconds(31)) else { return }
        let late = machine.refreshFailed(first.refresh, .refreshFailed(underlying: RefreshFailure(id: 4)))
        #expect(late.waiters.isEmpty)
        #expect(machine.refreshInFlight == second.refresh)
        #expect(machine.waiterCount == 1)
        #expect(machine.abandonedCount == 0)
    }

    @Test func theLoopGuardCountsRefreshesThatTimedOut() {
        var machine = Self.machineWithOldToken(maxRefreshes: 2, window: .seconds(60))
        for start in [0, 10] {
            _ = Self.read(&machine, "old", at: .seconds(start))
            guard let started = Self.start401Refresh(&machine, at: .seconds(start)) else { return }
            _ = machine.refreshTimedOut(started.refresh)
        }
        _ = Self.read(&machine, "old", at: .seconds(20))
        let refused = machine.unauthorized(machine.stamp, now: .seconds(20))
        guard case .fail(let error) = refused else { Issue.record("\(refused)"); return }
        #expect(error.label == "excessiveRefresh(2)")
    }

    @Test func aProactiveRefreshThatTimesOutLeavesTheCurrentTokenInUse() {
        var machine = Self.machineWithOldToken()
        machine.expiryRead(generation: 1, expiresAt: .seconds(100), now: .zero)
        guard case .sendAndStartRefresh(_, let refresh) = Self.read(&machine, "old", at: .seconds(50)) else { Issue.record("no proactive refresh"); return }
        let completion = machine.refreshTimedOut(refresh)
        #expect(completion.waiters.isEmpty)
        guard case .send(let issued) = Self.read(&machine, "old", at: .seconds(81)) else { Issue.record("held"); return }
        #expect(issued.token == "old")
    }

    @Test func onlyTheLastEightAbandonedRefreshesAreRemembered() {
        var machine = Self.machineWithOldToken(window: .zero)
        var ids: [Machine.RefreshID] = []
        for _ in 0..<(Machine.abandonedLimit + 1) {
            _ = Self.read(&machine, "old")
            guard let started = Self.start401Refresh(&machine) else { return }
            _ = machine.refreshTimedOut(started.refresh)
            ids.append(started.refresh)
        }
        #expect(machine.abandonedCount == Machine.abandonedLimit)
        guard case .failure = machine.refreshSucceeded(ids[0], token: "forgotten", expiresAt: nil, now: .zero).outcome else {
            Issue.record("a forgotten refresh was adopted"); return
        }
        #expect(machine.currentGeneration == 1)
        guard case .success = machine.refreshSucceeded(ids[ids.count - 1], token: "remembered", expiresAt: nil, now: .zero).outcome else {
            Issue.record("a remembered refresh was dropped"); return
        }
        #expect(machine.currentGeneration == 2)
    }

    static func issued(_ action: Machine.Action) -> Machine.IssuedToken {
        switch action {
        case .send(let issued), .sendAndReadExpiry(let issued), .sendAndStartRefresh(let issued, _):
            return issued
        default:
            Issue.record("expected a token to send, got \(action)")
            return .init(token: "", stamp: .init(generation: 0, epoch: 0))
        }
    }
}

extension TokenRefreshStateMachine {
    /// The refresh in flight returned `token` (for tests where only one refresh ever runs).
    mutating func refreshSucceeded(token: String, expiresAt: Duration?, now: Duration) -> Completion {
        refreshSucceeded(refreshInFlight ?? 0, token: token, expiresAt: expiresAt, now: now)
    }

    /// The refresh in flight failed (for tests where only one refresh ever runs).
    mutating func refreshFailed(_ error: AuthError) -> Completion {
        refreshFailed(refreshInFlight ?? 0, error)
    }
}
