import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Auth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A request's deadline bounds everything the request waits for, the token included: a request
/// with no token whose refresh hangs fails at its own deadline, not at the coordinator's
/// `refreshTimeout`; the time spent waiting for a token is taken off the send's deadline; a
/// refresh after a 401 is bounded by what is left.
@Suite("AuthenticatedRequestEngine: the request's deadline bounds the token wait", .timeLimit(.minutes(1)))
struct AuthenticatedRequestDeadlineTests {
    struct DeadlinedRequest: NetworkRequest {
        let url = URL(string: "https://api.example.test/report")!
        let method = HTTPMethod.get
        let timeout: TimeInterval = .infinity
        let deadline: Duration?
    }

    @Test func aRequestWithoutATokenWhoseRefreshHangsFailsAtItsDeadlineNotTheRefreshTimeout() async throws {
        let clock = ManualClock()
        let gate = Gate()  // the refresh hangs until the end
        let provider = TestTokenProvider(current: nil, gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.ok("report")])
        let engine = AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator)
        let request = Task { await networkError { try await engine.send(DeadlinedRequest(deadline: .seconds(5))) } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(2)  // the refresh's 30 s timeout and the waiter's 5 s deadline
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))
        clock.advance(by: .seconds(5))
        #expect(await request.value?.caseName == "deadlineExceeded")
        #expect(session.callCount == 0)
        #expect(coordinator.waiterCount == 0)
        #expect(coordinator.isRefreshing)  // the refresh goes on for others
        gate.open()
        await provider.waitForRefreshCompletion()
        #expect(try await engine.send(DeadlinedRequest(deadline: .seconds(5))).0 == Data("report".utf8))
    }

    @Test func theTimeSpentWaitingForTheTokenIsTakenOffTheSendsDeadline() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: nil, gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.hang])
        let engine = AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator)
        let request = Task { await networkError { try await engine.send(DeadlinedRequest(deadline: .seconds(10))) } }
        await coordinator.waitForWaiters(1)
        clock.advance(by: .seconds(3))  // the refresh takes 3 s
        gate.open()
        await session.waitForCalls(1)
        await clock.waitForSleepers(2)  // the coordinator's deadline timer and the engine's watchdog
        #expect(clock.nextDeadline == .init(offset: .seconds(10)))  // 3 + 7, not 3 + 10
        clock.advance(by: .seconds(7))
        #expect(await request.value?.caseName == "deadlineExceeded")
        await session.waitUntilNoneSuspended()
    }

    @Test func aRefreshAfterA401IsBoundedByWhatIsLeftOfTheDeadline() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: "t1", gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.respond(status: 401), .ok("report")])
        let engine = AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator)
        let request = Task { await networkError { try await engine.send(DeadlinedRequest(deadline: .seconds(5))) } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(2)  // the refresh's timeout and the waiter's deadline
        clock.advance(by: .seconds(5))
        #expect(await request.value?.caseName == "deadlineExceeded")
        #expect(session.callCount == 1)  // the retry was never sent
        gate.open()
    }

    /// A request of its own path, so that no two of a test's requests share a call (deduplication).
    struct Numbered: NetworkRequest {
        let number: Int
        var url: URL { URL(string: "https://api.example.test/report/\(number)")! }
        let method = HTTPMethod.get
        let timeout: TimeInterval = .infinity
        let deadline: Duration?
    }

    @Test func aRequestWaitingForAdmissionFailsAtItsDeadlineHavingSentNothing() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "t1")
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.hang, .ok("second"), .ok("third")])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator, maxConcurrentRequests: 1
        )
        let holder = Task { await networkError { try await engine.send(Numbered(number: 1, deadline: nil)) } }
        await session.waitForCalls(1)  // the one place is held by a request whose answer never comes
        let waiting = Task { await networkError { try await engine.send(Numbered(number: 2, deadline: .seconds(5))) } }
        await clock.waitForSleepers(1)  // its admission deadline: the only sleeper
        #expect(clock.nextDeadline == .init(offset: .seconds(5)))
        clock.advance(by: .seconds(5))
        #expect(await waiting.value?.caseName == "deadlineExceeded")
        #expect(session.callCount == 1)
        // It took no place: once the holder is gone the next request is admitted and sent.
        holder.cancel()
        #expect(await holder.value?.caseName == "cancelled")
        #expect(try await engine.send(Numbered(number: 3, deadline: .seconds(5))).0 == Data("second".utf8))
    }

    @Test func aRequestAdmittedBeforeItsDeadlineIsSentWithWhatIsLeft() async throws {
        let clock = ManualClock()
        let provider = TestTokenProvider(current: "t1")
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.hang, .hang])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator, maxConcurrentRequests: 1
        )
        let holder = Task { await networkError { try await engine.send(Numbered(number: 4, deadline: nil)) } }
        await session.waitForCalls(1)
        let waiting = Task { await networkError { try await engine.send(Numbered(number: 5, deadline: .seconds(10))) } }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(4))  // admitted 4 s in: its send gets the 6 s left
        holder.cancel()
        await session.waitForCalls(2)
        // The engine's watchdog for the send, and the admission timer's sleeper (its deadline is
        // gone; the sleeper wakes at 10 s to find nothing to do).
        await clock.waitForSleepers(2)
        #expect(clock.nextDeadline == .init(offset: .seconds(10)))
        clock.advance(by: .seconds(6))
        #expect(await waiting.value?.caseName == "deadlineExceeded")
        _ = await holder.value
        await session.waitUntilNoneSuspended()
    }

    @Test func withoutADeadlineTheWaitIsBoundedByTheRefreshTimeoutAsBefore() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: nil, gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(10), clock: clock)
        let session = ScriptedNetworkSession([.ok("report")])
        let engine = AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: session, clock: clock), coordinator: coordinator)
        let request = Task { await thrownError { try await engine.send(DeadlinedRequest(deadline: nil)) } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(1)  // the refresh's timeout only
        clock.advance(by: .seconds(10))
        #expect(await request.value?.label == "refreshTimedOut(10.0 seconds)")
        gate.open()
    }

    @Test func theSendingEnginesTotalDeadlineBoundsTheTokenWaitOfARequestWithNone() async throws {
        let clock = ManualClock()
        let gate = Gate()
        let provider = TestTokenProvider(current: nil, gate: gate)
        let coordinator = TokenRefreshCoordinator(provider: provider, refreshTimeout: .seconds(30), clock: clock)
        let session = ScriptedNetworkSession([.ok("report")])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(4)), clock: clock),
            coordinator: coordinator
        )
        let request = Task { await networkError { try await engine.send(DeadlinedRequest(deadline: nil)) } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(2)
        #expect(clock.nextDeadline == .init(offset: .seconds(4)))
        clock.advance(by: .seconds(4))
        #expect(await request.value?.caseName == "deadlineExceeded")
        gate.open()
    }
}
