import Auth
import Foundation
import Observability
import Reachability
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `CachedRequestEngine` is a `RequestSending` over any `RequestSending`: the token is injected
/// below it, the metrics sink sees only what reaches the network, and a cache hit costs neither.
@Suite("CachedRequestEngine over AuthenticatedRequestEngine and a metrics sink", .timeLimit(.minutes(1)))
struct CompositionTests {
    struct FixedToken: TokenProvider {
        func currentToken() async -> String? { "t-1" }
        func refreshToken() async throws -> String { "t-2" }
    }

    @Test func aCachedReadThroughTheAuthenticatedEngineIsSentOnceWithItsTokenAndCountedOnce() async throws {
        let directory = TemporaryDirectory()
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.ok("the feed", headers: ["Cache-Control": "max-age=60"])])
        let metrics = RequestMetricsCollector()
        let authenticated = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session, eventSink: metrics, clock: clock),
            coordinator: TokenRefreshCoordinator(provider: FixedToken())
        )
        let engine = CachedRequestEngine(
            requestEngine: authenticated,
            cache: try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            configuration: .init(partition: "user-42", defaultStaleTime: .seconds(30)),
            clock: clock
        )
        let first = try await engine.response(for: Read("/feed"), mode: .online, staleTime: .seconds(30))
        let second = try await engine.response(for: Read("/feed"), mode: .online, staleTime: .seconds(30))
        let (data, response) = try await engine.send(Read("/feed"))  // as a RequestSending (default mode .online)
        #expect(first.source == .network && second.source == .cache)
        #expect(String(decoding: data, as: UTF8.self) == "the feed" && response.statusCode == 200)
        #expect(session.requests.map { $0.value(forHTTPHeaderField: "Authorization") } == ["Bearer t-1"])
        let snapshot = await metrics.snapshot()
        #expect(snapshot.requestsStarted == 1 && snapshot.requestsSucceeded == 1)
        // The token reached the network, never the disk.
        await engine.cache.waitForWrites()
        for name in try FileManager.default.contentsOfDirectory(atPath: directory.url.path) {
            let bytes = try Data(contentsOf: directory.url.appendingPathComponent(name))
            #expect(bytes.range(of: Data("t-1".utf8)) == nil, "\(name) holds the token")
        }
    }

    /// The token is added below the cache, so the cache learns of it from the sender
    /// (`credentialHeaders(for:)`): without a partition an authenticated read is never stored,
    /// and the next user of the app cannot be answered with it.
    @Test func aCacheOverTheAuthenticatedEngineWithoutAPartitionStoresNothing() async throws {
        let directory = TemporaryDirectory()
        let session = ScriptedNetworkSession([.ok("alice's feed", headers: ["Cache-Control": "max-age=60"]), .ok("bob's feed")])
        let engine = CachedRequestEngine(
            requestEngine: AuthenticatedRequestEngine(
                requestEngine: AsyncRequestEngine(session: session),
                coordinator: TokenRefreshCoordinator(provider: FixedToken())
            ),
            cache: try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true)
        )
        #expect(engine.credentialHeaders(for: URL(fileURLWithPath: "/feed")).keys.contains("Authorization"))
        let first = try await engine.response(for: Read("/feed"), mode: .online, staleTime: .seconds(30))
        let second = try await engine.response(for: Read("/feed"), mode: .online, staleTime: .seconds(30))
        #expect(first.source == .network && second.source == .network)
        #expect(String(decoding: second.data, as: UTF8.self) == "bob's feed")
        #expect(engine.cache.count == 0)
    }
}

/// `CachedRequestEngine.Configuration`, and the separate arguments it replaced.
@Suite("CachedRequestEngine configuration")
struct CachedEngineConfigurationTests {
    @Test func theDefaultIsOnlineHTTPFreshnessAndNoPartition() throws {
        let directory = TemporaryDirectory()
        let engine = CachedRequestEngine(
            cache: try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true)
        )
        #expect(engine.configuration.partition == nil)
        #expect(engine.configuration.defaultMode == .online)
        #expect(engine.configuration.defaultStaleTime == .http)
    }
}
