import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// Counts `AsyncRequestEngine`'s events into totals, per-endpoint statistics, duration
/// percentiles and Prometheus text, at a cost of about 50 ns of its own per event (figures in
/// Benchmarks/README.md).
///
/// ```swift
/// let metrics = RequestMetricsCollector()
/// let engine = AsyncRequestEngine(retryPolicy: ExponentialRetryPolicy(), eventSink: metrics)
/// // … send requests …
/// let stats = await metrics.snapshot()
/// print(stats.successRate ?? 0, stats.endpoints.first?.successDuration?.p99 ?? 0)
/// let scrape = metrics.prometheusText()   // serve at GET /metrics
/// ```
///
/// What is counted when (see Sources/Observability/Observability.docc/ObservabilityGuide.md):
/// - `started` → `requestsStarted`, for the endpoint its URL and method map to;
/// - `retryScheduled` → `retriesScheduled`;
/// - `succeeded` → `requestsSucceeded`, its status code, and its duration into the histogram;
/// - `failed` → `requestsFailed` and its status code (final non-2xx response) or failure reason;
/// - `deduplicated` → `deduplicationsHit`.
/// `retryScheduled`, `succeeded` and `failed` carry only the trace id: the collector remembers
/// each trace's endpoint from `started` until its terminal event, in fixed memory.
///
/// Endpoints are method + path template (`Configuration.pathTemplate`), capped at
/// `Configuration.maximumEndpoints` rows; later endpoints share a `__other__` row per method.
/// Query strings, user info and hosts never reach a template, so no token or credential becomes a
/// label.
///
/// Thread safety and cost: a final class around lock-striped state rather than an actor, because
/// the engine awaits `record(_:)` on every request's path. Each thread records into a shard of its
/// own (no contention, no cache-line sharing between threads); trace ids are kept in lock stripes
/// chosen by hash. `record` takes one or two uncontended locks, does constant work and, once an
/// endpoint has been seen, allocates nothing. Snapshots add the shards up; they are exact for
/// every event recorded before the snapshot began, and may or may not include events recorded
/// while it runs.
public final class RequestMetricsCollector: RetryThrottlingEventSink {
    /// The template of the row that endpoints past `Configuration.maximumEndpoints` share.
    public static let overflowEndpoint = "__other__"
    /// The template of the row for terminal events whose `started` was not seen or was evicted.
    public static let unknownEndpoint = "__unknown__"

    /// The configuration this collector was created with (counts normalised).
    public let configuration: Configuration

    private let registry: EndpointRegistry
    private let traces: TraceTable
    private let shards: LockStripes<StatisticsShard>
    private let shardMask: Int
    private let hashSeed: UInt64
    private let customTemplate: (@Sendable (String) -> String)?
    /// Per host: retries its throttle refused; and the engines whose adaptive limits are exported.
    private let hosts = Locked<HostState>(HostState())

    private struct HostState: Sendable {
        var throttledRetries: [String: UInt64] = [:]
        /// Held weakly: an engine whose sink is this collector must not be kept alive by it.
        var engines: [WeakEngine] = []
    }

    private struct WeakEngine: Sendable {
        weak var engine: AsyncRequestEngine?
    }

    /// The most hosts counted for throttled retries; later hosts share the `__other__` row.
    static let maximumHosts = 1_024

    /// A collector with the given configuration (by default: `{id}` templating, 100 endpoints,
    /// 4096 requests in flight tracked, one shard per processor up to 16).
    public init(configuration: Configuration = Configuration()) {
        var shardCount = 1
        while shardCount < min(max(configuration.shardCount, 1), 64) { shardCount <<= 1 }
        var normalised = configuration
        normalised.shardCount = shardCount
        self.configuration = normalised
        registry = EndpointRegistry(maximumEndpoints: configuration.maximumEndpoints)
        traces = TraceTable(capacity: configuration.maximumTrackedRequests)
        let rowCount = registry.rowCount
        shards = LockStripes(count: shardCount) { _ in StatisticsShard(rowCount: rowCount) }
        shardMask = shardCount - 1
        var generator = SystemRandomNumberGenerator()
        hashSeed = generator.next()
        if case .custom(let template) = configuration.pathTemplate.kind {
            customTemplate = template
        } else {
            customTemplate = nil
        }
    }

