import AsyncHTTPClient
import Auth
import Foundation
import IntegrationTestSupport
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceTesting
import Retry
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The engine over real AsyncHTTPClient against a real HTTP server on 127.0.0.1, mirroring the
/// URLSession path's tests (Tests/RequestEngineTests/AsyncRequestEngineIntegrationTests.swift and
/// TransportIntegrationTests.swift). Backoff and timeouts run on a ManualClock where a test needs
/// to control them. "The server saw the connection close" is how a test knows that a request
/// really stopped: the server counts the client's close.
@Suite("AsyncRequestEngine over AsyncHTTPClientSession against LoopbackHTTPServer", .timeLimit(.minutes(2)))
struct AsyncHTTPClientSessionTests {
    let server: LoopbackHTTPServer
    let session = AsyncHTTPClientSession()

    init() throws {
        server = try LoopbackHTTPServer()
    }

    // MARK: Responses

    @Test func aGETReturnsTheBodyStatusHeadersAndURLAsURLSessionWould() async throws {
        server.route("/feed", LoopbackResponse(status: 200, headers: ["X-Thing": "one", "Content-Type": "text/plain; charset=utf-8"], body: Data("the feed".utf8)))
        let (data, response) = try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/feed")))
        #expect(String(decoding: data, as: UTF8.self) == "the feed")
        #expect(response.statusCode == 200)
        #expect(response.value(forHTTPHeaderField: "x-thing") == "one")
        #expect(response.expectedContentLength == 8)
        #expect(response.mimeType == "text/plain")
        #expect(response.url == server.url("/feed"))
    }

