import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `Configuration.retry.throttling` on a scripted session with zero backoff: each host's token count,
/// what stops retries and hedges, and the event a sink can count.
@Suite("AsyncRequestEngine: retry throttling per host", .timeLimit(.minutes(1)))
struct RetryThrottlingEngineTests {
    final class ThrottleLog: RetryThrottlingEventSink {
        private let throttled = Locked<[RetryThrottledEvent]>([])
        var events: [RetryThrottledEvent] { throttled.withLock { $0 } }
        func record(_ event: RequestEvent) async {}
        func recordRetryThrottled(_ event: RetryThrottledEvent) async { throttled.withLock { $0.append(event) } }
    }

    static func engine(_ session: ScriptedNetworkSession, sink: ThrottleLog? = nil, hedging: HedgingPolicy? = nil, clock: ManualClock = ManualClock()) throws -> AsyncRequestEngine {
        AsyncRequestEngine(
            session: session,
            configuration: .init(
                retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 20, interval: 0), throttling: try RetryThrottling(maxTokens: 10, tokenRatio: 0.5)), hedging: hedging, eventSink: sink),
            clock: clock)
    }

    @Test func aFailingHostGetsRetriesUntilItsCountFallsToHalfThenNone() async throws {
        let session = ScriptedNetworkSession(Array(repeating: .respond(status: 503), count: 30))
        let log = ThrottleLog()
        let engine = try Self.engine(session, sink: log)
        let (_, response) = try await engine.response(for: TestRequest("/a"))
        #expect(response.statusCode == 503)
        #expect(session.callCount == 5)  // 10 → 5 tokens: the fifth failure leaves half, and no retry
        #expect(log.events.map(\.attempt) == [4])
        #expect(log.events.first?.url.path == "/a")
        // The next request to the host is sent once, and not retried.
        let error = await networkError { try await engine.send(TestRequest("/b")) }
        #expect(error?.caseName == "httpError(503)")
        #expect(session.callCount == 6)
        #expect(log.events.map(\.attempt) == [4, 0])
    }

    @Test func successesGiveTokensBackAndRetriesResume() async throws {
        let session = ScriptedNetworkSession(
            Array(repeating: .respond(status: 503), count: 5) + Array(repeating: .ok(), count: 3) + [.respond(status: 503), .ok()]
        )
        let engine = try Self.engine(session)
        _ = try await engine.response(for: TestRequest("/a"))  // five failures: 5 tokens
        for _ in 0..<3 { _ = try await engine.send(TestRequest("/a")) }  // 5.5, 6.0, 6.5
        let (data, _) = try await engine.send(TestRequest("/a"))  // 503: 5.5 left, above half: retried, 200
        #expect(data.isEmpty)
        #expect(session.callCount == 10)
    }

    @Test func eachHostHasItsOwnCount() async throws {
        let session = ScriptedNetworkSession(Array(repeating: .respond(status: 503), count: 5) + [.respond(status: 503), .ok()])
        let engine = try Self.engine(session)
        _ = try await engine.response(for: TestRequest("/a"))  // api.example.test throttled
        let other = TestRequest(url: URL(string: "https://other.example.test/x")!)
        _ = try await engine.send(other)  // its own count: the 503 is retried
        #expect(session.callCount == 7)
    }

    @Test func clientErrorsAndCancellationsDoNotTakeTokens() async throws {
        let session = ScriptedNetworkSession(Array(repeating: .respond(status: 404), count: 12) + [.respond(status: 503), .ok()])
        let engine = try Self.engine(session)
        for _ in 0..<12 { _ = try await engine.response(for: TestRequest("/missing")) }
        let (data, response) = try await engine.response(for: TestRequest("/a"))
        #expect(response.statusCode == 200 && data.isEmpty)  // the 503 was still retried
    }

    @Test func aThrottledHostGetsNoHedges() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession(Array(repeating: .respond(status: 503), count: 5) + [.hang, .ok()])
        let engine = try Self.engine(session, hedging: HedgingPolicy(delay: .milliseconds(100), maxAttempts: 2), clock: clock)
        // Five POSTs (neither retried nor hedged) fail: the host's count falls to half.
        for _ in 0..<5 { _ = try await engine.response(for: TestRequest("/a", method: .post)) }
        let request = Task { try await engine.response(for: TestRequest("/a", timeout: 1)) }
        await session.waitForCalls(6)
        await clock.waitForSleepers(2)  // the hedge delay and the attempt's timeout
        clock.advance(by: .milliseconds(100))  // the hedge is due, and refused
        clock.advance(by: .seconds(1))  // the attempt times out
        let error = await networkError { _ = try await request.value }
        #expect(error?.caseName == "timedOut")
        #expect(session.callCount == 6)  // no hedge, no retry
    }

    @Test func withoutThrottlingNothingChanges() async throws {
        let session = ScriptedNetworkSession(Array(repeating: .respond(status: 503), count: 8) + [.ok()])
        let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 20, interval: 0), clock: ManualClock())
        _ = try await engine.send(TestRequest("/a"))
        #expect(session.callCount == 9)
    }
}
