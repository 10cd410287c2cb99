import Foundation
import Observability
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Per-host metrics: adaptive limits (gauges) and throttled retries (a counter), in the
/// Prometheus text, through a collector alone or behind a fan-out sink.
@Suite("RequestMetricsCollector: adaptive limits and throttled retries per host", .timeLimit(.minutes(1)))
struct HostLimitMetricsTests {
    static func engine(_ session: ScriptedNetworkSession, sink: any RequestEventSink) throws -> AsyncRequestEngine {
        AsyncRequestEngine(
            session: session,
            configuration: .init(
                retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 10, interval: 0), throttling: try RetryThrottling(maxTokens: 4, tokenRatio: 1)),
                limits: .init(adaptiveConcurrencyPerHost: try .init(algorithm: .aimd(backoff: 0.5), minLimit: 1, maxLimit: 100, maxWaiting: 10, initialLimit: 16)), eventSink: sink),
            clock: ManualClock())
    }

    @Test func theScrapeShowsEachHostsLimitAndItsThrottledRetries() async throws {
        let metrics = RequestMetricsCollector()
        let session = ScriptedNetworkSession(Array(repeating: .status(503), count: 10))
        let engine = try Self.engine(session, sink: metrics)
        metrics.exportAdaptiveLimits(of: engine)
        metrics.exportAdaptiveLimits(of: engine)  // once is enough
        #expect(!metrics.prometheusText().contains("http_client_host_"))  // no host seen yet
        _ = try await engine.response(for: TestRequest("/a?token=secret"))  // 4 → 2 tokens: two attempts, then throttled
        #expect(session.callCount == 2)
        #expect(metrics.throttledRetriesByHost == ["api.example.test": 1])
        let text = metrics.prometheusText()
        #expect(text.contains("# TYPE http_client_retries_throttled_total counter\nhttp_client_retries_throttled_total{host=\"api.example.test\"} 1\n"))
        #expect(text.contains("# TYPE http_client_host_concurrency_limit gauge\nhttp_client_host_concurrency_limit{host=\"api.example.test\"} 4\n"))  // 16, halved by each 503
        #expect(text.contains("http_client_host_in_flight{host=\"api.example.test\"} 0\n"))
        #expect(text.contains("http_client_host_waiting{host=\"api.example.test\"} 0\n"))
        #expect(!text.contains("secret"))
    }

    @Test func twoEnginesOnOneHostShowTheirSumsAndAGoneEngineIsForgotten() async throws {
        let metrics = RequestMetricsCollector()
        let first = try Self.engine(ScriptedNetworkSession([.ok()]), sink: metrics)
        var second: AsyncRequestEngine? = try Self.engine(ScriptedNetworkSession([.ok()]), sink: metrics)
        metrics.exportAdaptiveLimits(of: first)
        metrics.exportAdaptiveLimits(of: second!)
        _ = try await first.send(TestRequest("/a"))
        _ = try await second!.send(TestRequest("/a"))
        let text = metrics.prometheusText()
        #expect(text.components(separatedBy: "http_client_host_concurrency_limit{").count == 2)  // one series
        #expect(text.contains("http_client_host_concurrency_limit{host=\"api.example.test\"} 32\n"))
        weak let gone = second
        second = nil
        #expect(gone == nil)  // the collector did not keep it
        #expect(metrics.prometheusText().contains("http_client_host_concurrency_limit{host=\"api.example.test\"} 16\n"))
    }

    @Test func resetForgetsThrottledRetries() async throws {
        let metrics = RequestMetricsCollector()
        let engine = try Self.engine(ScriptedNetworkSession(Array(repeating: .status(503), count: 4)), sink: metrics)
        _ = try await engine.response(for: TestRequest("/a"))
        #expect(metrics.throttledRetriesByHost == ["api.example.test": 1])
        await metrics.reset()
        #expect(metrics.throttledRetriesByHost.isEmpty)
        #expect(!metrics.prometheusText().contains("http_client_retries_throttled_total"))
    }

    @Test func aFanOutSinkPassesThrottledRetriesOn() async throws {
        let metrics = RequestMetricsCollector()
        let session = ScriptedNetworkSession(Array(repeating: .status(503), count: 10))
        let engine = try Self.engine(session, sink: FanOutEventSink(metrics, ClosureEventSink { _ in }))
        _ = try await engine.response(for: TestRequest("/a"))
        #expect(metrics.throttledRetriesByHost == ["api.example.test": 1])
    }
}
