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

    /// `flush()` follows the monitor; force a pass with `flush(ignoringReachability: true)`.
    public static func forcedFlush(queue: OfflineQueueEngine) async -> Int {
        await queue.flush(ignoringReachability: true).delivered.count
    }

    /// `RequestMetricsCollector.record` is synchronous: drop the `await`.
    public static func recordDirectly(_ metrics: RequestMetricsCollector) {
        metrics.record(.started(traceID: UUID(), url: SnippetContext.url("/x"), method: .get))
    }
}
