import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Synchronization
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `ResponseHead`: a response's fields as the session received them, carried by the engine
/// (`responseWithHead(for:)`) without a Foundation response unless one is asked for.
@Suite("ResponseHead: fields as received, through the engine", .timeLimit(.minutes(1)))
struct ResponseHeadTests {
    static let url = URL(string: "https://api.example.test/items")!
    static let cookies = [
        ResponseHead.Field(name: "Set-Cookie", value: "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT"),
        ResponseHead.Field(name: "set-cookie", value: "b=2"),
    ]

    @Test func fieldsKeepTheirOrderSpellingAndRepeats() throws {
        let fields = [ResponseHead.Field(name: "content-type", value: "text/plain")] + Self.cookies
        let head = try #require(ResponseHead(url: Self.url, statusCode: 200, fields: fields))
        #expect(head.fields == fields)
        #expect(head.statusCode == 200 && head.url == Self.url)
        #expect(head.value(forHTTPHeaderField: "Content-Type") == "text/plain")
        #expect(head.value(forHTTPHeaderField: "SET-COOKIE") == "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT, b=2")
        #expect(head.value(forHTTPHeaderField: "Set-Cookie2") == nil)
        #expect(head.value(forHTTPHeaderField: "set-cookiE") != nil)
        #expect(head.value(forHTTPHeaderField: "Retry-After") == nil)
    }

    @Test func itsFoundationResponseIsMadeOnceWithRepeatedFieldsJoined() throws {
        let head = try #require(ResponseHead(url: Self.url, statusCode: 201, httpVersion: "HTTP/1.1", fields: Self.cookies))
        let response = head.httpURLResponse
        #expect(head.httpURLResponse === response)
        #expect(response.statusCode == 201 && response.url == Self.url)
        #expect(response.value(forHTTPHeaderField: "Set-Cookie") == "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT, b=2")
        #expect(response.allHeaderFields.count == 1)
    }

    @Test func spellingsOfOneNameAreJoinedAlsoAmongManyFields() throws {
        // Past 32 names the case-insensitive match goes through lower-cased copies.
        for count in [3, 40] {
            let many = (0..<count).map { ResponseHead.Field(name: "X-F\($0)", value: "\($0)") }
            let fields = many + [ResponseHead.Field(name: "x-f1", value: "again"), ResponseHead.Field(name: "X-F2", value: "twice")]
            let head = try #require(ResponseHead(url: Self.url, statusCode: 200, fields: fields))
            let response = head.httpURLResponse
            #expect(response.allHeaderFields.count == count, "\(count)")
            #expect(response.value(forHTTPHeaderField: "X-F1") == "1, again", "\(count)")
            #expect(response.value(forHTTPHeaderField: "X-F2") == "2, twice", "\(count)")
            #expect(response.value(forHTTPHeaderField: "X-F0") == "0", "\(count)")
        }
        // Without two spellings, nothing is looked up twice: distinct names stay as sent.
        #expect(ResponseHead.hasCaseVariants(["A": "", "B": "", "AB": ""].keys) == false)
        #expect(ResponseHead.hasCaseVariants(["Ab": "", "aB": ""].keys))
        #expect(ResponseHead.sameName("X-Tag", "x-tag") && !ResponseHead.sameName("X-Tag", "X-Ta") && !ResponseHead.sameName("a-", "A\r"))
    }

    @Test func aHeadOfAFoundationResponseIsThatResponse() throws {
        let response = try #require(
            HTTPURLResponse(url: Self.url, statusCode: 503, httpVersion: nil, headerFields: ["Retry-After": "5", "X-Id": "7"]))
        let head = ResponseHead(response)
        #expect(head.httpURLResponse === response)
        #expect(head.statusCode == 503)
        #expect(head.value(forHTTPHeaderField: "retry-after") == "5")
        #expect(Set(head.fields) == [.init(name: "Retry-After", value: "5"), .init(name: "X-Id", value: "7")])
    }

    @Test func aStatusOutsideHTTPsRangeMakesNoHead() {
        #expect(ResponseHead(url: Self.url, statusCode: 99, fields: []) == nil)
        #expect(ResponseHead(url: Self.url, statusCode: 1_000, fields: []) == nil)
        #expect(ResponseHead(url: Self.url, statusCode: 999, fields: []) != nil)
    }

    @Test func theEngineHandsTheSessionsHeadThroughAndNeverAsksForFoundations() async throws {
        let session = HeadSession([(200, Self.cookies)])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let (data, head) = try await engine.responseWithHead(for: TestRequest())
        #expect(String(decoding: data, as: UTF8.self) == "body 1")
        #expect(head.fields == Self.cookies)
        #expect(session.foundationCalls == 0)
    }

    @Test func responseForGivesTheHeadsFoundationResponse() async throws {
        let session = HeadSession([(200, Self.cookies)])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let (_, response) = try await engine.response(for: TestRequest())
        #expect(response.value(forHTTPHeaderField: "set-cookie") == "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT, b=2")
        #expect(session.foundationCalls == 0)
    }

    @Test func aRetryAfterAmongTheFieldsTimesTheRetry() async throws {
        let clock = ManualClock()
        let session = HeadSession([(503, [.init(name: "retry-after", value: "5")]), (200, [])])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), clock: clock)
        let call = Task { try await engine.responseWithHead(for: TestRequest()) }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(4_999))
        #expect(session.calls == 1)  // the policy's 0 s is replaced by the server's 5 s
        clock.advance(by: .milliseconds(1))
        let (_, head) = try await call.value
        #expect(head.statusCode == 200)
        #expect(session.calls == 2)
    }

    @Test func aSenderWithoutItsOwnHeadPathWrapsItsResponse() async throws {
        let session = ScriptedNetworkSession([.ok("x", headers: ["ETag": "\"v1\""])])
        let sender: any RequestSending = Wrapper(base: AsyncRequestEngine(session: session, clock: ManualClock()))
        let (_, head) = try await sender.responseWithHead(for: TestRequest())
        #expect(head.value(forHTTPHeaderField: "etag") == "\"v1\"")
    }

    /// A sender with `response(for:)` only: `responseWithHead(for:)` is the protocol's default.
    private struct Wrapper: RequestSending {
        let base: AsyncRequestEngine
        func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
            try await base.response(for: request)
        }
    }

    /// A session answering with heads of its own, one scripted status and fields per call; it
    /// counts calls of `data(for:)`, which the engine must never make.
    private final class HeadSession: NetworkSession {
        private let script: [(Int, [ResponseHead.Field])]
        private let counts = Mutex((calls: 0, foundation: 0))

        init(_ script: [(Int, [ResponseHead.Field])]) {
            self.script = script
        }

        var calls: Int { counts.withLock { $0.calls } }
        var foundationCalls: Int { counts.withLock { $0.foundation } }

        func data(for request: URLRequest) async throws -> (Data, URLResponse) {
            counts.withLock { $0.foundation += 1 }
            throw NetworkError.invalidResponse
        }

        func dataWithHead(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, ResponseHead) {
            let call = counts.withLock { counts in
                counts.calls += 1
                return counts.calls
            }
            let (status, fields) = script[min(call, script.count) - 1]
            guard let head = ResponseHead(url: request.url!, statusCode: status, fields: fields) else { throw NetworkError.invalidResponse }
            return (Data("body \(call)".utf8), head)
        }
    }
}
