import Foundation
import Testing
import Retry
import ResilienceTesting
@testable import RequestEngine
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The URLSession-based sessions the engine can use.
enum SessionKind: String, Sendable, CaseIterable, CustomTestStringConvertible {
    /// A plain `URLSession`: its body is collected by Foundation.
    case plainURLSession

    func make(_ configuration: URLSessionConfiguration = .ephemeral) -> any NetworkSession {
        switch self {
        case .plainURLSession: URLSession(configuration: configuration)
        }
    }

    var testDescription: String { rawValue }
}

/// Bodies cut short and upper-case schemes, end-to-end through the real URLSession to a real HTTP
/// server on 127.0.0.1.
@Suite("URLSession sessions against LoopbackHTTPServer", .timeLimit(.minutes(2)))
struct TransportIntegrationTests {
    let server: LoopbackHTTPServer

    init() throws {
        server = try LoopbackHTTPServer()
    }

    // MARK: Bodies cut short, schemes in upper case

    @Test(arguments: SessionKind.allCases)
    func aBodyShorterThanItsContentLengthIsARetriedConnectionLoss(kind: SessionKind) async throws {
        server.route("/short", [.partialBodyThenClose(body: Data(repeating: 0x78, count: 1000)), .ok("whole")])
        let engine = AsyncRequestEngine(session: kind.make(), retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0))
        let (data, _) = try await engine.send(TestRequest(url: server.url("/short")))
        #expect(String(decoding: data, as: UTF8.self) == "whole")
        #expect(server.hits("/short") == 2)
    }

    @Test(arguments: SessionKind.allCases)
    func aChunkedBodyWithoutItsLastChunkIsAConnectionLoss(kind: SessionKind) async throws {
        server.route("/cut", .raw(Data("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".utf8)))
        let engine = AsyncRequestEngine(session: kind.make())
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/cut"))) }
        #expect(error?.caseName == "transport(connectionLost)")
    }

    @Test(arguments: SessionKind.allCases)
    func anUpperCaseSchemeReachesTheServer(kind: SessionKind) async throws {
        server.route("/upper", .ok("found"))
        let url = try #require(URL(string: "HTTP://127.0.0.1:\(server.port)/upper"))
        let (data, response) = try await AsyncRequestEngine(session: kind.make()).send(TestRequest(url: url))
        #expect(String(decoding: data, as: UTF8.self) == "found")
        #expect(response.statusCode == 200)
        #expect(server.hits("/upper") == 1)
    }
}
