import CoreMetrics
import Foundation
import Observability
import RequestEngine
import ResilienceBridgeSupport
import Synchronization

/// A `RequestEventSink` that records the engine's events through swift-metrics, under the names
/// and labels of `RequestMetricsCollector.prometheusText()`, so a service's own registry
/// (swift-prometheus, swift-otel, …) exports the same series our Prometheus text does:
///
/// | metric | kind | dimensions | recorded on |
/// | --- | --- | --- | --- |
/// | `http_client_requests_started_total` | counter | `method`, `endpoint` | `started` |
/// | `http_client_retries_total` | counter | `method`, `endpoint` | `retryScheduled` |
/// | `http_client_deduplicated_requests_total` | counter | `method`, `endpoint` | `deduplicated` |
/// | `http_client_requests_total` | counter | `method`, `endpoint`, `status`, `outcome` | `succeeded`, `failed` |
/// | `http_client_request_duration_seconds` | timer (nanoseconds) | `method`, `endpoint` | `succeeded` |
///
/// `endpoint` is the request's operation when it has one (`createNote`, a generated client's, given
/// by `record(_:operation:)`), else the path template (`/users/{id}`), never a path, host, query or header, so no
/// token or personal identifier becomes a label; at most `maximumEndpoints` distinct endpoints get
/// their own label, later ones share `__other__`. `status` is the final HTTP status, or the reason
/// a request without a response failed (`timed_out`, `cannot_connect`, …). Terminal events of a
/// request the sink no longer remembers are recorded under `UNKNOWN` / `__unknown__`. The duration
/// histogram's buckets are the backend's (the collector uses OpenTelemetry's advised ones).
///
/// Metric objects are made once per label set and kept, so recording is a dictionary look-up and
/// the backend's increment.
public struct SwiftMetricsEventSink: RetryThrottlingEventSink {
    /// How requests are grouped, and how much the sink remembers.
    public struct Configuration: Sendable {
        /// Turns a URL into the `endpoint` label. Default `.collapsingIdentifiers`, as the collector.
        public var pathTemplate: PathTemplate
        /// Distinct method + endpoint pairs with a label of their own. Default 100, as the collector.
        public var maximumEndpoints: Int
        /// Requests in flight the sink maps from trace id to labels. Default 4096.
        public var maximumTrackedRequests: Int

        public init(pathTemplate: PathTemplate = .collapsingIdentifiers, maximumEndpoints: Int = 100, maximumTrackedRequests: Int = 4096) {
            self.pathTemplate = pathTemplate
            self.maximumEndpoints = maximumEndpoints
            self.maximumTrackedRequests = maximumTrackedRequests
        }
    }

    /// The metric names, as in the collector's Prometheus text.
    public enum Name {
        public static let requestsStarted = "http_client_requests_started_total"
        public static let retries = "http_client_retries_total"
        public static let deduplicated = "http_client_deduplicated_requests_total"
        public static let requests = "http_client_requests_total"
        public static let duration = "http_client_request_duration_seconds"
        public static let retriesThrottled = "http_client_retries_throttled_total"
        public static let hostConcurrencyLimit = "http_client_host_concurrency_limit"
        public static let hostInFlight = "http_client_host_in_flight"
        public static let hostWaiting = "http_client_host_waiting"
    }

    private let metrics: MetricHandles
    private let catalog: EndpointCatalog
    private let requests: TraceTable<EndpointLabels>

    /// Records through the bootstrapped `MetricsSystem` (its factory as of the first metric made).
    public init(configuration: Configuration = Configuration()) {
        self.init(factory: nil, configuration: configuration)
    }

    /// Records through `factory` (for tests, or a registry that is not bootstrapped globally).
    public init(factory: any MetricsFactory, configuration: Configuration = Configuration()) {
        self.init(factory: Optional(factory), configuration: configuration)
    }

    private init(factory: (any MetricsFactory)?, configuration: Configuration) {
        let policy = LabelPolicy(
            pathTemplate: configuration.pathTemplate,
            maximumEndpoints: configuration.maximumEndpoints,
            maximumTrackedRequests: configuration.maximumTrackedRequests
        )
        metrics = MetricHandles(factory: factory)
        catalog = EndpointCatalog(policy: policy)
        requests = TraceTable(capacity: policy.maximumTrackedRequests)
    }

    public func record(_ event: RequestEvent) async {
        count(event, operationID: nil)
    }

    /// `record(_:)`, with `endpoint` the operation's name.
    public func record(_ event: RequestEvent, operation operationID: String) async {
        count(event, operationID: operationID)
    }

    private func count(_ event: RequestEvent, operationID: String?) {
        switch event {
        case .started(let traceID, let url, let method):
            let labels = catalog.labels(method: method, url: url, operationID: operationID)
            requests.insert(labels, for: traceID)
            metrics.counter(Name.requestsStarted, labels).increment()
        case .deduplicated(_, let url, let method):
            metrics.counter(Name.deduplicated, catalog.labels(method: method, url: url, operationID: operationID)).increment()
        case .retryScheduled(let traceID, _, _):
            metrics.counter(Name.retries, requests.value(for: traceID) ?? .unknown).increment()
        case .succeeded(let traceID, let statusCode, let duration, _):
            let labels = requests.remove(traceID) ?? .unknown
            metrics.outcome(labels, status: StatusLabel.success(statusCode), outcome: "success").increment()
            metrics.timer(labels).recordNanoseconds(Self.nanoseconds(duration))
        case .failed(let traceID, let error, _):
            let labels = requests.remove(traceID) ?? .unknown
            metrics.outcome(labels, status: StatusLabel.failure(error), outcome: "failure").increment()
        }
    }

