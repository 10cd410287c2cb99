import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Auth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The engine over scripted and token-checking sessions: injection, one refresh and one retry per
/// 401, what never refreshes, errors, cancellation, and that tokens stay out of events and errors.
@Suite("AuthenticatedRequestEngine: injection, 401 handling, errors, cancellation, secrets", .timeLimit(.minutes(1)))
struct AuthenticatedRequestEngineTests {
    /// An engine over a session that accepts only `valid`'s token, with a provider that rotates it.
    static func fixture(
        current: String?,
        valid: String?,
        behaviour: TestTokenProvider.RefreshBehaviour = .rotate,
        gate: Gate? = nil,
        eventSink: (any RequestEventSink)? = nil
    ) -> (AuthenticatedRequestEngine, TokenCheckingSession, TestTokenProvider) {
        let server = ValidToken(valid)
        let session = TokenCheckingSession(valid: server)
        let provider = TestTokenProvider(current: current, behaviour: behaviour, server: server, gate: gate)
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, eventSink: eventSink),
            coordinator: TokenRefreshCoordinator(provider: provider)
        )
        return (engine, session, provider)
    }

    // MARK: Injection

    @Test func theCurrentTokenIsInjectedAsABearerHeaderAtSendTime() async throws {
        let server = ValidToken("t1")
        let session = TokenCheckingSession(valid: server)
        let provider = TestTokenProvider(current: "t1")
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session),
            coordinator: TokenRefreshCoordinator(provider: provider)
        )
        try await engine.send(TestRequest())
        // The app signs in again: the next request carries the new token, with no refresh.
        provider.setCurrent("t2")
        server.value = "t2"
        try await engine.send(TestRequest())
        #expect(session.sentTokens == ["Bearer t1", "Bearer t2"])
        #expect(provider.refreshCount == 0)
    }

    @Test func aCustomHeaderNameAndPrefixAreUsed() async throws {
        let server = ValidToken("key")
        let session = TokenCheckingSession(valid: server, headerName: "X-API-Key", prefix: "")
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session),
            coordinator: TokenRefreshCoordinator(provider: TestTokenProvider(current: "key")),
            tokenHeaderName: "X-API-Key",
            tokenPrefix: ""
        )
        try await engine.send(TestRequest())
        #expect(session.sentTokens == ["key"])
    }

    @Test func aRequestHeaderOfTheSameNameIsReplacedAndOtherHeadersAreKept() async throws {
        let scripted = ScriptedNetworkSession([.ok()])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: scripted),
            coordinator: TokenRefreshCoordinator(provider: TestTokenProvider(current: "t1"))
        )
        try await engine.send(TestRequest(headers: ["authorization": "Basic c3R1ZmY=", "X-Request-ID": "42"]))
        let sent = try #require(scripted.requests.first)
        let authorizationHeaders = (sent.allHTTPHeaderFields ?? [:]).filter { $0.key.lowercased() == "authorization" }
        #expect(authorizationHeaders.values.sorted() == ["Bearer t1"])
        #expect(sent.value(forHTTPHeaderField: "X-Request-ID") == "42")
    }

    // MARK: Refresh timeout

    @Test func a401ThenARefreshThatNeverReturnsFailsWithRefreshTimedOutOnceTheClockPassesTheTimeout() async throws {
        let clock = ManualClock()
        let gate = Gate()  // the provider's refresh hangs until the end of the test
        let scripted = ScriptedNetworkSession([.status(401), .ok()])
        let coordinator = TokenRefreshCoordinator(provider: TestTokenProvider(current: "expired", gate: gate), clock: clock)
        let engine = AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: scripted), coordinator: coordinator)
        let caller = Task { await thrownError { try await engine.send(TestRequest()) } }
        await coordinator.waitForWaiters(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(29))
        #expect(coordinator.waiterCount == 1)
        clock.advance(by: .seconds(1))
        let error = await caller.value
        #expect(error?.label == "refreshTimedOut(30.0 seconds)")
        #expect(error is AuthError)
        #expect(scripted.callCount == 1)  // no retry without a new token
        gate.open()
    }

    // MARK: 401

    @Test func a401RefreshesOnceAndRetriesOnceWithTheNewToken() async throws {
        let (engine, session, provider) = Self.fixture(current: "expired", valid: "not-yet-known")
        let (data, response) = try await engine.send(TestRequest())
        #expect(response.statusCode == 200)
        #expect(String(decoding: data, as: UTF8.self) == "ok")
        #expect(session.sentTokens == ["Bearer expired", "Bearer fresh-1"])
        #expect(provider.refreshCount == 1)
    }

    @Test func aSecond401IsThrownAsHTTPError401AfterExactlyTwoCallsAndOneRefresh() async throws {
        let (engine, session, provider) = Self.fixture(current: "expired", valid: "nobody-has-it", behaviour: .returns("still-wrong"))
        let error = await thrownError { try await engine.send(TestRequest()) }
        guard case .httpError(401, let data)? = error as? NetworkError else { Issue.record("\(String(describing: error))"); return }
        #expect(data == Data("denied".utf8))
        #expect(session.callCount == 2)
        #expect(provider.refreshCount == 1)
    }

    @Test func responseForReturnsTheSecond401InsteadOfThrowing() async throws {
        let (engine, session, _) = Self.fixture(current: "expired", valid: "nobody-has-it", behaviour: .returns("still-wrong"))
        let (_, response) = try await engine.response(for: TestRequest(method: .post))
        #expect(response.statusCode == 401)
        #expect(session.callCount == 2)
    }

    @Test func otherStatusesAndTransportFailuresNeverRefresh() async throws {
        let scripted = ScriptedNetworkSession([.status(403), .status(500), .urlError(.notConnectedToInternet), .status(404)])
        let provider = TestTokenProvider(current: "t1")
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: scripted),
            coordinator: TokenRefreshCoordinator(provider: provider)
        )
        var labels: [String] = []
        for index in 0..<3 {
            labels.append(await thrownError { try await engine.send(TestRequest("/\(index)")) }?.label ?? "none")
        }
        #expect(labels == ["httpError(403)", "httpError(500)", "network(no network connection)"])
        let (_, response) = try await engine.response(for: TestRequest("/3"))
        #expect(response.statusCode == 404)
        #expect(provider.refreshCount == 0)
        #expect(scripted.callCount == 4)
    }

    @Test func aFailedRefreshIsThrownAsAuthErrorAndNothingIsRetried() async throws {
        let (engine, session, provider) = Self.fixture(current: "expired", valid: "x", behaviour: .fail(id: 5))
        let error = await thrownError { try await engine.send(TestRequest()) }
        #expect(error?.label == "refreshFailed(5)")
        #expect(session.callCount == 1)
        #expect(provider.refreshCount == 1)
    }

    @Test func withoutATokenTheEngineRefreshesBeforeSendingAnything() async throws {
        let (engine, session, provider) = Self.fixture(current: nil, valid: nil)
        try await engine.send(TestRequest())
        #expect(session.sentTokens == ["Bearer fresh-1"])
        #expect(provider.refreshCount == 1)
    }

    @Test func theLoopGuardStopsAServerThatRejectsEveryFreshToken() async throws {
        let scripted = ScriptedNetworkSession([.status(401)])
        let provider = TestTokenProvider(current: "t0")
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: scripted),
            coordinator: TokenRefreshCoordinator(provider: provider, maxRefreshes: 3, clock: ManualClock())
        )
        var labels: [String] = []
        for index in 0..<5 {
            labels.append(await thrownError { try await engine.send(TestRequest("/\(index)")) }?.label ?? "none")
        }
        #expect(labels == ["httpError(401)", "httpError(401)", "httpError(401)", "excessiveRefresh(3)", "excessiveRefresh(3)"])
        #expect(provider.refreshCount == 3)
        #expect(scripted.callCount == 3 * 2 + 2)  // the refused ones were sent once, not retried
    }

    @Test func concurrent401sThroughTheEngineShareOneRefresh() async throws {
        let gate = Gate()
        let (engine, session, provider) = Self.fixture(current: "expired", valid: "x", gate: gate)
        let tasks = (0..<200).map { index in Task { try await engine.send(TestRequest("/items/\(index)")) } }
        await engine.coordinator.waitForWaiters(200)
        gate.open()
        for task in tasks { #expect(try await task.value.1.statusCode == 200) }
        #expect(provider.refreshCount == 1)
        #expect(session.sentTokens.filter { $0 == "Bearer fresh-1" }.count == 200)
        #expect(session.sentTokens.allSatisfy { $0 == "Bearer expired" || $0 == "Bearer fresh-1" })
    }

    // MARK: Cancellation

    @Test func cancellingARequestThatWaitsForARefreshIsPromptAndTheOthersStillGetTheToken() async throws {
        let gate = Gate()
        let (engine, _, provider) = Self.fixture(current: "expired", valid: "x", gate: gate)
        let leaving = Task { await thrownError { try await engine.send(TestRequest("/a")) } }
        let staying = Task { try await engine.send(TestRequest("/b")) }
        await engine.coordinator.waitForWaiters(2)
        leaving.cancel()
        #expect(await leaving.value?.label == "cancelled")
        // Answered while the refresh is still held: it did not wait for it.
        #expect(engine.coordinator.isRefreshing)
        #expect(engine.coordinator.waiterCount == 1)
        gate.open()
        #expect(try await staying.value.1.statusCode == 200)
        #expect(provider.refreshCount == 1)
        #expect(!provider.sawCancellation)
    }

    // MARK: Secrets and protocol

    @Test func tokensNeverAppearInEventsOrErrorDescriptions() async throws {
        let recorder = EventRecorder()
        let (engine, _, _) = Self.fixture(current: "SECRET-expired", valid: "x", behaviour: .returns("SECRET-fresh"), eventSink: recorder)
        let error = await thrownError { try await engine.send(TestRequest()) }
        #expect(error?.label == "httpError(401)")
        #expect(recorder.events.count >= 4)
        let rendered = recorder.events.map { String(reflecting: $0) } + [String(describing: error!)]
        #expect(!rendered.contains { $0.contains("SECRET") })

        struct LeakyError: Error, CustomStringConvertible { var description: String { "refresh token SECRET-refresh rejected" } }
        let authErrors: [AuthError] = [.refreshFailed(underlying: LeakyError()), .invalidToken, .excessiveRefresh(refreshes: 5, window: .seconds(30))]
        for authError in authErrors {
            #expect(!String(describing: authError).contains("SECRET"))
            #expect(!String(describing: NetworkError.underlying(authError)).contains("SECRET"))
        }
    }

    @Test func theEngineServesAsAnyRequestSender() async throws {
        let (engine, session, _) = Self.fixture(current: "expired", valid: "x")
        let sender: any RequestSending = engine
        let (_, response) = try await sender.response(for: TestRequest())
        #expect(response.statusCode == 200)
        #expect(session.sentTokens == ["Bearer expired", "Bearer fresh-1"])
    }
}
