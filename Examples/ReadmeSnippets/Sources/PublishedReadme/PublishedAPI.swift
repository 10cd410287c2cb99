import Resilience

// Calls a SwiftResilience user makes of its public API beyond the README (its DocC articles and
// tests), unchanged but for the import. `DiskQueueStore` and `RequestMetricsCollector` were actors;
// here they are classes, and the `await`s written for the actors still compile without a warning.

struct ShortLivedRequest: QueueableRequest {
    var url: URL { SnippetContext.url("/analytics") }
    let method: HTTPMethod = .post
    var ttl: TimeInterval { 1 }
}

public enum PublishedAPI {
    public struct StoreObservations: Sendable {
        public var loadedIDs: [UUID]
        public var countWithExpired: Int
        public var expiredDeleted: Int
        public var countAfterDelete: Int
        public var savedID: UUID
        public var directory: URL
    }

    /// `DiskQueueStore(directory:)`, `save`, `load`, `count`, `deleteExpired`, `delete(id:)`.
    public static func diskQueueStore(in directory: URL) async throws -> StoreObservations {
        let store = try DiskQueueStore(directory: directory)
        let entry = QueueEntry(SubmitOrderRequest(orderID: "store-1", body: payload), id: UUID(), enqueuedAt: .now)
        let expired = QueueEntry(ShortLivedRequest(), enqueuedAt: Date.now.addingTimeInterval(-60))
        try await store.save(entry)
        try await store.save(expired)

        let loaded = await store.load()                 // unexpired entries only
        let countWithExpired = await store.count()      // expired ones included until swept
        let deletedCount = await store.deleteExpired()
        await store.delete(id: entry.id)
        let countAfterDelete = await store.count()
        return StoreObservations(
            loadedIDs: loaded.map(\.id), countWithExpired: countWithExpired, expiredDeleted: deletedCount,
            countAfterDelete: countAfterDelete, savedID: entry.id, directory: store.directory
        )
    }

    /// `QueueEntry(_:id:enqueuedAt:)`, `isExpired`, `asURLRequest()`.
    public static func queueEntry() -> (expired: Bool, freshExpired: Bool, method: String?, key: String?, priority: Int) {
        let entry = QueueEntry(SubmitOrderRequest(orderID: "entry-1", body: payload))
        let old = QueueEntry(ShortLivedRequest(), enqueuedAt: Date.now.addingTimeInterval(-60))
        let urlRequest = entry.asURLRequest()
        return (old.isExpired, entry.isExpired, urlRequest.httpMethod, urlRequest.value(forHTTPHeaderField: "Idempotency-Key"), entry.priority)
    }

    /// `RequestMetricsCollector()`, `snapshot()`, `reset()` as an engine's sink.
    public static func metricsCollector(_ url: URL) async throws -> (before: Int, after: Int, successRate: Double?) {
        let metrics = RequestMetricsCollector()
        let engine = AsyncRequestEngine(retryPolicy: ExponentialRetryPolicy(), eventSink: metrics)
        try await engine.send(FetchUserRequest(url: url))
        let stats = await metrics.snapshot()
        await metrics.reset()
        let afterReset = await metrics.snapshot()
        return (stats.requestsSucceeded, afterReset.requestsSucceeded, stats.successRate)
    }

    /// `OfflineQueueEngine(requestEngine:reachabilityMonitor:store:maxQueueSize:)`, `enqueue`,
    /// `pendingCount()`, `cancel(id:)`, `start()`, `stop()`, with an app's own monitor.
    public static func offlineQueueEngine(in directory: URL) async throws -> (pendingAfterEnqueue: Int, pendingAfterCancel: Int) {
        let monitor = AppReachability(isConnected: false)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(),
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: directory),
            maxQueueSize: 10
        )
        await engine.start()
        try await engine.enqueue(SubmitOrderRequest(orderID: "offline-1", body: payload))
        let pending = await engine.pendingCount()
        let entries = await engine.store.load()
        for entry in entries { await engine.cancel(id: entry.id) }
        let afterCancel = await engine.pendingCount()
        await engine.stop()
        return (pending, afterCancel)
    }
}

/// A monitor of the app's own, as SwiftResilience's tests wrote one: an actor with `isConnected`
/// and a `connectivity` stream.
actor AppReachability: ReachabilityMonitoring {
    private(set) var isConnected: Bool
    var connectivity: AsyncStream<Bool> { stream }
    private let stream: AsyncStream<Bool>
    private let continuation: AsyncStream<Bool>.Continuation

    init(isConnected: Bool) {
        self.isConnected = isConnected
        (stream, continuation) = AsyncStream<Bool>.makeStream()
    }

    func simulate(connected: Bool) {
        isConnected = connected
        continuation.yield(connected)
    }
}