    // MARK: - RequestEventSink

    /// Counts `event`. Synchronous: it never suspends, and waits for other recorders at most for
    /// the few field updates they do under a shared lock. It satisfies `RequestEventSink`'s
    /// `async` requirement, so the engine awaits it as any sink; being synchronous saves the
    /// executor hop that a cross-module `async` call costs (about 30 ns per event) and lets
    /// synchronous code record events too. (Code written for SwiftResilience's actor, which calls
    /// `await collector.record(event)`, still compiles, with a "no async operations" warning.)
    public func record(_ event: RequestEvent) {
        ingest(event)
    }

    /// Counts `event` of a request performing API operation `operationID`: its `started` and
    /// `deduplicated` are counted under an endpoint named by the operation (in place of the URL's
    /// path template, and of `Configuration`'s custom template). `async`, unlike `record(_:)`, so
    /// that a call in async code picks it over `RequestEventSink`'s default (which drops the
    /// operation); it never suspends.
    public func record(_ event: RequestEvent, operation operationID: String) async {
        ingest(event, operationID: operationID)
    }

    /// Counts a retry a host's retry throttle refused, under the host (host and port; never a
    /// path, query or credential).
    public func recordRetryThrottled(_ event: RetryThrottledEvent) {
        let host = CircuitBreakerRegistry.authority(of: event.url) ?? Self.unknownEndpoint
        hosts.withLock { state in
            let key = state.throttledRetries[host] != nil || state.throttledRetries.count < Self.maximumHosts ? host : Self.overflowEndpoint
            state.throttledRetries[key, default: 0] += 1
        }
    }

    /// Exports `engine`'s adaptive limits per host in `prometheusText()`: the current limit, the
    /// attempts in flight and those waiting (`Configuration.limits.adaptiveConcurrencyPerHost`). Several
    /// engines may be exported; a host they share shows their sums. The collector does not keep
    /// an engine alive (it forgets one that is gone).
    public func exportAdaptiveLimits(of engine: AsyncRequestEngine) {
        hosts.withLock { state in
            state.engines.removeAll { $0.engine == nil }
            if !state.engines.contains(where: { $0.engine === engine }) { state.engines.append(WeakEngine(engine: engine)) }
        }
    }

    /// Retries refused by each host's retry throttle so far, by host.
    public var throttledRetriesByHost: [String: UInt64] {
        hosts.withLock { $0.throttledRetries }
    }

    // MARK: - Reading

    /// A copy of everything counted so far: the compatibility spelling (`async`, as on
    /// SwiftResilience's actor-based collector) of the canonical `currentSnapshot()`.
    public func snapshot() async -> RequestMetrics {
        currentSnapshot()
    }

    /// A copy of everything counted so far, from any context without awaiting (canonical;
    /// `snapshot()` is the compatibility spelling). Takes each shard's
    /// lock in turn for the time it takes to add its counters up.
    public func currentSnapshot() -> RequestMetrics {
        let (keys, rows) = aggregate()
        let (inFlight, evicted) = traces.counts()
        return RequestMetrics(keys: keys, rows: rows, inFlight: inFlight, evicted: evicted)
    }

    /// Every metric in the Prometheus text exposition format 0.0.4, ready to serve at
    /// `GET /metrics` with `Content-Type: PrometheusTextFormat.contentType`. See
    /// `PrometheusTextFormat` for the metric families and labels.
    public func prometheusText() -> String {
        let (keys, rows) = aggregate()
        let (throttled, engines) = hosts.withLock { ($0.throttledRetries, $0.engines.compactMap(\.engine)) }
        return PrometheusTextFormat.render(keys: keys, rows: rows)
            + PrometheusTextFormat.renderHosts(limits: HostAdaptiveLimit.summed(engines), throttledRetries: throttled)
    }

    /// Zeroes every counter and histogram. Endpoint rows, the cardinality cap's count and the
    /// requests in flight are kept, so a request that started before the reset and ends after it
    /// is counted under its endpoint in the new window (as its terminal event only). Prometheus
    /// sees the reset as a counter reset.
    public func reset() async {
        for shard in 0..<shards.count {
            shards.withLock(shard) { state in
                for row in state.rows.indices { state.rows[row].zero() }
            }
        }
        traces.resetEvictions()
        hosts.withLock { $0.throttledRetries = [:] }
    }

