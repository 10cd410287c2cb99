import Foundation

/// A point-in-time copy of what a `RequestMetricsCollector` has counted since it was created or
/// last reset. A value: later events do not change it. Encodes to JSON (`JSONEncoder`) with the
/// derived `averageSuccessDuration` and `successRate` included.
///
/// Totals count every event, including those whose endpoint is unknown (`__unknown__`), so each
/// total is the sum of the same field over `endpoints`.
public struct RequestMetrics: Sendable, Equatable, Codable {
    /// `started` events: logical requests that went to the engine's network path (deduplicated
    /// callers are not counted here; see `deduplicationsHit`).
    public let requestsStarted: Int
    /// `succeeded` events: requests that ended with a 2xx response.
    public let requestsSucceeded: Int
    /// `failed` events: requests that ended without success (a final non-2xx response, a
    /// transport failure, a timeout, a cancellation, an open circuit, an invalid request).
    public let requestsFailed: Int
    /// `retryScheduled` events; a request retried three times contributes 3.
    public let retriesScheduled: Int
    /// `deduplicated` events: callers that joined an identical request already in flight.
    public let deduplicationsHit: Int
    /// Sum of the durations of successful requests, in seconds (from `started` to the 2xx
    /// response, retries and backoff included, as the engine measures it).
    public let totalSuccessDuration: TimeInterval
    /// Percentiles of the durations of successful requests over every endpoint; `nil` before the
    /// first success.
    public let successDuration: DurationSummary?
    /// Completed requests by the HTTP status of their final response (successes and failures).
    public let statusCodes: [Int: Int]
    /// Failed requests that got no HTTP response, by reason (see `EndpointMetrics.failureReasons`).
    public let failureReasons: [String: Int]
    /// Per endpoint (method + path template), sorted by template then method. Endpoints with no
    /// events since the last reset are left out.
    public let endpoints: [EndpointMetrics]
    /// Requests started and not yet ended that the collector is tracking now (not reset by `reset()`).
    public let requestsInFlight: Int
    /// Requests the collector stopped tracking before their terminal event because more than
    /// `Configuration.maximumTrackedRequests` were in flight (or terminal events were never
    /// delivered); their terminal events are counted under `__unknown__`.
    public let evictedRequests: Int

    /// Mean duration of successful requests in seconds; `nil` until one has succeeded.
    public var averageSuccessDuration: TimeInterval? {
        requestsSucceeded > 0 ? totalSuccessDuration / TimeInterval(requestsSucceeded) : nil
    }

    /// Successes / (successes + failures); `nil` until a request has completed. Deduplicated
    /// callers and requests in flight are not part of it.
    public var successRate: Double? {
        let completed = requestsSucceeded + requestsFailed
        return completed > 0 ? Double(requestsSucceeded) / Double(completed) : nil
    }

    init(keys: [EndpointKey], rows: [EndpointAggregate], inFlight: Int, evicted: Int) {
        var total = EndpointAggregate()
        var endpoints: [EndpointMetrics] = []
        for (key, row) in zip(keys, rows) where row.hasActivity {
            total.add(row)
            endpoints.append(EndpointMetrics(key: key, aggregate: row))
        }
        endpoints.sort { ($0.template, $0.method) < ($1.template, $1.method) }
        requestsStarted = Int(clamping: total.started)
        requestsSucceeded = Int(clamping: total.succeeded)
        requestsFailed = Int(clamping: total.failed)
        retriesScheduled = Int(clamping: total.retries)
        deduplicationsHit = Int(clamping: total.deduplicated)
        totalSuccessDuration = DurationSummary.seconds(total.successNanoseconds)
        successDuration = DurationSummary(total.histogram)
        (statusCodes, failureReasons) = EndpointMetrics.split(total.outcomes)
        self.endpoints = endpoints
        requestsInFlight = inFlight
        evictedRequests = evicted
    }

    private enum CodingKeys: String, CodingKey {
        case requestsStarted, requestsSucceeded, requestsFailed, retriesScheduled, deduplicationsHit
        case totalSuccessDuration, successDuration, statusCodes, failureReasons, endpoints
        case requestsInFlight, evictedRequests, averageSuccessDuration, successRate
    }

    /// Decodes the stored fields (the derived ones, if present, are recomputed instead).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        requestsStarted = try container.decode(Int.self, forKey: .requestsStarted)
        requestsSucceeded = try container.decode(Int.self, forKey: .requestsSucceeded)
        requestsFailed = try container.decode(Int.self, forKey: .requestsFailed)
        retriesScheduled = try container.decode(Int.self, forKey: .retriesScheduled)
        deduplicationsHit = try container.decode(Int.self, forKey: .deduplicationsHit)
        totalSuccessDuration = try container.decode(TimeInterval.self, forKey: .totalSuccessDuration)
        successDuration = try container.decodeIfPresent(DurationSummary.self, forKey: .successDuration)
        statusCodes = try container.decode([Int: Int].self, forKey: .statusCodes)
        failureReasons = try container.decode([String: Int].self, forKey: .failureReasons)
        endpoints = try container.decode([EndpointMetrics].self, forKey: .endpoints)
        requestsInFlight = try container.decode(Int.self, forKey: .requestsInFlight)
        evictedRequests = try container.decode(Int.self, forKey: .evictedRequests)
    }

    /// Encodes every field, the derived `averageSuccessDuration` and `successRate` included.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(requestsStarted, forKey: .requestsStarted)
        try container.encode(requestsSucceeded, forKey: .requestsSucceeded)
        try container.encode(requestsFailed, forKey: .requestsFailed)
        try container.encode(retriesScheduled, forKey: .retriesScheduled)
        try container.encode(deduplicationsHit, forKey: .deduplicationsHit)
        try container.encode(totalSuccessDuration, forKey: .totalSuccessDuration)
        try container.encodeIfPresent(successDuration, forKey: .successDuration)
        try container.encode(statusCodes, forKey: .statusCodes)
        try container.encode(failureReasons, forKey: .failureReasons)
        try container.encode(endpoints, forKey: .endpoints)
        try container.encode(requestsInFlight, forKey: .requestsInFlight)
        try container.encode(evictedRequests, forKey: .evictedRequests)
        try container.encodeIfPresent(averageSuccessDuration, forKey: .averageSuccessDuration)
        try container.encodeIfPresent(successRate, forKey: .successRate)
    }
}
