// The adoption snippet of README.md and Docs/Integrations.md, verbatim between the markers;
// `.ci/run` checks that the documents show exactly these lines, and compiles and runs them.
// Left as the documents show it (its comments aligned), so swift-format does not touch it:
// swift-format-ignore-file

// snippet:begin
import AsyncHTTPClient
import Logging
import Resilience                 // the engine, retry policies, FanOutEventSink
import ResilienceAsyncHTTPClient  // AsyncHTTPClientSession
import ResilienceLogging          // SwiftLogEventSink
import ResilienceMetrics          // SwiftMetricsEventSink
import ResilienceTracing          // TracingNetworkSession, TracingRequestSender, TracingEventSink

/// What a Vapor or Hummingbird service keeps for calling one upstream API: made once at start-up,
/// after `LoggingSystem`, `MetricsSystem` and `InstrumentationSystem` are bootstrapped, and shared
/// by every request handler.
struct Upstream: Sendable {
    let client: TracingRequestSender<AsyncRequestEngine>

    init(logger: Logger, httpClient: HTTPClient = AsyncHTTPClientSession.sharedClient) {
        var configuration = AsyncRequestEngine.Configuration()
        configuration.retry = .init(policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 0.2, jitter: .full), budget: RetryBudget(retryRatio: 0.1))
        // Same series as our Prometheus text, in the service's own metrics registry; structured
        // logs; retries and deduplication joins on the request's span. No secret in any of them.
        configuration.eventSink = FanOutEventSink(SwiftMetricsEventSink(), SwiftLogEventSink(logger: logger), TracingEventSink())
        let engine = AsyncRequestEngine(
            // AHC's pool, one client span per attempt with `traceparent` sent upstream.
            session: TracingNetworkSession(wrapping: AsyncHTTPClientSession(client: httpClient)),
            configuration: configuration
        )
        client = TracingRequestSender(wrapping: engine)  // one span per logical request
    }
}

struct Profile: NetworkRequest {
    let id: Int
    var url: URL { URL(string: "http://127.0.0.1:8081/profiles/\(id)")! }
    var method: HTTPMethod { .get }
    var timeout: TimeInterval { 2 }
}

// In a route handler (Hummingbird: `router.get("profile/:id") { request, context in … }`,
// Vapor: `app.get("profile", ":id") { req in … }`):
//     let (data, _) = try await upstream.client.send(Profile(id: id))
// snippet:end