    @Test func headersAndBodyReachTheServer() async throws {
        server.route("/echo", .ok())
        let body = Data(#"{"name":"x"}"#.utf8)
        var request = TestRequest(url: server.url("/echo"), method: .post, headers: ["X-Custom": "abc", "Content-Type": "application/json"])
        request.body = body
        _ = try await AsyncRequestEngine(session: session).send(request)
        let seen = try #require(server.requestLog.last)
        #expect(seen.method == "POST")
        #expect(seen.header("x-custom") == "abc")
        #expect(seen.header("content-type") == "application/json")
        #expect(seen.body == body)
    }

    @Test func aNon2xxStatusIsAnHTTPErrorWithItsBody() async throws {
        server.route("/missing", .status(404, body: "not here"))
        let error = await networkError { try await AsyncRequestEngine(session: self.session).send(TestRequest(url: server.url("/missing"))) }
        guard case .httpError(404, let data) = error else {
            Issue.record("expected httpError(404), got \(String(describing: error))")
            return
        }
        #expect(data == Data("not here".utf8))
    }

    @Test func redirectsAreFollowedAndTheResponseCarriesTheFinalURL() async throws {
        server.route("/old", .status(302, headers: ["Location": "/new"]))
        server.route("/new", .ok("moved here"))
        let (data, response) = try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/old")))
        #expect(String(decoding: data, as: UTF8.self) == "moved here")
        #expect(response.url?.path == "/new")
    }

    @Test func repeatedHeaderFieldsAreJoinedAsURLSessionJoinsThem() async throws {
        server.route("/twice", .raw(Data("HTTP/1.1 200 OK\r\nX-Multi: a\r\nX-Multi: b\r\nContent-Length: 0\r\n\r\n".utf8)))
        let (_, response) = try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/twice")))
        #expect(response.value(forHTTPHeaderField: "X-Multi") == "a, b")
    }

    // MARK: Retries, Retry-After, deduplication

    @Test func serverErrorsThenSuccessAreRetried() async throws {
        server.route("/flaky", [.status(503), .status(503), .ok("finally")])
        let clock = ManualClock()
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, retryPolicy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0), eventSink: recorder, clock: clock)
        let url = server.url("/flaky")
        let task = Task { try await engine.send(TestRequest(url: url)) }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        await server.waitForHits("/flaky", atLeast: 2)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(2))
        let (data, response) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "finally")
        #expect(response.statusCode == 200)
        #expect(server.hits("/flaky") == 3)
        #expect(recorder.timeline == ["started", "retry(0,1.0)", "retry(1,2.0)", "succeeded(200,2)"])
    }

    @Test func retryAfterFromTheServerIsHonoured() async throws {
        server.route("/limited", [.status(429, headers: ["Retry-After": "3"]), .ok()])
        let clock = ManualClock()
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0.5), clock: clock)
        let url = server.url("/limited")
        let task = Task { try await engine.send(TestRequest(url: url)) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == .init(offset: .seconds(3)))
        clock.advance(by: .seconds(2))
        #expect(server.hits("/limited") == 1)  // not yet: the server asked for 3 s
        clock.advance(by: .seconds(1))
        _ = try await task.value
        #expect(server.hits("/limited") == 2)
    }

    @Test func concurrentIdenticalGETsMakeOneNetworkCall() async throws {
        server.route("/feed", LoopbackResponse.ok("the feed").held())
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder)
        let url = server.url("/feed")
        let bodies = try await withThrowingTaskGroup(of: Data.self) { group in
            for _ in 0..<200 {
                group.addTask { try await engine.send(TestRequest(url: url)).0 }
            }
            await recorder.waitForDeduplicated(199)
            await server.waitForHits("/feed", atLeast: 1)
            server.releaseHeld("/feed")
            return try await group.reduce(into: [Data]()) { $0.append($1) }
        }
        #expect(bodies.count == 200)
        #expect(Set(bodies) == [Data("the feed".utf8)])
        #expect(server.hits("/feed") == 1)
    }

    @Test func postIsRetriedOnlyWithAnIdempotencyKeyWhichEveryAttemptCarries() async throws {
        server.route("/orders", [.status(503), .ok("created"), .status(503)])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0))
        let keyed = TestRequest(url: server.url("/orders"), method: .post, headers: ["Idempotency-Key": "k-1"])
        _ = try await engine.send(keyed)
        #expect(server.requestLog.map { $0.header("idempotency-key") } == ["k-1", "k-1"])
        let unkeyed = TestRequest(url: server.url("/orders"), method: .post)
        let error = await networkError { try await engine.send(unkeyed) }
        #expect(error?.caseName == "httpError(503)")
        #expect(server.hits("/orders") == 3)
    }

    // MARK: Timeouts and cancellation

    /// The engine's own timer over AHC: a host limit keeps a request off the caller's-task path
    /// (where AHC's deadline times it, `aRequestThatSharesNothingIsTimedByAHCInTheCallersTask`).
    static let enginesTimer = AsyncRequestEngine.Limits(concurrencyPerHost: 8)

    @Test func aSlowServerTimesOutOnTheEnginesClockAndTheConnectionIsClosed() async throws {
        server.route("/stuck", LoopbackResponse.ok().held())
        let clock = ManualClock()
        let engine = AsyncRequestEngine(session: session, configuration: .init(limits: Self.enginesTimer), clock: clock)
        let url = server.url("/stuck")
        let task = Task { await networkError { try await engine.send(TestRequest(url: url, timeout: 5)) } }
        await server.waitForHits("/stuck", atLeast: 1)
        await clock.waitForSleepers(1)  // the attempt's timeout
        clock.advance(by: .seconds(5))
        #expect(await task.value?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)  // AHC's request was cancelled, not left running
    }

    @Test func aTimedOutAttemptIsRetriedOverAFreshConnection() async throws {
        server.route("/slow-then-fast", [LoopbackResponse.ok("late").held(), .ok("in time")])
        let clock = ManualClock()
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0)), limits: Self.enginesTimer), clock: clock
        )
        let url = server.url("/slow-then-fast")
        let task = Task { try await engine.send(TestRequest(url: url, timeout: 5)) }
        await server.waitForHits("/slow-then-fast", atLeast: 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(5))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "in time")
        #expect(server.hits("/slow-then-fast") == 2)
    }

    @Test func theRequestsTimeoutIsAlsoAHCsDeadlineForDirectCallers() async throws {
        server.route("/stuck", LoopbackResponse.ok().held())
        var request = URLRequest(url: server.url("/stuck"))
        request.timeoutInterval = 0.2  // a real deadline: what is under test is AHC's own timer
        let error = await networkError { _ = try await session.data(for: request) }
        #expect(error?.caseName == "timedOut")
    }

    /// A POST shares nothing and AHC bounds its calls (`honorsTimeoutAndCancellation`): the engine
    /// runs it in the caller's task and AHC's deadline times it. The engine's own clock is a
    /// ManualClock that is never advanced, so the timeout can only be AHC's (a real 0.3 s).
    @Test func aRequestThatSharesNothingIsTimedByAHCInTheCallersTask() async throws {
        server.route("/stuck", LoopbackResponse.ok().held())
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/stuck"), method: .post, timeout: 0.3)) }
        #expect(error?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)
    }

    /// AHC's async `execute` stops its deadline at the response head; the session's deadline covers
    /// the body too, so a body that keeps trickling in cannot outlive the timeout.
    @Test func theTimeoutBoundsABodyThatKeepsArriving() async throws {
        server.route("/trickle", .endlessChunkedBody(chunk: Data(repeating: 0x74, count: 16), interval: .milliseconds(5)))
        var request = URLRequest(url: server.url("/trickle"))
        request.timeoutInterval = 0.3
        let error = await networkError { _ = try await session.data(for: request, maximumBodySize: nil) }
        #expect(error?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aDeadlineSoonerThanTheTimeoutCutsARequestRunInTheCallersTask() async throws {
        server.route("/stuck", LoopbackResponse.ok().held())
        let engine = AsyncRequestEngine(session: session, configuration: .init(deadline: .milliseconds(300)))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/stuck"), method: .put, timeout: 30)) }
        #expect(error?.caseName == "deadlineExceeded")
        #expect(server.hits("/stuck") == 1)
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aCallerCancelledMidRequestIsAnsweredAndTheAHCRequestIsCancelled() async throws {
        server.route("/slow", LoopbackResponse.ok().held())
        let engine = AsyncRequestEngine(session: session)
        let url = server.url("/slow")
        let task = Task { await networkError { try await engine.send(TestRequest(url: url, method: .post)) } }
        await server.waitForHits("/slow", atLeast: 1)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        #expect(server.hits("/slow") == 1)  // not retried
        await server.waitForOpenConnections(atMost: 0)  // the connection was torn down
    }

    @Test func aCallerCancelledDuringAnEndlessBodyIsAnsweredAndTheTransferEnds() async throws {
        server.route("/endless", .endlessChunkedBody(chunk: Data(repeating: 0x63, count: 1024), interval: .milliseconds(2)))
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: nil))
        let url = server.url("/endless")
        let task = Task { await networkError { try await engine.send(TestRequest(url: url)) } }
        await server.waitForHits("/endless", atLeast: 1)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        await server.waitForOpenConnections(atMost: 0)
    }

    /// The case URLSession on Linux cannot stop (Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md): a body written as fast as
    /// the client reads it. The timeout answers the caller and AHC's cancel closes the connection.
    @Test func aTimeoutDuringAFullSpeedEndlessBodyClosesTheConnection() async throws {
        server.route("/flood", .endlessChunkedBody(chunk: Data(repeating: 0x66, count: 64 * 1024)))
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: nil))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/flood"), timeout: 0.3)) }
        #expect(error?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func cancellingOneDeduplicatedWaiterLeavesTheSharedCallRunning() async throws {
        server.route("/shared", LoopbackResponse.ok("kept").held())
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder)
        let url = server.url("/shared")
        let stayer = Task { try await engine.send(TestRequest(url: url)) }
        let quitter = Task { await networkError { try await engine.send(TestRequest(url: url)) } }
        await recorder.waitForDeduplicated(1)
        await server.waitForHits("/shared", atLeast: 1)
        quitter.cancel()
        #expect(await quitter.value?.caseName == "cancelled")
        #expect(server.heldCount("/shared") == 1)
        server.releaseHeld("/shared")
        #expect(String(decoding: try await stayer.value.0, as: UTF8.self) == "kept")
        #expect(server.hits("/shared") == 1)
    }

    @Test func cancellingManyInFlightRequestsAnswersEveryCallerAndClosesEveryConnection() async throws {
        let count = 64
        server.route("/held/*", LoopbackResponse.ok().held())
        // AHC opens at most 8 connections per host by default; every request must be on the wire.
        var configuration = AsyncHTTPClientSession.recommendedConfiguration
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = count
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
        let engine = AsyncRequestEngine(session: AsyncHTTPClientSession(client: client))
        let callers = (0..<count).map { index in
            Task { [server] in await networkError { try await engine.send(TestRequest(url: server.url("/held/\(index)"))) } }
        }
        await server.waitForHits("/held/*", atLeast: count)  // every request is on the wire, held
        for caller in callers { caller.cancel() }
        var answers: [String] = []
        for caller in callers { answers.append(await caller.value?.caseName ?? "success") }
        #expect(answers == Array(repeating: "cancelled", count: count))
        await server.waitForOpenConnections(atMost: 0)
        try await client.shutdown()
    }

    // MARK: 401 refresh through AuthenticatedRequestEngine

    @Test func a401IsRefreshedOnceAndRetriedWithTheNewToken() async throws {
        server.route(
            "/me",
            handler: { request in
                request.header("authorization") == "Bearer fresh" ? .ok("me") : .status(401)
            })
        let provider = CountingTokenProvider(current: "stale", next: "fresh")
        let authenticated = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session),
            coordinator: TokenRefreshCoordinator(provider: provider)
        )
        let url = server.url("/me")
        let bodies = try await withThrowingTaskGroup(of: Data.self) { group in
            for _ in 0..<8 { group.addTask { try await authenticated.send(TestRequest(url: url, method: .post)).0 } }
            return try await group.reduce(into: [Data]()) { $0.append($1) }
        }
        #expect(Set(bodies) == [Data("me".utf8)])
        #expect(provider.refreshes == 1)
        #expect(server.requestLog.filter { $0.header("authorization") == "Bearer fresh" }.count == 8)
    }

    // MARK: Error mapping, end to end

    @Test func connectionRefusedIsATypedRetryableError() async throws {
        let refusing = try RefusingPort()
        let url = try #require(URL(string: "http://127.0.0.1:\(refusing.port)/nothing"))
        let error = try #require(await networkError { try await AsyncRequestEngine(session: session).send(TestRequest(url: url)) })
        #expect(error.caseName == "transport(cannotConnectToHost)")
        #expect(error.isRetryable)
    }

    @Test func aResetConnectionIsARetryableConnectionLoss() async throws {
        server.route("/reset", .reset)
        let error = try #require(await networkError { try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/reset"))) })
        #expect(error.caseName == "transport(connectionLost)")
        #expect(error.isRetryable)
    }

    @Test func aRedirectLoopIsTooManyRedirectsAndNotRetried() async throws {
        server.route("/loop", .status(302, headers: ["Location": "/loop"]))
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/loop"))) }
        #expect(error?.caseName == "tooManyRedirects")
        #expect(server.hits("/loop") == 1)  // AHC sees the cycle at once, and the engine does not retry it
    }

    @Test func aRedirectChainLongerThanTheLimitIsTooManyRedirects() async throws {
        for step in 0..<30 { server.route("/hop/\(step)", .status(302, headers: ["Location": "/hop/\(step + 1)"])) }
        let error = await networkError { try await AsyncRequestEngine(session: self.session).send(TestRequest(url: server.url("/hop/0"))) }
        #expect(error?.caseName == "tooManyRedirects")
        #expect(server.hits("/hop/*") == 21)  // the first request and 20 redirects followed
    }

    @Test func aHeaderBlockLargerThanTheParserAcceptsIsResponseHeadersTooLarge() async throws {
        server.route("/huge-header", .status(200, headers: ["X-Huge": String(repeating: "a", count: 200_000)], body: "x"))
        let error = await networkError { try await AsyncRequestEngine(session: self.session).send(TestRequest(url: server.url("/huge-header"))) }
        #expect(error?.caseName == "responseHeadersTooLarge")
    }

    @Test func abruptClosesAreRetriedConnectionLosses() async throws {
        server.route("/drop", [.closeWithoutResponse, .reset, .ok("third time")])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        let (data, _) = try await engine.send(TestRequest(url: server.url("/drop")))
        #expect(String(decoding: data, as: UTF8.self) == "third time")
        #expect(server.hits("/drop") == 3)
    }

    @Test func aBodyShorterThanItsContentLengthIsARetriedConnectionLoss() async throws {
        server.route("/short", [.partialBodyThenClose(body: Data(repeating: 0x78, count: 1000)), .ok("whole")])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0))
        let (data, _) = try await engine.send(TestRequest(url: server.url("/short")))
        #expect(String(decoding: data, as: UTF8.self) == "whole")
        #expect(server.hits("/short") == 2)
    }

    @Test func aChunkedBodyWithoutItsLastChunkIsAConnectionLoss() async throws {
        server.route("/cut", .raw(Data("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".utf8)))
        let error = await networkError { try await AsyncRequestEngine(session: self.session).send(TestRequest(url: server.url("/cut"))) }
        #expect(error?.caseName == "transport(connectionLost)")
    }

    @Test func anUnresolvableHostIsADNSFailure() async throws {
        // `.invalid` is reserved (RFC 6761): no resolver answers for it, on any network.
        let url = try #require(URL(string: "http://no-such-host.invalid/x"))
        let error = try #require(await networkError { try await AsyncRequestEngine(session: session).send(TestRequest(url: url, timeout: 30)) })
        #expect(error.caseName == "transport(dnsFailure)")
        #expect(error.isRetryable)
    }

    @Test func httpsToAPlainHTTPPortIsATLSFailureAndNotRetried() async throws {
        let plain = try PlainHTTPResponder()
        let url = try #require(URL(string: "https://127.0.0.1:\(plain.port)/plain"))
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        let error = try #require(await networkError { try await engine.send(TestRequest(url: url)) })
        #expect(error.caseName == "transport(secureConnectionFailed)")
        #expect(!error.isRetryable)
    }

    @Test func garbageBytesAreAnInvalidResponseNotACrash() async throws {
        server.route("/garbage", .raw(Data("SSH-2.0-OpenSSH_9.2\r\n\r\n".utf8)))
        server.route("/binary", .raw(Data([0x00, 0xFF, 0x13, 0x37, 0x0D, 0x0A, 0x0D, 0x0A])))
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        for path in ["/garbage", "/binary"] {
            let error = await networkError { try await engine.send(TestRequest(url: server.url(path))) }
            #expect(error?.caseName == "invalidResponse", "\(path): \(String(describing: error))")
            #expect(server.hits(path) == 1)  // not retried
        }
    }

    @Test func aURLRequestWithoutAURLIsAnInvalidRequest() async throws {
        var request = URLRequest(url: server.url("/x"))
        request.url = nil
        let error = await networkError { _ = try await session.data(for: request) }
        #expect(error?.caseName == "invalidRequest")
    }

    // MARK: Body size limit

    @Test func anEndlessBodyStopsAtTheLimitAndTheConnectionIsClosed() async throws {
        server.route("/endless", .endlessChunkedBody(chunk: Data(repeating: 0x65, count: 16 * 1024), interval: .milliseconds(1)))
        let engine = AsyncRequestEngine(session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0)), maximumResponseBodySize: 256 * 1024))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/endless"))) }
        #expect(error?.caseName == "responseTooLarge(262144)")
        #expect(server.hits("/endless") == 1)
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aContentLengthOverTheLimitIsRejectedBeforeTheBodyIsRead() async throws {
        // 1 GB announced, 3 bytes sent, the connection kept open: waiting for the body would hang.
        server.route("/huge", LoopbackResponse(status: 200, headers: ["Content-Length": "1000000000"], body: Data("abc".utf8)))
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: 1024 * 1024))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/huge"))) }
        guard case .responseTooLarge(1024 * 1024, let status) = error else {
            Issue.record("expected responseTooLarge, got \(String(describing: error))")
            return
        }
        #expect(status == 200)
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aHEADResponsesContentLengthIsNotABody() async throws {
        server.route("/huge", LoopbackResponse(status: 200, headers: ["Content-Length": "1000000000"]))
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: 1024))
        let (data, response) = try await engine.send(TestRequest(url: server.url("/huge"), method: .head))
        #expect(data.isEmpty)
        #expect(response.expectedContentLength == 1_000_000_000)
    }

    @Test func aBodyWithinTheLimitArrivesWhole() async throws {
        let payload = Data((0..<(3 * 1024 * 1024 + 17)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        server.route("/blob", LoopbackResponse(status: 200, body: payload))
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: payload.count))
        #expect(try await engine.send(TestRequest(url: server.url("/blob"))).0 == payload)
    }

    @Test func theRequestsOwnLimitReplacesTheEngines() async throws {
        server.route("/ticks", .endlessChunkedBody(chunk: Data(repeating: 0x74, count: 4096), interval: .milliseconds(1)))
        let engine = AsyncRequestEngine(session: session)
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/ticks"), maximumResponseBodySize: 64 * 1024)) }
        #expect(error?.caseName == "responseTooLarge(65536)")
        await server.waitForOpenConnections(atMost: 0)
    }

    // MARK: Clients

    @Test func theCallersClientIsUsedAndStaysTheCallers() async throws {
        server.route("/own", .ok("own client"))
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: AsyncHTTPClientSession.recommendedConfiguration)
        let session = AsyncHTTPClientSession(client: client)
        #expect(session.client === client)
        let (data, _) = try await AsyncRequestEngine(session: session).send(TestRequest(url: server.url("/own")))
        #expect(String(decoding: data, as: UTF8.self) == "own client")
        try await client.shutdown()
    }

    @Test func theRecommendedConfigurationFailsConnectionsFastAndKeepsURLsOutOfAHCsSpans() {
        let configuration = AsyncHTTPClientSession.recommendedConfiguration
        #expect(configuration.connectionPool.retryConnectionEstablishment == false)
        #expect(configuration.tracing.tracer == nil)
        #expect(AsyncHTTPClientSession().client === AsyncHTTPClientSession.sharedClient)
    }
}
