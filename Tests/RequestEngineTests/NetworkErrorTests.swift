import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("NetworkError mapping, retryability and request validation")
struct NetworkErrorTests {
    @Test(arguments: [
        (URLError.Code.notConnectedToInternet, "noConnection", true),
        (.dataNotAllowed, "noConnection", true),
        (.timedOut, "timedOut", true),
        (.cancelled, "cancelled", false),
        (.cannotConnectToHost, "transport(cannotConnectToHost)", true),
        (.networkConnectionLost, "transport(connectionLost)", true),
        (.cannotFindHost, "transport(dnsFailure)", true),
        (.dnsLookupFailed, "transport(dnsFailure)", true),
        (.secureConnectionFailed, "transport(secureConnectionFailed)", false),
        (.badServerResponse, "invalidResponse", false),
        (.unsupportedURL, "invalidResponse", false),
        (.cannotParseResponse, "invalidResponse", false),
        (.httpTooManyRedirects, "tooManyRedirects", false),
        (.fileDoesNotExist, "underlying", false),
    ])
    func urlErrorsMapToTypedCases(code: URLError.Code, expected: String, retryable: Bool) {
        let error = NetworkError(mapping: URLError(code))
        #expect(error.caseName == expected)
        #expect(error.isRetryable == retryable)
    }

    /// What libcurl-based URLSession reports, verbatim, when the connection closes before the body
    /// is complete: a body shorter than its `Content-Length`, a chunked body without its last chunk.
    @Test(
        .enabled(if: runsOnCorelibsFoundation, "libcurl's messages, Linux only"),
        arguments: [
            "transfer closed with 500 bytes remaining to read",
            "transfer closed with outstanding read data remaining",
        ])
    func aBodyCutShortIsARetryableConnectionLoss(message: String) {
        let error = NetworkError(mapping: URLError(.unknown, userInfo: [NSLocalizedDescriptionKey: message]))
        #expect(error.caseName == "transport(connectionLost)")
        #expect(error.isRetryable)
    }

    /// What libcurl-based URLSession reports, verbatim, for a response header block it refuses:
    /// 300 KiB in all, or one line over its 100 KiB buffer.
    @Test(
        .enabled(if: runsOnCorelibsFoundation, "libcurl's messages, Linux only"),
        arguments: [
            "Too large response headers: 307233 > 307200",
            "Out of memory",
        ])
    func headersLibcurlRefusesAreResponseHeadersTooLarge(message: String) {
        let error = NetworkError(mapping: URLError(.unknown, userInfo: [NSLocalizedDescriptionKey: message]))
        #expect(error.caseName == "responseHeadersTooLarge")
        #expect(!error.isRetryable)
        #expect("\(error)" == "response headers larger than the transport accepts")
    }

    @Test func otherUnknownURLErrorsStayUnderlying() {
        #expect(NetworkError(mapping: URLError(.unknown)).caseName == "underlying")
        let other = URLError(.unknown, userInfo: [NSLocalizedDescriptionKey: "Failure when receiving data from the peer"])
        #expect(NetworkError(mapping: other).caseName == "underlying")
    }

    @Test func statusRetryability() {
        let retryable = (100...599).filter { NetworkError.httpError(statusCode: $0, data: nil).isRetryable }
        #expect(retryable == [408, 429, 500] + Array(502...599))
    }

    @Test func cancellationErrorMapsToCancelled() {
        #expect(NetworkError(mapping: CancellationError()).caseName == "cancelled")
        #expect(!NetworkError.circuitOpen.isRetryable)
        #expect(!NetworkError.invalidRequest(reason: "x").isRetryable)
    }

    @Test func descriptionsCarryNoBodyOrURL() {
        let error = NetworkError.httpError(statusCode: 401, data: Data("token=secret".utf8))
        #expect(error.description == "HTTP 401 (12 body bytes)")
        #expect(!"\(NetworkError.underlying(URLError(.badURL)))".contains("http"))
    }

    @Test func sessionErrorsReachTheCallerTyped() async {
        for (step, expected) in [
            (ScriptedNetworkSession.Step.urlError(.notConnectedToInternet), "noConnection"),
            (.urlError(.cannotConnectToHost), "transport(cannotConnectToHost)"),
            (.nonHTTPResponse, "invalidResponse"),
        ] {
            let engine = AsyncRequestEngine(session: ScriptedNetworkSession([step]), clock: ManualClock())
            #expect(await networkError { try await engine.send(TestRequest()) }?.caseName == expected)
        }
    }

