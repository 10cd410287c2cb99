import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

/// `AsyncRequestEngine.Configuration`: what an engine runs with, and the spellings before it.
@Suite("Engine configuration")
struct EngineConfigurationTests {
    @Test func outOfRangeValuesAreTakenAtTheNearestValidOne() {
        var configuration = AsyncRequestEngine.Configuration()
        configuration.retry = .init(policy: nil, retryAfter: .honored(atMost: .seconds(-1)), maximumDelay: .seconds(-5))
        configuration.maximumResponseBodySize = -3
        configuration.limits = .init(concurrencyPerHost: 0, waitingPerHost: -1)
        let engine = AsyncRequestEngine(session: ScriptedNetworkSession([]), configuration: configuration, clock: ManualClock())
        #expect(engine.configuration.retry.retryAfter == .honored(atMost: .zero))
        #expect(engine.configuration.retry.maximumDelay == .zero)
        #expect(engine.configuration.maximumResponseBodySize == 0)
        #expect(engine.configuration.limits.concurrencyPerHost == 1)
        #expect(engine.configuration.limits.waitingPerHost == 0)
    }

    @Test func theDefaultRetriesNothingAndSharesReads() {
        let configuration = AsyncRequestEngine.Configuration()
        #expect(configuration.retry.policy == nil)
        #expect(configuration.retry.retryAfter == .honored(atMost: .seconds(60)))
        #expect(configuration.retry.maximumDelay == RetryPolicyDelay.defaultMaximum)
        guard case .none = configuration.circuitBreaker else { Issue.record("a breaker by default"); return }
        #expect(configuration.limits.concurrencyPerHost == nil && configuration.limits.ratePerHost == nil)
        #expect(configuration.deduplicatedMethods == [.get, .head, .options])
        #expect(configuration.deadline == nil && configuration.hedging == nil && configuration.eventSink == nil)
    }

    @Test func thePublishedInitializerPutsItsPolicyAndSinkInTheConfiguration() async throws {
        let session = ScriptedNetworkSession([.status(503), .ok("second")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), eventSink: recorder, clock: ManualClock())
        #expect(engine.configuration.retry.policy != nil)
        #expect(engine.configuration.eventSink != nil)
        let (data, _) = try await engine.send(TestRequest())
        #expect(String(decoding: data, as: UTF8.self) == "second")
        #expect(session.callCount == 2)
    }
}