    // MARK: - Recording

    /// The calling thread's statistics shard.
    @inline(__always)
    private var currentShard: Int {
        ThreadOrdinal.current & shardMask
    }

    @inline(__always)
    func ingest(_ event: RequestEvent, operationID: String? = nil) {
        switch event {
        case .started(let traceID, let url, let method):
            let row = countEndpointEvent(url: url, method: method, operationID: operationID, isDeduplication: false)
            traces.insert(traceID, row: row)
        case .deduplicated(_, let url, let method):
            _ = countEndpointEvent(url: url, method: method, operationID: operationID, isDeduplication: true)
        case .retryScheduled(let traceID, _, _):
            let row = Int(traces.row(of: traceID) ?? EndpointRegistry.unknownRow)
            shards.withLock(currentShard) { $0.rows[row].retries &+= 1 }
        case .succeeded(let traceID, let statusCode, let duration, _):
            let row = Int(traces.remove(traceID) ?? EndpointRegistry.unknownRow)
            shards.withLock(currentShard) { $0.rows[row].recordSuccess(statusCode: statusCode, duration: duration) }
        case .failed(let traceID, let error, _):
            let row = Int(traces.remove(traceID) ?? EndpointRegistry.unknownRow)
            let outcome = OutcomeKey(failure: error)
            shards.withLock(currentShard) { $0.rows[row].recordFailure(outcome) }
        }
    }

    /// Counts a `started` or `deduplicated` event for the endpoint of `url` and `method` — named by
    /// `operationID` when the request has one, else by the URL's path template — and returns that
    /// endpoint's row. A known endpoint costs a template hash and the shard's lock;
    /// the registry is consulted only when the shard's cache misses.
    @inline(__always)
    private func countEndpointEvent(url: URL, method: HTTPMethod, operationID: String?, isDeduplication: Bool) -> Int32 {
        let hash: Int
        var template: String?
        let discriminator = UInt64(method.ordinal + 1)
        if var operationID {
            // Hashed apart from every path template (a discriminator no method has).
            hash = operationID.withUTF8 { bytes in
                var hasher = TemplateHasher(seed: hashSeed, discriminator: discriminator | 0x100)
                hasher.write(bytes)
                return hasher.finalize()
            }
            template = operationID
        } else if let customTemplate {
            var custom = customTemplate(URLPathScanner.percentEncodedPath(of: url))
            hash = custom.withUTF8 { bytes in
                var hasher = TemplateHasher(seed: hashSeed, discriminator: discriminator)
                hasher.write(bytes)
                return hasher.finalize()
            }
            template = custom
        } else {
            hash = URLPathScanner.withPath(of: url) { path in
                var hasher = TemplateHasher(seed: hashSeed, discriminator: discriminator)
                URLPathScanner.writeTemplate(ofPath: path, into: &hasher)
                return hasher.finalize()
            }
        }
        let shard = currentShard
        let cached = shards.withLock(shard) { state -> Int32 in
            guard let row = state.cachedRow(forHash: hash) else { return -1 }
            state.countEndpointEvent(row: row, isDeduplication: isDeduplication)
            return row
        }
        if cached >= 0 { return cached }
        let row = registry.row(forHash: hash, method: method) {
            template ?? PathTemplate.collapsingIdentifiers.template(for: url)
        }
        shards.withLock(shard) { state in
            state.cache(row, forHash: hash)
            state.countEndpointEvent(row: row, isDeduplication: isDeduplication)
        }
        return row
    }

    // MARK: - Aggregation

    /// Every registered endpoint's key and its statistics summed over the shards. Adds each shard
    /// up while holding its lock, copying counts rather than sharing storage, so that recording
    /// afterwards does not have to copy anything.
    private func aggregate() -> (keys: [EndpointKey], rows: [EndpointAggregate]) {
        let keys = registry.keys()
        var rows = [EndpointAggregate](repeating: EndpointAggregate(), count: keys.count)
        for shard in 0..<shards.count {
            shards.withLock(shard) { state in
                for row in 0..<min(keys.count, state.rows.count) {
                    rows[row].add(state.rows[row])
                }
            }
        }
        return (keys, rows)
    }
}
