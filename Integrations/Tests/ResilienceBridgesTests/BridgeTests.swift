import Auth
import Foundation
import InMemoryLogging
import InMemoryTracing
import IntegrationTestSupport
import Logging
import MetricsTestKit
import Observability
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceLogging
import ResilienceMetrics
import ResilienceTesting
import ResilienceTracing
import Retry
import Testing
import Tracing

/// The swift-log, swift-metrics and swift-distributed-tracing bridges, fed by the engine over real
/// AsyncHTTPClient against LoopbackHTTPServer.
@Suite("Logging, metrics and tracing bridges", .timeLimit(.minutes(2)))
struct BridgeTests {
    let server: LoopbackHTTPServer
    let session = AsyncHTTPClientSession()

    init() throws {
        server = try LoopbackHTTPServer()
    }

    // MARK: Metrics

    /// Mixed traffic through one engine whose events go to both the collector and the bridge: every
    /// counter series and the duration histogram's count and sum agree.
    @Test func theMetricsBridgeRecordsWhatTheCollectorCountsForTheSameTraffic() async throws {
        let metrics = TestMetrics()
        let collector = RequestMetricsCollector()
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0),
            eventSink: FanOutEventSink(collector, SwiftMetricsEventSink(factory: metrics), recorder)
        )
        server.route("/users/*", .ok("user"))
        server.route("/missing", .status(404))
        server.route("/flaky", [.status(503), .ok("later")])
        server.route("/down", .status(503))
        server.route("/orders", .status(201))
        server.route("/feed", LoopbackResponse.ok("feed").held())
        for id in [1, 2, 3, 42] { _ = try await engine.send(TestRequest(url: server.url("/users/\(id)"))) }
        _ = await networkError { try await engine.send(TestRequest(url: server.url("/missing"))) }
        _ = try await engine.send(TestRequest(url: server.url("/flaky")))
        _ = await networkError { try await engine.send(TestRequest(url: server.url("/down"))) }
        _ = try await engine.send(TestRequest(url: server.url("/orders"), method: .post))
        let refusing = try RefusingPort()
        _ = await networkError { try await engine.send(TestRequest(url: URL(string: "http://127.0.0.1:\(refusing.port)/users/7")!)) }
        let recorderURL = server.url("/feed")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<5 { group.addTask { _ = try await engine.send(TestRequest(url: recorderURL)) } }
            await server.waitForHits("/feed", atLeast: 1)
            await recorder.waitForDeduplicated(4)
            server.releaseHeld("/feed")
            try await group.waitForAll()
        }

        let expected = Self.series(collector.prometheusText())
        var recorded: [String: Double] = [:]
        for counter in metrics.counters {
            recorded[Self.key(counter.label, counter.dimensions)] = Double(counter.totalValue)
        }
        for timer in metrics.timers {
            recorded[Self.key(timer.label + "_count", timer.dimensions)] = Double(timer.values.count)
            recorded[Self.key(timer.label + "_sum", timer.dimensions)] = Double(timer.values.reduce(0, +)) / 1e9
        }
        let counted = expected.filter { !$0.key.contains("_bucket") && $0.value != 0 }
        #expect(Set(counted.keys) == Set(recorded.keys.filter { recorded[$0] != 0 }))
        for (key, value) in counted {
            let bridged = try #require(recorded[key], "missing \(key)")
            if key.contains("_sum") {
                #expect(abs(bridged - value) < 1e-6 * max(1, value), "\(key): \(bridged) vs \(value)")
            } else {
                #expect(bridged == value, "\(key)")
            }
        }
        // The traffic exercised what it was meant to.
        #expect(expected["http_client_retries_total{endpoint=\"/flaky\",method=\"GET\"}"] == 1)
        #expect(expected["http_client_requests_total{endpoint=\"/users/{id}\",method=\"GET\",outcome=\"failure\",status=\"cannot_connect\"}"] == 1)
        #expect(expected["http_client_requests_total{endpoint=\"/users/{id}\",method=\"GET\",outcome=\"success\",status=\"200\"}"] == 4)
    }

    /// Per-host metrics: throttled retries (counter) and adaptive limits (gauges), the same in the
    /// bridge as in the collector's text, over real AHC to the loopback server.
    @Test func theMetricsBridgeRecordsThrottledRetriesAndAdaptiveLimitsPerHostAsTheCollectorDoes() async throws {
        let metrics = TestMetrics()
        let collector = RequestMetricsCollector()
        let bridge = SwiftMetricsEventSink(factory: metrics)
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(
                retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0), throttling: try RetryThrottling(maxTokens: 4, tokenRatio: 1)),
                limits: .init(adaptiveConcurrencyPerHost: try .init(algorithm: .aimd(backoff: 0.5), minLimit: 1, maxLimit: 100, maxWaiting: 10, initialLimit: 16)),
                eventSink: FanOutEventSink(collector, bridge)))
        collector.exportAdaptiveLimits(of: engine)
        server.route("/down", .status(503))
        _ = await networkError { try await engine.send(TestRequest(url: server.url("/down"))) }
        #expect(server.hits("/down") == 2)  // 4 → 3 → 2 tokens: one retry, then throttled
        bridge.recordAdaptiveLimits(of: engine)
        let host = "127.0.0.1:\(server.port)"
        let expected = Self.series(collector.prometheusText())
        let throttledKey = "http_client_retries_throttled_total{host=\"\(host)\"}"
        #expect(expected[throttledKey] == 1)
        let counter = try metrics.expectCounter("http_client_retries_throttled_total", [("host", host)])
        #expect(Double(counter.totalValue) == expected[throttledKey])
        for name in ["http_client_host_concurrency_limit", "http_client_host_in_flight", "http_client_host_waiting"] {
            let gauge = try metrics.expectRecorder(name, [("host", host)])
            let key = "\(name){host=\"\(host)\"}"
            #expect(gauge.lastValue == expected[key], "\(key)")
        }
        #expect(expected["http_client_host_concurrency_limit{host=\"\(host)\"}"] == 4)  // 16, halved by each 503
    }

    @Test func theMetricsBridgeCapsEndpointsAsTheCollectorDoes() async throws {
        let metrics = TestMetrics()
        let sink = SwiftMetricsEventSink(factory: metrics, configuration: .init(maximumEndpoints: 1))
        let engine = AsyncRequestEngine(session: session, eventSink: sink)
        server.route("/a", .ok())
        server.route("/b", .ok())
        _ = try await engine.send(TestRequest(url: server.url("/a")))
        _ = try await engine.send(TestRequest(url: server.url("/b")))
        let endpoints = Set(
            metrics.counters(label: "http_client_requests_started_total").compactMap { counter in
                counter.dimensions.first { $0.0 == "endpoint" }?.1
            })
        #expect(endpoints == ["/a", "__other__"])
    }

    /// "name{k="v",…}" → value for each sample line of a Prometheus text, labels sorted by name.
    static func series(_ text: String) -> [String: Double] {
        var result: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            let sample = line[..<space]
            guard let open = sample.firstIndex(of: "{") else {
                result[String(sample)] = value
                continue
            }
            let name = String(sample[..<open])
            let body = sample[sample.index(after: open)..<sample.index(before: sample.endIndex)]
            let labels = body.split(separator: ",").map { pair -> (String, String) in
                let parts = pair.split(separator: "=", maxSplits: 1)
                return (String(parts[0]), String(parts[1].dropFirst().dropLast()))
            }
            result[key(name, labels)] = value
        }
        return result
    }

    static func key(_ name: String, _ labels: [(String, String)]) -> String {
        name + "{" + labels.sorted { $0.0 < $1.0 }.map { "\($0.0)=\"\($0.1)\"" }.joined(separator: ",") + "}"
    }

    // MARK: Operations

    /// A request with an `operationID` (a generated OpenAPI client's) is counted, logged and
    /// traced under its operation; the same path without one keeps its template.
    @Test func aRequestsOperationNamesItsEndpointInEveryBridge() async throws {
        let metrics = TestMetrics()
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "test", factory: { _ in handler })
        logger.logLevel = .trace
        let tracer = W3CTestTracer()
        server.route("/v1/notes/*", .ok("note"))
        let engine = AsyncRequestEngine(
            session: session, eventSink: FanOutEventSink(SwiftMetricsEventSink(factory: metrics), SwiftLogEventSink(logger: logger)))
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        _ = try await client.send(PreparedRequest(url: server.url("/v1/notes/7"), operationID: "getNote"))
        _ = try await client.send(TestRequest(url: server.url("/v1/notes/8")))
        let started = metrics.counters(label: "http_client_requests_started_total").map { counter in
            counter.dimensions.first { $0.0 == "endpoint" }?.1 ?? "-"
        }
        #expect(started.sorted() == ["/v1/notes/{id}", "getNote"])
        let endpoints = handler.entries.filter { $0.message.description == "request started" }.compactMap { $0.metadata["http.endpoint"]?.description }
        #expect(endpoints == ["getNote", "/v1/notes/{id}"])
        let spans = tracer.finishedSpans
        #expect(spans.compactMap { $0.attributes.get("resilience.operation") } == [.string("getNote")])
    }

    // MARK: Logging

    @Test func theLoggingBridgeLogsEachEventWithItsMetadata() async throws {
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "test", factory: { _ in handler })
        logger.logLevel = .trace
        server.route("/users/*", [.status(503), .ok("user")])
        let engine = AsyncRequestEngine(
            session: session,
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0),
            eventSink: SwiftLogEventSink(logger: logger)
        )
        _ = try await engine.send(TestRequest(url: server.url("/users/42")))
        let entries = handler.entries
        #expect(entries.map(\.message.description) == ["request started", "retry scheduled", "request succeeded"])
        let traceIDs = Set(entries.compactMap { $0.metadata["trace_id"]?.description })
        #expect(traceIDs.count == 1)
        for entry in entries {
            #expect(entry.metadata["http.method"] == "GET")
            #expect(entry.metadata["http.endpoint"] == "/users/{id}")
        }
        #expect(entries[0].metadata["server.address"] == "127.0.0.1")
        #expect(entries[0].level == .trace)
        #expect(entries[1].metadata["attempt"] == "0")
        #expect(entries[1].level == .info)
        let succeeded = entries[2]
        #expect(succeeded.level == .debug)
        #expect(succeeded.metadata["http.status"] == "200")
        #expect(succeeded.metadata["attempt"] == "1")
        #expect(succeeded.metadata["duration_seconds"].map { Double($0.description) != nil } == true)
    }

    @Test func aFailureIsLoggedWithItsReasonAndAttempt() async throws {
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "test", factory: { _ in handler })
        logger.logLevel = .info
        let refusing = try RefusingPort()
        let engine = AsyncRequestEngine(session: session, eventSink: SwiftLogEventSink(logger: logger))
        _ = await networkError { try await engine.send(TestRequest(url: URL(string: "http://127.0.0.1:\(refusing.port)/x")!)) }
        let failed = try #require(handler.entries.last)
        #expect(handler.entries.count == 1)  // started (trace) is below the logger's level
        #expect(failed.message == "request failed")
        #expect(failed.metadata["http.status"] == "cannot_connect")
        #expect(failed.metadata["attempt"] == "0")
        #expect(failed.metadata["error"] == "transport failure: cannotConnectToHost")
    }

    // MARK: Tracing

    @Test func aLogicalRequestSpanHasAChildSpanPerAttemptAndEachAttemptSendsItsTraceparent() async throws {
        let tracer = W3CTestTracer()
        server.route("/users/*", [.status(503), .ok("user")])
        let engine = AsyncRequestEngine(
            session: TracingNetworkSession(wrapping: session, tracer: tracer),
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0.25),
            eventSink: TracingEventSink(),
            clock: ImmediateClock()
        )
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        _ = try await client.send(TestRequest(url: server.url("/users/42")))

        let spans = tracer.finishedSpans
        #expect(spans.count == 3)
        let logical = try #require(spans.first { $0.parentSpanID == nil })
        let attempts = spans.filter { $0.parentSpanID == logical.spanID }
        #expect(attempts.count == 2)
        #expect(logical.operationName == "GET /users/{id}")
        #expect(logical.attributes.get("http.response.status_code") == .int64(200))
        #expect(logical.attributes.get("resilience.attempts") == .int64(2))
        let retry = try #require(logical.events.first { $0.name == "retry_scheduled" })
        #expect(retry.attributes.get("attempt") == .int64(0))
        #expect(retry.attributes.get("delay_seconds") == .double(0.25))
        #expect(attempts.map { $0.attributes.get("http.response.status_code") } == [.int64(503), .int64(200)])
        #expect(attempts[0].status?.code == .error)
        #expect(attempts[1].attributes.get("http.request.resend_count") == .int64(1))
        #expect(Set(spans.map(\.traceID)) == [logical.traceID])
        // What the server received: each attempt's own span, in the caller's trace.
        let sent = server.requestLog.compactMap { $0.header("traceparent") }
        #expect(sent == attempts.map { "00-\($0.traceID)-\($0.spanID)-01" })
    }

    @Test func aCallerThatJoinedAnInFlightRequestHasItsDeduplicationOnItsSpan() async throws {
        let tracer = W3CTestTracer()
        server.route("/feed", LoopbackResponse.ok("feed").held())
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: TracingNetworkSession(wrapping: session, tracer: tracer),
            eventSink: FanOutEventSink(TracingEventSink(), recorder)
        )
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        let url = server.url("/feed")
        let first = Task { try await client.send(TestRequest(url: url)) }
        await server.waitForHits("/feed", atLeast: 1)
        let second = Task { try await client.send(TestRequest(url: url)) }
        await recorder.waitForDeduplicated(1)
        server.releaseHeld("/feed")
        _ = try await first.value
        _ = try await second.value

        let spans = tracer.finishedSpans
        let logicals = spans.filter { $0.parentSpanID == nil }
        #expect(logicals.count == 2)
        let joined = try #require(logicals.first { $0.attributes["resilience.deduplicated"] != nil })
        #expect(joined.attributes.get("resilience.deduplicated") == .bool(true))
        #expect(joined.events.map(\.name) == ["deduplicated"])
        #expect(joined.attributes.get("resilience.attempts") == .int64(0))
        let leader = try #require(logicals.first { $0.spanID != joined.spanID })
        #expect(spans.filter { $0.parentSpanID == leader.spanID }.count == 1)  // the one network call
        #expect(server.hits("/feed") == 1)
    }

    @Test func anAttemptAfterATimeoutStaysInTheLogicalRequestsTrace() async throws {
        let tracer = W3CTestTracer()
        server.route("/slow", [LoopbackResponse.ok("late").held(), .ok("in time")])
        let clock = ManualClock()
        let engine = AsyncRequestEngine(
            session: TracingNetworkSession(wrapping: session, tracer: tracer),
            configuration: .init(
                retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0)),
                // A host limit keeps the engine's own timer (and its successor task after a timeout),
                // which is what this test follows; a request that shares nothing over AHC is timed by AHC.
                limits: .init(concurrencyPerHost: 8),
                eventSink: TracingEventSink()
            ),
            clock: clock
        )
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        let url = server.url("/slow")
        let task = Task { try await client.send(TestRequest(url: url, timeout: 5)) }
        await server.waitForHits("/slow", atLeast: 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(5))
        _ = try await task.value
        // The timed-out attempt's span ends once AHC has wound that attempt down, which may come
        // after the request has returned.
        #expect(await tracer.waitForFinishedSpans(3))

        let spans = tracer.finishedSpans
        let logical = try #require(spans.first { $0.parentSpanID == nil })
        let attempts = spans.filter { $0.parentSpanID == logical.spanID }
        #expect(attempts.count == 2)
        #expect(spans.count == 3)
        #expect(attempts.contains { $0.attributes.get("error.type") == .string("timed_out") || $0.status?.code == .error })
        #expect(logical.events.map(\.name) == ["retry_scheduled"])
    }

    @Test func aFailedRequestsSpansCarryTheReasonAndAnErrorStatus() async throws {
        let tracer = W3CTestTracer()
        let refusing = try RefusingPort()
        let engine = AsyncRequestEngine(session: TracingNetworkSession(wrapping: session, tracer: tracer))
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        _ = await networkError { try await client.send(TestRequest(url: URL(string: "http://127.0.0.1:\(refusing.port)/x")!)) }
        let spans = tracer.finishedSpans
        #expect(spans.count == 2)
        for span in spans {
            #expect(span.attributes.get("error.type") == .string("cannot_connect"))
            #expect(span.status?.code == .error)
        }
    }

    // MARK: Secrets

    /// Requests carrying an `Authorization` header, a cookie, a `?token=` query value and user info,
    /// through all three bridges and `AuthenticatedRequestEngine`, succeeding, retried, failing and
    /// refused: the server receives the secrets, and no log line, metric label or span attribute,
    /// event, error or name contains any of them.
    @Test func noSecretReachesALogLineAMetricLabelOrASpan() async throws {
        let secrets = ["Bearer-SECRET-AUTH-1", "COOKIE-SECRET-2", "QUERY-SECRET-3", "USERINFO-SECRET-4", "REFRESHED-SECRET-5"]
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "test", factory: { _ in handler })
        logger.logLevel = .trace
        let metrics = TestMetrics()
        let tracer = W3CTestTracer()
        server.route("/account/*", [.status(503), .ok("fine"), .status(401), .ok("after refresh"), .status(500)])
        let engine = AsyncRequestEngine(
            session: TracingNetworkSession(wrapping: session, tracer: tracer),
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0),
            eventSink: FanOutEventSink(SwiftLogEventSink(logger: logger), SwiftMetricsEventSink(factory: metrics), TracingEventSink())
        )
        let client = TracingRequestSender(wrapping: engine, tracer: tracer)
        let headers = ["Authorization": "Bearer \(secrets[0])", "Cookie": "session=\(secrets[1])"]
        let url = try #require(URL(string: "http://user:\(secrets[3])@127.0.0.1:\(server.port)/account/me?token=\(secrets[2])&access_token=\(secrets[2])"))
        _ = try await client.send(TestRequest(url: url, headers: headers))  // 503, then 200
        let authenticated = TracingRequestSender(
            wrapping: AuthenticatedRequestEngine(
                requestEngine: engine,
                coordinator: TokenRefreshCoordinator(provider: CountingTokenProvider(current: secrets[0], next: secrets[4]))
            ),
            tracer: tracer
        )
        _ = try await authenticated.send(TestRequest(url: url, headers: ["Cookie": "session=\(secrets[1])"]))  // 401, refresh, 200
        _ = await networkError { try await client.send(TestRequest(url: url, method: .post, headers: headers)) }  // 500
        let refusing = try RefusingPort()
        let refused = try #require(URL(string: "http://user:\(secrets[3])@127.0.0.1:\(refusing.port)/account/me?token=\(secrets[2])"))
        _ = await networkError { try await client.send(TestRequest(url: refused, headers: headers)) }

        // The secrets were sent: the test would prove nothing otherwise.
        #expect(server.requestLog.contains { $0.header("authorization") == "Bearer \(secrets[0])" })
        #expect(server.requestLog.contains { $0.header("authorization") == "Bearer \(secrets[4])" })
        #expect(server.requestLog.contains { $0.header("cookie")?.contains(secrets[1]) == true })
        #expect(server.requestLog.contains { $0.query?.contains(secrets[2]) == true })

        var observed: [String] = []
        for entry in handler.entries {
            observed.append(entry.message.description)
            observed += entry.metadata.map { "\($0.key)=\($0.value)" }
        }
        #expect(handler.entries.count >= 12)
        for counter in metrics.counters { observed += [counter.label] + counter.dimensions.map { "\($0.0)=\($0.1)" } }
        for timer in metrics.timers { observed += [timer.label] + timer.dimensions.map { "\($0.0)=\($0.1)" } }
        #expect(!metrics.counters.isEmpty)
        let spans = tracer.finishedSpans
        #expect(spans.count >= 8)
        for span in spans {
            observed.append(span.operationName)
            span.attributes.forEach { key, value in observed.append("\(key)=\(value)") }
            for event in span.events {
                observed.append(event.name)
                event.attributes.forEach { key, value in observed.append("\(key)=\(value)") }
            }
            observed += span.errors.map { String(describing: $0.error) + String(reflecting: $0.error) }
            observed.append(String(describing: span.status))
        }
        for secret in secrets {
            let leaks = observed.filter { $0.contains(secret) }
            #expect(leaks.isEmpty, "\(secret) leaked: \(leaks)")
        }
        for fragment in ["token=", "access_token", "user:", "Authorization", "Cookie"] {
            #expect(!observed.contains { $0.contains(fragment) }, "\(fragment) appears")
        }
    }
}

/// A clock whose sleeps return at once (for backoff a test does not want to wait for).
struct ImmediateClock: Clock {
    typealias Instant = ContinuousClock.Instant
    var now: Instant { ContinuousClock.now }
    var minimumResolution: Duration { .zero }
    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        try Task.checkCancellation()
    }
}
