import Foundation
import HTTPTypes
import IntegrationTestSupport
import OpenAPIRuntime
import Reachability
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceOpenAPI
import ResilienceTesting
import ResponseCache
import Retry
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `ResilienceTransport` as a generated client drives it (`send(_:body:baseURL:operationID:)` with
/// swift-http-types values), over the engine on real AsyncHTTPClient, against a real HTTP server
/// on 127.0.0.1.
@Suite("ResilienceTransport over AsyncHTTPClientSession against LoopbackHTTPServer", .timeLimit(.minutes(2)))
struct ResilienceTransportTests {
    let server: LoopbackHTTPServer
    let session = AsyncHTTPClientSession()

    init() throws {
        server = try LoopbackHTTPServer()
    }

    var baseURL: URL { server.url("/api") }

    func request(_ method: HTTPRequest.Method, _ path: String, _ fields: HTTPFields = [:]) -> HTTPRequest {
        HTTPRequest(method: method, scheme: nil, authority: nil, path: path, headerFields: fields)
    }

    func retryingEngine(_ configuration: AsyncRequestEngine.Configuration = .init()) -> AsyncRequestEngine {
        var configuration = configuration
        configuration.retry.policy = FixedIntervalRetryPolicy(maxRetries: 3, interval: 0)
        return AsyncRequestEngine(session: session, configuration: configuration)
    }

    // MARK: Requests and responses

    @Test func theRequestGoesToTheBaseURLWithItsPathQueryHeadersAndBody() async throws {
        server.route("/api/notes", .status(201, headers: ["Content-Type": "application/json", "ETag": "\"v1\""], body: #"{"id":"n1"}"#))
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session))
        let (response, body) = try await transport.send(
            request(.post, "/notes?draft=true", [.contentType: "application/json", .init("X-Client")!: "tests"]),
            body: HTTPBody(#"{"text":"hello"}"#), baseURL: server.url("/api/"), operationID: "createNote")
        #expect(response.status == .created)
        #expect(response.headerFields[.eTag] == "\"v1\"")
        #expect(try await String(collecting: try #require(body), upTo: 1024) == #"{"id":"n1"}"#)
        let seen = try #require(server.requestLog.last)
        #expect(seen.method == "POST")
        #expect(seen.target == "/api/notes?draft=true")
        #expect(seen.header("x-client") == "tests")
        #expect(seen.body == Data(#"{"text":"hello"}"#.utf8))
    }

    @Test func everyStatusIsReturnedToTheClientNotThrown() async throws {
        server.route("/api/notes/missing", .status(404, body: "no such note"))
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session))
        let (response, body) = try await transport.send(request(.get, "/notes/missing"), body: nil, baseURL: baseURL, operationID: "getNote")
        #expect(response.status.code == 404)
        #expect(try await String(collecting: try #require(body), upTo: 1024) == "no such note")
    }

    @Test func repeatedHeaderFieldsSurviveBothWays() async throws {
        let expires = "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT"
        server.route(
            "/api/tags",
            .raw(Data("HTTP/1.1 200 OK\r\nX-Tag: a\r\nSet-Cookie: \(expires)\r\nX-Tag: b\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n".utf8)))
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session))
        var fields = HTTPFields()
        fields.append(HTTPField(name: .init("X-Tag")!, value: "one"))
        fields.append(HTTPField(name: .init("X-Tag")!, value: "two"))
        fields.append(HTTPField(name: .cookie, value: "a=1"))
        fields.append(HTTPField(name: .cookie, value: "b=2"))
        let (response, _) = try await transport.send(request(.get, "/tags", fields), body: nil, baseURL: baseURL, operationID: "listTags")
        let seen = try #require(server.requestLog.last)
        #expect(seen.header("x-tag") == "one, two")
        #expect(seen.header("cookie") == "a=1; b=2")
        // Every response field as received, in order, a repeated one as separate fields: two
        // `Set-Cookie` (commas inside one) stay two, and the client reads `X-Tag` as `HTTPFields`
        // joins repeated fields.
        #expect(response.headerFields[values: .setCookie] == [expires, "b=2"])
        #expect(response.headerFields[values: .init("X-Tag")!] == ["a", "b"])
        #expect(response.headerFields[.init("X-Tag")!] == "a, b")
        #expect(response.headerFields.map(\.name.rawName) == ["X-Tag", "Set-Cookie", "X-Tag", "Set-Cookie", "Content-Length"])
    }

    // MARK: Retries by operation

    @Test func a503BurstIsRetriedWithTheSameIdempotencyKeyAndOneEffect() async throws {
        server.route("/api/notes", [.status(503), .status(503), .status(201, body: "created")])
        let transport = ResilienceTransport(sender: retryingEngine())
        let (response, _) = try await transport.send(
            request(.post, "/notes", [.init("Idempotency-Key")!: "note-7"]), body: HTTPBody("x"), baseURL: baseURL, operationID: "createNote")
        #expect(response.status == .created)
        #expect(server.requestLog.map { $0.header("idempotency-key") } == ["note-7", "note-7", "note-7"])
    }

    @Test func aPOSTWithoutAKeyIsNotRetried() async throws {
        server.route("/api/notes", [.status(503), .status(201)])
        let transport = ResilienceTransport(sender: retryingEngine())
        let (response, _) = try await transport.send(request(.post, "/notes"), body: HTTPBody("x"), baseURL: baseURL, operationID: "createNote")
        #expect(response.status.code == 503)
        #expect(server.hits("/api/notes") == 1)
    }

    @Test func anOperationDeclaredRetryableIsRetriedWithoutAKey() async throws {
        server.route("/api/notes", [.status(503), .status(201)])
        let configuration = ResilienceTransport.Configuration(operationPolicy: { $0 == "createNote" ? OperationPolicy(retryable: true) : OperationPolicy() })
        let transport = ResilienceTransport(sender: retryingEngine(), configuration: configuration)
        let (response, _) = try await transport.send(request(.post, "/notes"), body: HTTPBody("x"), baseURL: baseURL, operationID: "createNote")
        #expect(response.status == .created)
        #expect(server.hits("/api/notes") == 2)
    }

    @Test func anOperationDeclaredNotRetryableIsSentOnceEvenAsAGET() async throws {
        server.route("/api/report", [.status(503), .ok("late")])
        let configuration = ResilienceTransport.Configuration(operationPolicy: { _ in OperationPolicy(retryable: false) })
        let transport = ResilienceTransport(sender: retryingEngine(), configuration: configuration)
        let (response, _) = try await transport.send(request(.get, "/report"), body: nil, baseURL: baseURL, operationID: "runReport")
        #expect(response.status.code == 503)
        #expect(server.hits("/api/report") == 1)
    }

    // MARK: Breakers and the cache by operation

    @Test func aFailingOperationOpensItsOwnBreakerAndNotTheOthers() async throws {
        server.route("/api/broken", .status(500))
        server.route("/api/fine", .ok("fine"))
        let registry = CircuitBreakerRegistry(configuration: .init(windowSize: 4, minimumCalls: 4, failureRateThreshold: 0.5, openDuration: .seconds(3600)))
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perOperation(registry)))
        let transport = ResilienceTransport(sender: engine)
        for _ in 0..<4 {
            let (response, _) = try await transport.send(request(.get, "/broken"), body: nil, baseURL: baseURL, operationID: "getBroken")
            #expect(response.status.code == 500)
        }
        let refused = await networkError { _ = try await transport.send(request(.get, "/broken"), body: nil, baseURL: baseURL, operationID: "getBroken") }
        #expect(refused?.caseName == "circuitOpen")
        #expect(server.hits("/api/broken") == 4)
        let (fine, _) = try await transport.send(request(.get, "/fine"), body: nil, baseURL: baseURL, operationID: "getFine")
        #expect(fine.status == .ok)
        let host = try #require(CircuitBreakerRegistry.authority(of: baseURL))
        #expect(registry.breaker(forOperation: "getBroken", onHost: host).state == .open)
        #expect(registry.breaker(forOperation: "getFine", onHost: host).state == .closed)
    }

    @Test func anOperationDeclaredNotCacheableIsNeverAnsweredFromTheCache() async throws {
        server.route("/api/quota", .status(200, headers: ["Cache-Control": "max-age=600"], body: "quota"))
        server.route("/api/notes", .status(200, headers: ["Cache-Control": "max-age=600"], body: "notes"))
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("openapi-cache-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let cached = CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session), cache: try DiskResponseCache(directory: folder, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true))
        let configuration = ResilienceTransport.Configuration(operationPolicy: { $0 == "getQuota" ? OperationPolicy(cacheable: false) : OperationPolicy() })
        let transport = ResilienceTransport(sender: cached, configuration: configuration)
        for _ in 0..<2 {
            _ = try await transport.send(request(.get, "/quota"), body: nil, baseURL: baseURL, operationID: "getQuota")
            _ = try await transport.send(request(.get, "/notes"), body: nil, baseURL: baseURL, operationID: "listNotes")
        }
        #expect(server.hits("/api/quota") == 2)
        #expect(server.hits("/api/notes") == 1)
    }

    // MARK: Bounds and cancellation

    @Test func aRequestBodyOverTheBoundFailsWithTheTypedErrorAndSendsNothing() async throws {
        server.route("/api/upload", .ok())
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session), configuration: .init(maximumRequestBodySize: 8))
        await #expect(throws: ResilienceTransportError.requestBodyTooLarge(limit: 8)) {
            _ = try await transport.send(request(.put, "/upload"), body: HTTPBody("nine bytes"), baseURL: baseURL, operationID: "upload")
        }
        // A body of unknown length is read up to the bound, then refused.
        let streamed = HTTPBody(
            AsyncStream { continuation in
                for _ in 0..<4 { continuation.yield(ArraySlice("abc".utf8)) }
                continuation.finish()
            }, length: .unknown, iterationBehavior: .single)
        await #expect(throws: ResilienceTransportError.requestBodyTooLarge(limit: 8)) {
            _ = try await transport.send(request(.put, "/upload"), body: streamed, baseURL: baseURL, operationID: "upload")
        }
        #expect(server.totalHits == 0)
        let (response, _) = try await transport.send(request(.put, "/upload"), body: HTTPBody("8 bytes!"), baseURL: baseURL, operationID: "upload")
        #expect(response.status == .ok)
    }

    @Test func aResponseBodyOverTheBoundFailsWithResponseTooLarge() async throws {
        server.route("/api/big", .ok(String(repeating: "x", count: 4096)))
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session), configuration: .init(maximumResponseBodySize: 1024))
        let error = await networkError { _ = try await transport.send(request(.get, "/big"), body: nil, baseURL: baseURL, operationID: "getBig") }
        #expect(error?.caseName == "responseTooLarge(1024)")
    }

    @Test func cancellingTheOperationCancelsItsRequest() async throws {
        server.route("/api/slow", LoopbackResponse.ok().held())
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session))
        let call = Task { [baseURL] in
            await networkError { _ = try await transport.send(self.request(.get, "/slow"), body: nil, baseURL: baseURL, operationID: "getSlow") }
        }
        await server.waitForHits("/api/slow", atLeast: 1)
        call.cancel()
        #expect(await call.value?.caseName == "cancelled")
        await server.waitForOpenConnections(atMost: 0)  // the request stopped, not left running
    }

    @Test func aMethodTheEngineDoesNotSendAndABadBaseURLAreTypedErrors() async throws {
        let transport = ResilienceTransport(sender: AsyncRequestEngine(session: session))
        await #expect(throws: ResilienceTransportError.self) {
            _ = try await transport.send(request(.trace, "/x"), body: nil, baseURL: baseURL, operationID: "trace")
        }
        await #expect(throws: ResilienceTransportError.self) {
            _ = try await transport.send(request(.get, "/x"), body: nil, baseURL: URL(string: "file:///tmp")!, operationID: "local")
        }
        #expect(server.totalHits == 0)
    }
}
