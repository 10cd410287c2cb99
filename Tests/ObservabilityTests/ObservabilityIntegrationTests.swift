import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Observability

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

struct LoopbackGet: NetworkRequest {
    var url: URL
    var method: HTTPMethod = .get
    var headers: [String: String] = [:]
    var timeout: TimeInterval = .infinity
}

/// The engine through the real URLSession against a real HTTP server on 127.0.0.1, recording into
/// the collector (through a fan-out, as an app would wire it with a logger).
@Suite("Observability end to end: AsyncRequestEngine → URLSession → LoopbackHTTPServer", .timeLimit(.minutes(2)))
struct ObservabilityIntegrationTests {
    let server: LoopbackHTTPServer
    let session: URLSession

    init() throws {
        server = try LoopbackHTTPServer()
        session = URLSession(configuration: .ephemeral)
    }

    @Test func countsAndStatusCodesMatchWhatTheServerSaw() async throws {
        server.route("/users/*", .ok("{}"))
        server.route("/missing/*", .status(404))
        server.route("/flaky", [.status(503), .status(503), .ok("finally")])
        server.route("/down", .status(500))
        server.route("/catalog", LoopbackResponse.ok("catalog").held())

        let collector = RequestMetricsCollector()
        let logged = LockedBox<[String]>([])
        let deduplications = EventRecorder()
        let sink = FanOutEventSink(collector, LoggingEventSink { line in logged.mutate { $0.append(line) } }, deduplications)
        let clock = ManualClock()
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: ExponentialRetryPolicy(maxRetries: 2, baseDelay: 1.0),
            eventSink: sink,
            clock: clock
        )

        // 12 successes on /users/{id}, with a secret in the query of each.
        for id in 1...12 {
            _ = try await engine.send(LoopbackGet(url: server.url("/users/\(id)?access_token=SECRET\(id)")))
        }
        // 3 not-found responses: not retried.
        for id in 1...3 {
            let error = await #expect(throws: NetworkError.self) {
                try await engine.send(LoopbackGet(url: self.server.url("/missing/\(id)")))
            }
            #expect(error?.statusCode == 404)
        }
        // 503, 503, 200: two retries on the manual clock, then success.
        let flaky = Task { try await engine.send(LoopbackGet(url: server.url("/flaky"))) }
        for _ in 0..<2 {
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(4))
        }
        _ = try await flaky.value
        // 500 three times: retries exhausted, one failure.
        let down = Task { try await engine.send(LoopbackGet(url: server.url("/down"))) }
        for _ in 0..<2 {
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(4))
        }
        _ = await #expect(throws: NetworkError.self) { try await down.value }
        // 20 identical concurrent GETs: one upstream call, 19 deduplicated callers.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<20 {
                group.addTask { _ = try await engine.send(LoopbackGet(url: self.server.url("/catalog"))) }
            }
            await deduplications.waitForDeduplicated(19)
            await server.waitForHits("/catalog", atLeast: 1)
            server.releaseHeld("/catalog")
            try await group.waitForAll()
        }

        let stats = await collector.snapshot()
        #expect(stats.requestsStarted == 12 + 3 + 1 + 1 + 1)
        #expect(stats.requestsSucceeded == 12 + 1 + 1)
        #expect(stats.requestsFailed == 3 + 1)
        #expect(stats.retriesScheduled == 2 + 2)
        #expect(stats.deduplicationsHit == 19)
        #expect(stats.requestsInFlight == 0)

        // The server's hit counts match the collector's attempts per endpoint.
        #expect(server.hits("/users/*") == 12)
        #expect(server.hits("/missing/*") == 3)
        #expect(server.hits("/flaky") == 3)
        #expect(server.hits("/down") == 3)
        #expect(server.hits("/catalog") == 1)
        let users = try #require(stats.endpoint("GET", "/users/{id}"))
        #expect(users.requestsStarted == 12 && users.requestsSucceeded == 12 && users.statusCodes == [200: 12])
        #expect(stats.endpoint("GET", "/missing/{id}")?.statusCodes == [404: 3])
        let flakyStats = try #require(stats.endpoint("GET", "/flaky"))
        #expect(flakyStats.retriesScheduled == 2 && flakyStats.statusCodes == [200: 1])
        #expect((flakyStats.successDuration?.minimum ?? 0) >= 0)
        let downStats = try #require(stats.endpoint("GET", "/down"))
        #expect(downStats.retriesScheduled == 2 && downStats.statusCodes == [500: 1] && downStats.requestsFailed == 1)
        let catalog = try #require(stats.endpoint("GET", "/catalog"))
        #expect(catalog.requestsStarted == 1 && catalog.deduplicationsHit == 19 && catalog.statusCodes == [200: 1])
        #expect(users.successDuration?.count == 12)

        // Nothing secret in the scrape or the log.
        let text = collector.prometheusText()
        #expect(!text.contains("SECRET") && !text.contains("access_token"))
        #expect(text.contains(#"http_client_requests_total{method="GET",endpoint="/users/{id}",status="200",outcome="success"} 12"#))
        #expect(text.contains(#"http_client_retries_total{method="GET",endpoint="/flaky"} 2"#))
        #expect(text.contains(#"http_client_deduplicated_requests_total{method="GET",endpoint="/catalog"} 19"#))
        let log = logged.value
        #expect(log.count == stats.requestsStarted + stats.requestsSucceeded + stats.requestsFailed + stats.retriesScheduled + stats.deduplicationsHit)
        #expect(!log.joined().contains("SECRET"))
    }
}