    /// Counts a retry a host's retry throttle refused, under `host` (host and port only).
    public func recordRetryThrottled(_ event: RetryThrottledEvent) async {
        metrics.hostCounter(Name.retriesThrottled, host: CircuitBreakerRegistry.authority(of: event.url) ?? "__unknown__").increment()
    }

    /// Records the adaptive limits of `engines` per host as gauges (`host` label): the limit, the
    /// attempts in flight, those waiting — summed over the engines that share a host, as the
    /// collector's text does. swift-metrics has no pull: call this with every engine whenever you
    /// want the gauges fresh (before a scrape, or every few seconds).
    public func recordAdaptiveLimits(of engines: AsyncRequestEngine...) {
        for row in HostAdaptiveLimit.summed(engines) {
            metrics.hostGauge(Name.hostConcurrencyLimit, host: row.host).record(row.limit)
            metrics.hostGauge(Name.hostInFlight, host: row.host).record(row.inFlight)
            metrics.hostGauge(Name.hostWaiting, host: row.host).record(row.waiting)
        }
    }

    /// Seconds as whole nanoseconds, clamped to 0…Int64.max (NaN counts as 0).
    static func nanoseconds(_ seconds: TimeInterval) -> Int64 {
        guard seconds.isFinite else { return seconds.isNaN || seconds < 0 ? 0 : .max }
        let value = (seconds * 1_000_000_000).rounded()
        if value <= 0 { return 0 }
        return value >= 9.2e18 ? .max : Int64(value)
    }
}

/// The metric objects made so far, by name and labels: made once, then reused.
final class MetricHandles: Sendable {
    private struct Key: Hashable {
        let name: String
        let labels: EndpointLabels
        let status: String
        let outcome: String
    }

    private let factory: (any MetricsFactory)?
    private let counters = Mutex<[Key: Counter]>([:])
    private let timers = Mutex<[EndpointLabels: CoreMetrics.Timer]>([:])
    /// Per-host metrics by name and host; at most `maximumHosts` hosts, later ones share `__other__`.
    private let hostCounters = Mutex<[String: [String: Counter]]>([:])
    private let hostGauges = Mutex<[String: [String: Gauge]]>([:])
    static let maximumHosts = 1_024

    init(factory: (any MetricsFactory)?) {
        self.factory = factory
    }

    func counter(_ name: String, _ labels: EndpointLabels) -> Counter {
        counter(Key(name: name, labels: labels, status: "", outcome: ""))
    }

    func outcome(_ labels: EndpointLabels, status: String, outcome: String) -> Counter {
        counter(Key(name: SwiftMetricsEventSink.Name.requests, labels: labels, status: status, outcome: outcome))
    }

    func timer(_ labels: EndpointLabels) -> CoreMetrics.Timer {
        timers.withLock { timers in
            if let timer = timers[labels] { return timer }
            let dimensions = [("method", labels.method), ("endpoint", labels.endpoint)]
            let timer =
                factory.map { CoreMetrics.Timer(label: SwiftMetricsEventSink.Name.duration, dimensions: dimensions, factory: $0) }
                ?? CoreMetrics.Timer(label: SwiftMetricsEventSink.Name.duration, dimensions: dimensions)
            timers[labels] = timer
            return timer
        }
    }

    func hostCounter(_ name: String, host: String) -> Counter {
        hostCounters.withLock { byName in
            Self.handle(name, host: host, in: &byName) { label, dimensions in
                factory.map { Counter(label: label, dimensions: dimensions, factory: $0) } ?? Counter(label: label, dimensions: dimensions)
            }
        }
    }

    func hostGauge(_ name: String, host: String) -> Gauge {
        hostGauges.withLock { byName in
            Self.handle(name, host: host, in: &byName) { label, dimensions in
                factory.map { Gauge(label: label, dimensions: dimensions, factory: $0) } ?? Gauge(label: label, dimensions: dimensions)
            }
        }
    }

    /// The handle for `name` and `host` (or the shared `__other__` one past `maximumHosts`), made once.
    private static func handle<Handle>(
        _ name: String, host: String, in byName: inout [String: [String: Handle]],
        make: (String, [(String, String)]) -> Handle
    ) -> Handle {
        var handles = byName[name, default: [:]]
        let key = handles[host] != nil || handles.count < maximumHosts ? host : "__other__"
        if let existing = handles[key] { return existing }
        let made = make(name, [("host", key)])
        handles[key] = made
        byName[name] = handles
        return made
    }

    private func counter(_ key: Key) -> Counter {
        counters.withLock { counters in
            if let counter = counters[key] { return counter }
            var dimensions = [("method", key.labels.method), ("endpoint", key.labels.endpoint)]
            if !key.status.isEmpty { dimensions += [("status", key.status), ("outcome", key.outcome)] }
            let counter =
                factory.map { Counter(label: key.name, dimensions: dimensions, factory: $0) }
                ?? Counter(label: key.name, dimensions: dimensions)
            counters[key] = counter
            return counter
        }
    }
}
