import Resilience

// The snippets of SwiftResilience's published README (meetbb/SwiftResilience), unchanged but for the
// import: statements are wrapped in functions (a library has no top-level code), and a function
// may end with a `return` of what its snippet left in local variables, so the runner can check it.
// Names the README uses without defining them (`userURL`, `payload`, `FetchFeedRequest`, `Keychain`,
// …) are defined in Context.swift. The published snippets bind values they never read
// (`let (data, response) = …` in a `do` block): those "never used" warnings from this file are
// the snippets' own, and the only warnings CI lets through (.ci/run).

// MARK: - Exponential Retry

public func exponentialRetrySnippet() -> ExponentialRetryPolicy {
    let policy = ExponentialRetryPolicy(
        maxRetries: 3,    // up to 3 retries after the initial attempt
        baseDelay: 1.0    // delays: 1s, 2s, 4s
    )
    return policy
}

// MARK: - Async Request Engine

// Define your request
struct FetchUserRequest: NetworkRequest {
    let url: URL
    let method: HTTPMethod = .get
}

public func asyncRequestEngineSnippet() async throws {
    // Create the engine
    let engine = AsyncRequestEngine(
        retryPolicy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0)
    )

    // Send — cancellation-aware, typed errors
    do {
        let (data, response) = try await engine.send(FetchUserRequest(url: userURL))
    } catch NetworkError.noConnection {
        // show offline banner
    } catch NetworkError.httpError(let statusCode, _) {
        // handle 4xx / 5xx
    } catch NetworkError.cancelled {
        // caller cancelled — nothing to do
    }
}

// MARK: - Request Deduplication

public func requestDeduplicationSnippet(engine: AsyncRequestEngine) async throws -> [(Data, HTTPURLResponse)] {
    // All three fire concurrently — only ONE network call is made.
    // All three callers get the same response when it arrives.
    async let feed1 = engine.send(FetchFeedRequest())
    async let feed2 = engine.send(FetchFeedRequest())
    async let feed3 = engine.send(FetchFeedRequest())

    let (r1, r2, r3) = try await (feed1, feed2, feed3)
    return [r1, r2, r3]
}

// MARK: - Offline Queue

// Your request conforms to QueueableRequest for TTL, priority, and idempotency
struct SubmitOrderRequest: QueueableRequest {
    let url: URL
    let method: HTTPMethod = .post
    var body: Data?

    // Keep this request on disk for up to 24 hours
    var ttl: TimeInterval { 86_400 }

    // Higher priority than default analytics events
    var priority: QueuePriority { .high }

    // Stable key — the server ignores duplicate deliveries with this key
    var idempotencyKey: String { "order-\(orderID)" }

    let orderID: String
}

public func offlineQueueSnippet() async throws -> (OfflineQueueEngine, NetworkReachabilityMonitor) {
    let monitor = NetworkReachabilityMonitor()
    let engine  = try OfflineQueueEngine(reachabilityMonitor: monitor)

    // Start listening for connectivity events
    Task { await monitor.start(); await engine.start() }

    // Enqueue — succeeds immediately whether online or offline
    try await engine.enqueue(SubmitOrderRequest(orderID: "abc-123", body: payload))
    return (engine, monitor)
}

// MARK: - Background Queue Drainer (Apple platforms; UIKit is the snippet's own import)

#if canImport(BackgroundTasks) && canImport(UIKit) && !os(watchOS)
import UIKit

final class AppDelegate: NSObject, UIApplicationDelegate {
    // AppDelegate.swift
    let drainer = BackgroundQueueDrainer(
        taskIdentifier: "com.myapp.queue-drain",
        engine: offlineQueueEngine
    )

    // The README writes `options: ...`, pseudo-code for the launch options' type.
    func application(_ app: UIApplication,
                     didFinishLaunchingWithOptions options: [UIApplication.LaunchOptionsKey: Any]?) -> Bool {
        drainer.register()   // must be called before launch completes
        return true
    }

    func applicationDidEnterBackground(_ application: UIApplication) {
        drainer.scheduleNextDrain()   // tell iOS to grant background time
    }
}
#endif

// MARK: - Concurrency Safety

// 1. Implement TokenProvider once in your auth module
actor KeychainTokenProvider: TokenProvider {
    func currentToken() async -> String? {
        Keychain.read("access_token")
    }

    func refreshToken() async throws -> String {
        let response = try await AuthAPI.refresh(
            using: Keychain.read("refresh_token")
        )
        Keychain.write("access_token", response.accessToken)
        return response.accessToken
    }
}

public func concurrencySafetySnippet() async throws -> (Data, AuthenticatedRequestEngine) {
    // 2. Wire it up
    let provider    = KeychainTokenProvider()
    let coordinator = TokenRefreshCoordinator(provider: provider)
    let engine      = AuthenticatedRequestEngine(
        requestEngine: AsyncRequestEngine(),
        coordinator: coordinator
    )

    // 3. Send requests — token injection and 401 refresh are invisible to callers
    let (data, _) = try await engine.send(FetchProfileRequest())
    return (data, engine)
}

public func sessionExpiredSnippet(engine: AuthenticatedRequestEngine) async throws {
    do {
        let (data, _) = try await engine.send(FetchProfileRequest())
    } catch NetworkError.httpError(401, _) {
        // Token is genuinely expired and refresh failed — redirect to login
        await showLoginScreen()
    }
}

// MARK: - Advanced Observability

public func advancedObservabilitySnippet() async -> (RequestMetricsCollector, AsyncRequestEngine) {
    let metrics = RequestMetricsCollector()

    let engine = AsyncRequestEngine(
        retryPolicy: ExponentialRetryPolicy(),
        eventSink: metrics          // nil by default — zero overhead when unused
    )

    // … send some requests …

    let stats = await metrics.snapshot()
    print("Requests started: \(stats.requestsStarted)")
    print("Succeeded:        \(stats.requestsSucceeded)")
    print("Failed:           \(stats.requestsFailed)")
    print("Retries:          \(stats.retriesScheduled)")
    print("Deduped:          \(stats.deduplicationsHit)")
    print("Avg duration:     \(stats.averageSuccessDuration.map { String(format: "%.3fs", $0) } ?? "n/a")")
    print("Success rate:     \(stats.successRate.map { String(format: "%.1f%%", $0 * 100) } ?? "n/a")")
    return (metrics, engine)
}

actor RequestLogger: RequestEventSink {
    func record(_ event: RequestEvent) {
        switch event {
        case let .started(id, url, method):
            print("[\(id)] → \(method.rawValue) \(url.path)")

        case let .retryScheduled(id, attempt, delay):
            print("[\(id)] ↺ attempt \(attempt) failed, retrying in \(delay)s")

        case let .succeeded(id, code, duration, attempt):
            print("[\(id)] ✓ \(code) in \(String(format: "%.3f", duration))s after \(attempt + 1) attempt(s)")

        case let .failed(id, error, attempt):
            print("[\(id)] ✗ \(error) after \(attempt + 1) attempt(s)")

        case let .deduplicated(id, url, _):
            print("[\(id)] = deduped \(url.path) — served from in-flight task")
        }
    }
}

public func customSinkSnippet() -> AsyncRequestEngine {
    let engine = AsyncRequestEngine(eventSink: RequestLogger())
    return engine
}
