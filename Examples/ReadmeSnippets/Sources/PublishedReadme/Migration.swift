import Resilience

// The one-line changes of the README's "Coming from SwiftResilience" table, compiled and run, so the
// table cannot drift from the code.

struct AddToCart: QueueableRequest {
    var url: URL { SnippetContext.url("/cart/items") }
    let method: HTTPMethod = .post
    var body: Data? { Data(#"{"sku":"A-1"}"#.utf8) }
    // SwiftResilience's default key (derived from method, URL and body), as an opt-in:
    var idempotencyKey: String { derivedIdempotencyKey }
}

struct FreshKeyedRequest: QueueableRequest {
    var url: URL { SnippetContext.url("/cart/items") }
    let method: HTTPMethod = .post
    var body: Data? { Data(#"{"sku":"A-1"}"#.utf8) }
}

public enum Migration {
    /// The default key is a fresh UUID per request; `derivedIdempotencyKey` is the published one.
    public static func idempotencyKeys() -> (derivedIsStable: Bool, defaultIsFresh: Bool) {
        (AddToCart().idempotencyKey == AddToCart().idempotencyKey,
         FreshKeyedRequest().idempotencyKey != FreshKeyedRequest().idempotencyKey)
    }

    /// A failed refresh arrives as `AuthError.refreshFailed(underlying:)`; match the provider's
    /// own error inside it. Returns which branch caught the error.
    public static func refreshFailure(engine: AuthenticatedRequestEngine) async -> String {
        do {
            try await engine.send(FetchProfileRequest())
            return "sent"
        } catch AuthError.refreshFailed(let error as SnippetContext.RefreshRejected) {
            _ = error
            return "provider error"
        } catch {
            return "other: \(error)"
        }
    }

    /// `flush()` follows the monitor; force a pass with `flush(.ignoringReachability)`.
    public static func forcedFlush(queue: OfflineQueueEngine) async -> Int {
        await queue.flush(.ignoringReachability).delivered.count
    }

    /// `RequestMetricsCollector.record` is synchronous: drop the `await`.
    public static func recordDirectly(_ metrics: RequestMetricsCollector) {
        metrics.record(.started(traceID: UUID(), url: SnippetContext.url("/x"), method: .get))
    }

    /// The table's other changes, run against the snippet server and a scratch folder. Returns
    /// what each observed.
    public static func otherChanges(scratch: URL) async throws -> [String: Bool] {
        var seen: [String: Bool] = [:]

        // A POST retried only with an Idempotency-Key header.
        let retried = try await AsyncRequestEngine(retryPolicy: MyPolicy()).send(KeyedPost(key: UUID().uuidString))
        seen["keyed POST sent"] = retried.1.statusCode == 200

        // Unauthenticated calls through a plain engine.
        let request = FetchUserRequest(url: userURL)
        let (_, plain) = try await AsyncRequestEngine().send(request)
        seen["plain engine sends without a token"] = plain.statusCode > 0

        // One store per folder, or wait for the owner; one error type for the queue.
        let folder = scratch.appendingPathComponent("migration")
        let store = try await DiskQueueStore.open(directory: folder, lockTimeout: .seconds(5))
        do {
            _ = try DiskQueueStore(directory: folder)
            seen["second store refused"] = false
        } catch let error as OfflineQueueError {
            seen["second store refused"] = error == .folderInUse(path: folder.path) && !error.isDiskFull
        }

        // Entries saved in time order are replayed in time order.
        let now = Date()
        let entries = (0..<3).map { QueueEntry(FreshKeyedRequest(), enqueuedAt: now.addingTimeInterval(Double(-$0))) }
        for entry in entries.sorted(by: { $0.enqueuedAt < $1.enqueuedAt }) { try await store.save(entry) }
        seen["time order kept"] = await store.load().map(\.enqueuedAt) == entries.map(\.enqueuedAt).sorted()

        // A first attempt answered 503 is stored, not thrown; bounded retries.
        let queue = OfflineQueueEngine(
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(maxAttempts: 5)
        )
        guard case .sent = try await queue.enqueue(BusyServerRequest()) else {
            seen["503 stored"] = await queue.pendingCount() == 4
            return seen
        }
        seen["503 stored"] = false
        return seen
    }

    /// A credential moved from the URL into a header, re-added at each replay; a monitor of one's
    /// own forwarding its events to the shipped one.
    public static func secretsAndMonitors(folder: URL, key: String, isUp: Bool) async throws -> OfflineQueueEngine {
        let monitor = ManualReachabilityMonitor(isConnected: false)
        await monitor.setConnected(isUp)
        return OfflineQueueEngine(
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: folder),
            configuration: .init(replayHeaders: { _ in ["X-Api-Key": key] })
        )
    }

    /// Bodies above 16 MiB: raise the engine's limit, or one request's; or keep your own session.
    public static func largerBodies(session: URLSession) -> [AsyncRequestEngine] {
        [
            AsyncRequestEngine(configuration: .init(maximumResponseBodySize: 64 << 20)),
            AsyncRequestEngine(session: session),
            AsyncRequestEngine(session: URLSessionTransport(configuration: session.configuration)),
        ]
    }

    /// A `switch` that names the new cases it cares about and keeps a `default` (so it still
    /// compiles when a case is added), and the dropped connection's own case.
    public static func describe(_ error: NetworkError) -> String {
        switch error {
        case .transport(.connectionLost): return "connection lost"
        case .httpError(let status, _): return "HTTP \(status)"
        case .noConnection, .timedOut, .cancelled: return "offline, slow or cancelled"
        case .circuitOpen: return "circuit open"
        default: return "other"
        }
    }
}

/// A policy class: `final`, `Sendable`, `let` properties.
final class MyPolicy: RetryPolicy, Sendable {
    let delays: [TimeInterval] = [0.01, 0.02]
    func delay(forAttempt attempt: Int) -> TimeInterval? { attempt < delays.count ? delays[attempt] : nil }
}

/// One request allowed a larger body than the engine's default.
struct LargeExport: NetworkRequest {
    var url: URL { SnippetContext.url("/export") }
    let method: HTTPMethod = .get
    var maximumResponseBodySize: Int? { 64 << 20 }
}

struct KeyedPost: NetworkRequest {
    let key: String
    var url: URL { SnippetContext.url("/user") }
    let method: HTTPMethod = .post
    var headers: [String: String] { ["Idempotency-Key": key] }
}

struct BusyServerRequest: QueueableRequest {
    var url: URL { SnippetContext.url("/busy") }
    let method: HTTPMethod = .post
}
