import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The strategies beyond retry, end-to-end through the real URLSession (`URLSessionTransport`) to
/// a real HTTP server on 127.0.0.1. Time runs on a ManualClock where a rule depends on it (the
/// deadline, the hedging delay, injected latency); requests have no timeout of their own there, so
/// the clock's only sleepers are the ones under test. "The server saw the connection close" is how
/// a test knows a transfer really stopped.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("Deadline, hedging, limits, per-host breakers and fault injection through URLSession", .timeLimit(.minutes(5)))
struct StrategiesIntegrationTests {
    let server: LoopbackHTTPServer
    let transport: URLSessionTransport

    init() throws {
        server = try LoopbackHTTPServer()
        transport = URLSessionTransport(configuration: .ephemeral)
    }

    /// Issue 48, item 4, end to end: an engine configured with the most extreme values its
    /// throwing initializers accept — adaptive limits of `Int.max` with an endless line, a fixed
    /// limit and line of `Int.max`, a retry budget of the largest `Double` — sends concurrent
    /// requests and retries over the real transport without trapping. In a child process, so that
    /// a trap fails this test instead of the whole run.
    @Test func anEngineWithTheMostExtremeAcceptedSettingsServesRequests() async throws {
        #if os(Linux) || os(macOS)
        server.route("/ok", .ok("fine"))
        server.route("/flaky", [.status(503), .ok("fine")])
        let base = server.url("/").absoluteString
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [base = base as String] in
                let adaptive = try AdaptiveConcurrencyLimiter.Configuration(
                    algorithm: .gradient(), minLimit: .max, maxLimit: .max, maxWaiting: .max, maxWaitingPerLimit: .infinity,
                    initialLimit: .max, interactiveShare: 1
                )
                let huge = Double.greatestFiniteMagnitude
                let engine = AsyncRequestEngine(
                    session: URLSessionTransport(configuration: .ephemeral),
                    configuration: .init(
                        retry: .init(
                            policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 0.001),
                            budget: RetryBudget(retryRatio: huge, minRetriesPerSecond: huge, maxBalance: huge)
                        ),
                        limits: .init(concurrencyPerHost: .max, waitingPerHost: .max, adaptiveConcurrencyPerHost: adaptive)
                    )
                )
                let url = try #require(URL(string: base))
                let bodies = try await withThrowingTaskGroup(of: String.self) { group in
                    for index in 0..<32 {
                        group.addTask {
                            let path = index == 0 ? "flaky" : "ok"
                            return String(decoding: try await engine.send(TestRequest(url: url.appendingPathComponent(path), timeout: 10)).0, as: UTF8.self)
                        }
                    }
                    return try await group.reduce(into: [String]()) { $0.append($1) }
                }
                #expect(bodies.count == 32 && bodies.allSatisfy { $0 == "fine" })
            }
        }
        #endif
    }

    @Test func theDeadlineCancelsTheTransferInFlight() async throws {
        server.route("/held", LoopbackResponse.ok("late").held())
        let clock = ManualClock()
        let engine = AsyncRequestEngine(session: transport, configuration: .init(deadline: .seconds(2)), clock: clock)
        let url = server.url("/held")
        let task = Task { await networkError { try await engine.send(TestRequest(url: url)) } }
        await server.waitForHits("/held", atLeast: 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(2))
        #expect(await task.value?.caseName == "deadlineExceeded")
        await server.waitForOpenConnections(atMost: 0)  // the transfer was cancelled
        #expect(server.heldCount("/held") == 0)
    }

    @Test func aHedgeOvertakesASlowResponseAndTheLoserIsCancelled() async throws {
        server.route("/tail", [LoopbackResponse.ok("slow").held(), .ok("fast")])
        let clock = ManualClock()
        let recorder = HedgeRecorder()
        let engine = AsyncRequestEngine(session: transport, configuration: .init(hedging: HedgingPolicy(delay: .milliseconds(50), maxAttempts: 2), eventSink: recorder), clock: clock)
        let url = server.url("/tail")
        let task = Task { try await engine.send(TestRequest(url: url)) }
        await server.waitForHits("/tail", atLeast: 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(50))
        let (data, response) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "fast")
        #expect(response.statusCode == 200)
        #expect(server.hits("/tail") == 2)
        #expect(recorder.hedges.count == 1)
        // The slow copy's connection closes; the winner's may stay open for reuse.
        await server.waitForOpenConnections(atMost: 1)
        #expect(server.heldCount("/tail") == 0)
    }

    @Test func theHostsLimitKeepsAttemptsOffTheWireAndAFullLineIsLimited() async throws {
        server.route("/held/*", LoopbackResponse.ok("done").held())
        let engine = AsyncRequestEngine(session: transport, configuration: .init(limits: .init(concurrencyPerHost: 1, waitingPerHost: 0)))
        let first = Task { try await engine.send(TestRequest(url: server.url("/held/1"), method: .post)) }
        await server.waitForHits("/held/*", atLeast: 1)  // the first holds the host's only place
        let refused = await networkError { try await engine.send(TestRequest(url: server.url("/held/2"), method: .post)) }
        guard case .limited = refused else {
            Issue.record("expected limited, got \(String(describing: refused))")
            return
        }
        #expect(server.totalHits == 1)  // refused without reaching the server
        server.releaseHeld("/held/*")
        _ = try await first.value
        let third = Task { try await engine.send(TestRequest(url: server.url("/held/3"), method: .post)) }
        await server.waitForHits("/held/*", atLeast: 2)  // the place is free again
        server.releaseHeld("/held/*")
        _ = try await third.value
    }

    @Test func theHostsRateLimitRefusesWithoutReachingTheServer() async throws {
        server.route("/rated", .ok("ok"))
        let clock = ManualClock()
        let engine = AsyncRequestEngine(session: transport, configuration: .init(limits: .init(ratePerHost: HostRateLimit(permitsPerSecond: 1, burst: 2))), clock: clock)
        let url = server.url("/rated")
        for _ in 0..<2 { _ = try await engine.send(TestRequest(url: url)) }  // the burst
        let refused = await networkError { try await engine.send(TestRequest(url: url)) }
        #expect(refused?.caseName == "limited")
        #expect(server.hits("/rated") == 2)
        clock.advance(by: .seconds(1))
        _ = try await engine.send(TestRequest(url: url))
        #expect(server.hits("/rated") == 3)
    }

    @Test func eachHostHasItsOwnBreaker() async throws {
        let other = try LoopbackHTTPServer()
        defer { other.shutdown() }
        server.route("/down", .status(503))
        other.route("/up", .ok("up"))
        let registry = CircuitBreakerRegistry(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5))
        let engine = AsyncRequestEngine(session: transport, configuration: .init(circuitBreaker: .perHost(registry)))
        let down = server.url("/down")
        for _ in 0..<2 { _ = await networkError { try await engine.send(TestRequest(url: down)) } }
        #expect(await networkError { try await engine.send(TestRequest(url: down)) }?.caseName == "circuitOpen")
        #expect(server.hits("/down") == 2)  // the third was refused without a call
        let (data, _) = try await engine.send(TestRequest(url: other.url("/up")))
        #expect(String(decoding: data, as: UTF8.self) == "up")
        let authority = try #require(CircuitBreakerRegistry.authority(of: down))
        #expect(registry.states[authority] == .open)
    }

    @Test func injectedFaultsStandInForTheServerUntilSwitchedOff() async throws {
        server.route("/real", .ok("real"))
        let faults = FaultInjectingSession(wrapping: transport, faults: [.status(503, rate: 1)], seed: 7)
        let engine = AsyncRequestEngine(session: faults)
        let url = server.url("/real")
        #expect(await networkError { try await engine.send(TestRequest(url: url)) }?.caseName == "httpError(503)")
        #expect(server.hits("/real") == 0)
        faults.isEnabled = false
        let (data, _) = try await engine.send(TestRequest(url: url))
        #expect(String(decoding: data, as: UTF8.self) == "real")
        #expect(server.hits("/real") == 1)
    }

    @Test func injectedLatencyRunsOnTheClockBeforeTheRealCall() async throws {
        server.route("/real", .ok("real"))
        let clock = ManualClock()
        let faults = FaultInjectingSession(wrapping: transport, faults: [.latency(.seconds(3), rate: 1)], seed: 7, clock: clock)
        let engine = AsyncRequestEngine(session: faults, clock: clock)
        let url = server.url("/real")
        let task = Task { try await engine.send(TestRequest(url: url)) }
        await clock.waitForSleepers(1)
        #expect(server.hits("/real") == 0)
        clock.advance(by: .seconds(3))
        let (data, _) = try await task.value
        #expect(String(decoding: data, as: UTF8.self) == "real")
    }
}
