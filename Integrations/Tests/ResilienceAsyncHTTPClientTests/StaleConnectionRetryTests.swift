import AsyncHTTPClient
import Foundation
import IntegrationTestSupport
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceTesting
import Retry
import Synchronization
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A request whose connection is lost before any response byte arrived is sent again at once, once,
/// by the session — when sending it twice is safe (Docs/Integrations.md, "A connection lost before
/// the response"). Each test first leaves a kept-alive connection in AHC's pool (`warm()`); the
/// server then meets the next request on that pooled connection by reading it and closing the
/// connection without a word, as a server closing an idle keep-alive connection does to a request
/// that crossed its close.
@Suite("AsyncHTTPClientSession re-sends a request whose pooled connection was closed under it", .timeLimit(.minutes(1)))
struct StaleConnectionRetryTests {
    let server: LoopbackHTTPServer
    let session = AsyncHTTPClientSession()

    init() throws {
        server = try LoopbackHTTPServer()
        server.route("/warm", .ok("warm"))
    }

    /// One request that leaves its connection idle in the pool, for the next request to reuse.
    func warm() async throws {
        _ = try await session.data(for: URLRequest(url: server.url("/warm")))
        #expect(server.acceptedConnections == 1)
    }

    @Test func aGETMetByAClosingPooledConnectionIsResentOnceWithoutTheEnginesRetryPolicy() async throws {
        server.route("/feed", [.closeWithoutResponse, .ok("fresh")])
        let policy = CountingRetryPolicy()
        let budget = RetryBudget(retryRatio: 0, minRetriesPerSecond: 0, maxBalance: 1, clock: ManualClock())
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, configuration: .init(retry: .init(policy: policy, budget: budget), eventSink: recorder))
        try await warm()
        let (data, response) = try await engine.send(TestRequest(url: server.url("/feed")))
        #expect(String(decoding: data, as: UTF8.self) == "fresh")
        #expect(response.statusCode == 200)
        #expect(server.hits("/feed") == 2)
        // The first send went on the pooled connection (the one the server closed), the second on a
        // fresh one.
        let connections = server.requestLog.map(\.connectionID)
        #expect(connections.count == 3 && connections[1] == connections[0] && connections[2] != connections[0])
        #expect(recorder.timeline == ["started", "succeeded(200,0)"])  // the engine saw one attempt
        #expect(policy.consultations == 0)
        #expect(budget.balance == 1)
        #expect(session.staleConnectionRetries == 1)  // where the second send shows
    }

    @Test func aResetBeforeTheResponseIsResentToo() async throws {
        server.route("/feed", [.reset, .ok("fresh")])
        try await warm()
        let (data, _) = try await session.data(for: URLRequest(url: server.url("/feed")))
        #expect(String(decoding: data, as: UTF8.self) == "fresh")
        #expect(server.hits("/feed") == 2)
        #expect(session.staleConnectionRetries == 1)
    }

    @Test func aPOSTWithoutAnIdempotencyKeyIsNotResent() async throws {
        server.route("/orders", [.closeWithoutResponse, .ok("created")])
        let engine = AsyncRequestEngine(session: session, retryPolicy: CountingRetryPolicy())
        try await warm()
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/orders"), method: .post, body: Data("{}".utf8))) }
        #expect(error?.caseName == "transport(connectionLost)")
        #expect(server.hits("/orders") == 1)
        #expect(session.staleConnectionRetries == 0)
    }

    @Test func aPOSTWithAnIdempotencyKeyIsResentWithTheSameKeyAndBody() async throws {
        server.route("/orders", [.closeWithoutResponse, .ok("created")])
        let policy = CountingRetryPolicy()
        let engine = AsyncRequestEngine(session: session, retryPolicy: policy)
        let body = Data(#"{"item":7}"#.utf8)
        try await warm()
        let request = TestRequest(url: server.url("/orders"), method: .post, headers: ["Idempotency-Key": "order-7"], body: body)
        let (data, _) = try await engine.send(request)
        #expect(String(decoding: data, as: UTF8.self) == "created")
        let sent = server.requestLog.filter { $0.path == "/orders" }
        #expect(sent.map { $0.header("idempotency-key") } == ["order-7", "order-7"])
        #expect(sent.map(\.body) == [body, body])
        #expect(policy.consultations == 0)
        #expect(session.staleConnectionRetries == 1)
    }

    @Test func aConnectionLostAfterAResponseHeadIsNotResent() async throws {
        server.route("/partial", [.partialBodyThenClose(body: Data(repeating: 0x78, count: 1000)), .ok("whole")])
        // A redirect's head is a response too: the connection lost under the redirected request
        // comes after it.
        server.route("/old", .status(302, headers: ["Location": "/moved"]))
        server.route("/moved", [.closeWithoutResponse, .ok("moved")])
        try await warm()
        for path in ["/partial", "/old"] {
            let error = await networkError { _ = try await session.data(for: URLRequest(url: server.url(path))) }
            #expect(error?.caseName == "transport(connectionLost)", "\(path)")
        }
        #expect(server.hits("/partial") == 1)
        #expect(server.hits("/moved") == 1)
        #expect(session.staleConnectionRetries == 0)
    }

    @Test func aConnectionLostInsideTheResponseHeadIsNotResent() async throws {
        server.route("/half-head", [.raw(Data("HTTP/1.1 200 OK\r\nContent-Le".utf8)), .ok("whole")])
        try await warm()
        let error = await networkError { _ = try await session.data(for: URLRequest(url: server.url("/half-head"))) }
        #expect(error?.caseName == "transport(connectionLost)")
        #expect(server.hits("/half-head") == 1)
        #expect(session.staleConnectionRetries == 0)
    }

    @Test func aSecondLossInARowIsTheErrorAndTheEnginesPolicyThenApplies() async throws {
        server.route("/twice", [.closeWithoutResponse, .closeWithoutResponse, .ok("never asked for")])
        try await warm()
        let error = await networkError { try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/twice"))) }
        #expect(error?.caseName == "transport(connectionLost)")
        #expect(server.hits("/twice") == 2)
        #expect(session.staleConnectionRetries == 1)

        // With a policy, the engine retries the second loss as it retries any connection loss; its
        // retry is a call of its own, which may be re-sent once in turn.
        server.route("/thrice", [.closeWithoutResponse, .closeWithoutResponse, .closeWithoutResponse, .ok("third call")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), eventSink: recorder)
        let (data, _) = try await engine.send(TestRequest(url: server.url("/thrice")))
        #expect(String(decoding: data, as: UTF8.self) == "third call")
        #expect(server.hits("/thrice") == 4)
        #expect(recorder.timeline == ["started", "retry(0,0.0)", "succeeded(200,1)"])
        #expect(session.staleConnectionRetries == 3)  // one per call: here the first and the engine's retry
    }

    @Test func cancellingTheCallerDuringTheResentRequestAnswersCancelledAndClosesItsConnection() async throws {
        server.route("/held", [.closeWithoutResponse, LoopbackResponse.ok("late").held()])
        let engine = AsyncRequestEngine(session: session)
        let url = server.url("/held")
        try await warm()
        let caller = Task { await networkError { try await engine.send(TestRequest(url: url)) } }
        await server.waitForHits("/held", atLeast: 2)  // the re-sent request is on the wire, held
        caller.cancel()
        #expect(await caller.value?.caseName == "cancelled")
        await server.waitForOpenConnections(atMost: 0)
        #expect(server.hits("/held") == 2)
    }

    /// The request's `timeoutInterval` is one deadline for both sends: the first uses 2 s of its
    /// 4 s, so the re-sent one, held by the server, times out 2 s later (6 s if it had its own).
    /// The server's close may come up to 2 s late on a loaded machine and the first send still be
    /// re-sent (with 0.5 s of slack it once came too late, in CI, and the test saw one send); the
    /// bound leaves a second either way.
    @Test func theRequestsTimeoutBoundsBothSends() async throws {
        server.route("/slow-close", [LoopbackResponse.closeWithoutResponse.delayed(by: .seconds(2)), LoopbackResponse.ok().held()])
        try await warm()
        var request = URLRequest(url: server.url("/slow-close"))
        request.timeoutInterval = 4
        let clock = ContinuousClock()
        let start = clock.now
        let error = await networkError { _ = try await session.data(for: request) }
        let elapsed = clock.now - start
        #expect(error?.caseName == "timedOut")
        #expect(server.hits("/slow-close") == 2)
        #expect(elapsed < .seconds(5), "the re-sent request had a deadline of its own: \(elapsed)")
    }

    @Test func aTimeoutIsNotResent() async throws {
        server.route("/stuck", [LoopbackResponse.ok().held(), .ok("fast")])
        try await warm()
        var request = URLRequest(url: server.url("/stuck"))
        request.timeoutInterval = 0.3
        let error = await networkError { _ = try await session.data(for: request) }
        #expect(error?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)
        #expect(server.hits("/stuck") == 1)
        #expect(session.staleConnectionRetries == 0)
    }
}

/// Allows three retries at once and counts how often the engine asked.
final class CountingRetryPolicy: RetryPolicy {
    private let asked = Mutex(0)

    var consultations: Int { asked.withLock { $0 } }

    func delay(forAttempt attempt: Int) -> TimeInterval? {
        asked.withLock { $0 += 1 }
        return attempt < 3 ? 0 : nil
    }
}
