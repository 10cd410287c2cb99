import Foundation
import RequestEngine
import ResilienceTesting
import Testing

@testable import Auth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("AuthenticatedRequestEngine: the request's body limit")
struct AuthenticatedRequestBodyLimitTests {
    /// A request that accepts bodies of at most `limit` bytes.
    struct LimitedRequest: NetworkRequest {
        let url = URL(string: "https://api.example.test/report")!
        let method = HTTPMethod.get
        let timeout: TimeInterval = .infinity
        let maximumResponseBodySize: Int?
    }

    @Test func theRequestsOwnLimitSurvivesTheTokenInjection() async throws {
        let session = ScriptedNetworkSession([.respond(status: 200, body: Data(count: 100))])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: 1_000)),
            coordinator: TokenRefreshCoordinator(provider: TestTokenProvider(current: "t1"))
        )
        do {
            try await engine.send(LimitedRequest(maximumResponseBodySize: 10))
            Issue.record("a 100-byte body passed a 10-byte limit")
        } catch let error as NetworkError {
            #expect("\(error)" == "response body larger than 10 bytes (HTTP 200)")
        }
        #expect(try await engine.send(LimitedRequest(maximumResponseBodySize: nil)).0.count == 100)  // the engine's 1 000
        #expect(session.requests.map { $0.value(forHTTPHeaderField: "Authorization") } == ["Bearer t1", "Bearer t1"])
    }

    struct DeadlinedRequest: NetworkRequest {
        let url = URL(string: "https://api.example.test/report")!
        let method = HTTPMethod.get
        let deadline: Duration?
    }

    @Test func theRequestsOwnDeadlineSurvivesTheTokenInjection() async throws {
        let session = ScriptedNetworkSession([.ok("report")])
        let engine = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session),
            coordinator: TokenRefreshCoordinator(provider: TestTokenProvider(current: "t1"))
        )
        do {
            try await engine.send(DeadlinedRequest(deadline: .zero))  // already passed: nothing is sent
            Issue.record("a request past its deadline was sent")
        } catch let error as NetworkError {
            #expect("\(error)" == "total deadline exceeded")
        }
        #expect(session.callCount == 0)
        _ = try await engine.send(DeadlinedRequest(deadline: nil))
        #expect(session.callCount == 1)
    }
}