    @Test(arguments: ["ftp://example.com/file", "file:///etc/passwd", "mailto:someone@example.com", "http:///nohost"])
    func unsupportedURLsAreInvalidRequestsAndNothingIsSent(url: String) async throws {
        let session = ScriptedNetworkSession([.ok()])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let request = TestRequest(url: try #require(URL(string: url)))
        #expect(await networkError { try await engine.send(request) }?.caseName == "invalidRequest")
        #expect(session.callCount == 0)
        #expect(
            recorder.timeline == ["started", "failed(invalid request: URL scheme must be http or https,0)"]
                || recorder.timeline == ["started", "failed(invalid request: URL has no host,0)"])
    }

    @Test(arguments: ["http://127.0.0.1:99999/x", "https://api.example.test:65536/", "http://api.example.test:4294967297/"])
    func portsOutsideTheTCPRangeAreInvalidRequestsAndNothingIsSent(url: String) async throws {
        let session = ScriptedNetworkSession([.ok()])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let request = TestRequest(url: try #require(URL(string: url)))
        #expect(await networkError { try await engine.send(request) }?.caseName == "invalidRequest")
        #expect(session.callCount == 0)
        #expect(recorder.timeline == ["started", "failed(invalid request: URL port must be in 0-65535,0)"])
    }

    @Test func theHighestPortIsValid() throws {
        let request = TestRequest(url: try #require(URL(string: "http://127.0.0.1:65535/x")))
        #expect(try request.makeURLRequest().url?.port == 65535)
    }

    @Test(arguments: [
        ("HTTP://api.example.test/a?b=1#f", "http://api.example.test/a?b=1#f"),
        ("Https://api.example.test:8443/%20x", "https://api.example.test:8443/%20x"),
        ("hTTp://user@api.example.test/", "http://user@api.example.test/"),
        ("http://api.example.test/Path", "http://api.example.test/Path"),
    ])
    func schemesInAnyCaseAreValidAndSentLowerCased(url: String, sent: String) throws {
        let request = TestRequest(url: try #require(URL(string: url)))
        #expect(try request.makeURLRequest().url?.absoluteString == sent)
    }

    @Test func anUpperCaseSchemeReachesTheSessionLowerCased() async throws {
        let session = ScriptedNetworkSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        try await engine.send(TestRequest(url: try #require(URL(string: "HTTPS://api.example.test/upper"))))
        #expect(session.requests.map { $0.url?.absoluteString } == ["https://api.example.test/upper"])
    }

    @Test func headerInjectionIsRejected() async {
        let session = ScriptedNetworkSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let injected = TestRequest(headers: ["X-Note": "a\r\nX-Admin: true"])
        #expect(await networkError { try await engine.send(injected) }?.caseName == "invalidRequest")
        let badName = TestRequest(headers: ["Bad Name": "v"])
        #expect(await networkError { try await engine.send(badName) }?.caseName == "invalidRequest")
        #expect(session.callCount == 0)
    }

    @Test(arguments: [0, -1, Double.nan])
    func nonPositiveTimeoutsAreRejected(timeout: Double) async {
        let session = ScriptedNetworkSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        #expect(await networkError { try await engine.send(TestRequest(timeout: timeout)) }?.caseName == "invalidRequest")
        #expect(session.callCount == 0)
    }

    @Test func idempotencyKeyDetectionIgnoresCaseAndEmptyValues() {
        #expect(TestRequest(method: .post, headers: ["IDEMPOTENCY-KEY": "a"]).hasIdempotencyKey)
        #expect(!TestRequest(method: .post, headers: ["Idempotency-Key": "  "]).hasIdempotencyKey)
        #expect(!TestRequest(method: .post).hasIdempotencyKey)
    }

    @Test func methodIdempotency() {
        #expect(HTTPMethod.allCases.filter(\.isIdempotent) == [.get, .put, .delete, .head, .options])
    }
}

/// Whether Foundation here is swift-corelibs-foundation (libcurl-based URLSession).
let runsOnCorelibsFoundation: Bool = {
    #if canImport(FoundationNetworking)
    true
    #else
    false
    #endif
}()
