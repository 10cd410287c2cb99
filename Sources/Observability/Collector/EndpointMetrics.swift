import Foundation

/// What a `RequestMetricsCollector` counted for one endpoint (method + path template), part of
/// `RequestMetrics`. Encodes to JSON with the derived `averageSuccessDuration` and `successRate`
/// included.
public struct EndpointMetrics: Sendable, Equatable, Codable {
    /// `GET`, `POST`, …; `UNKNOWN` for the `__unknown__` row.
    public let method: String
    /// The path template, e.g. `/users/{id}`; `__other__` for requests past the endpoint cap,
    /// `__unknown__` for terminal events whose `started` was not seen (or was evicted).
    public let template: String
    /// `started` events: logical requests sent (deduplicated callers are not counted here).
    public let requestsStarted: Int
    /// `succeeded` events.
    public let requestsSucceeded: Int
    /// `failed` events (including cancellations).
    public let requestsFailed: Int
    /// `retryScheduled` events.
    public let retriesScheduled: Int
    /// `deduplicated` events: callers that joined an identical request in flight.
    public let deduplicationsHit: Int
    /// Sum of the durations of successful requests, in seconds.
    public let totalSuccessDuration: TimeInterval
    /// Percentiles of the durations of successful requests; `nil` before the first success.
    public let successDuration: DurationSummary?
    /// Completed requests by the HTTP status of their final response, successes and failures.
    public let statusCodes: [Int: Int]
    /// Failed requests that got no HTTP response, by reason: `no_connection`, `timed_out`,
    /// `cancelled`, `cannot_connect`, `connection_lost`, `dns_failure`, `tls_failure`,
    /// `invalid_response`, `circuit_open`, `invalid_request`, `other`.
    public let failureReasons: [String: Int]

    /// Mean duration of successful requests in seconds; `nil` before the first success.
    public var averageSuccessDuration: TimeInterval? {
        requestsSucceeded > 0 ? totalSuccessDuration / TimeInterval(requestsSucceeded) : nil
    }

    /// Successes / (successes + failures); `nil` before the first completed request.
    public var successRate: Double? {
        let completed = requestsSucceeded + requestsFailed
        return completed > 0 ? Double(requestsSucceeded) / Double(completed) : nil
    }

    init(key: EndpointKey, aggregate: EndpointAggregate) {
        method = key.method
        template = key.template
        requestsStarted = Int(clamping: aggregate.started)
        requestsSucceeded = Int(clamping: aggregate.succeeded)
        requestsFailed = Int(clamping: aggregate.failed)
        retriesScheduled = Int(clamping: aggregate.retries)
        deduplicationsHit = Int(clamping: aggregate.deduplicated)
        totalSuccessDuration = DurationSummary.seconds(aggregate.successNanoseconds)
        successDuration = DurationSummary(aggregate.histogram)
        (statusCodes, failureReasons) = Self.split(aggregate.outcomes)
    }

    /// Outcome counts split into HTTP statuses and failure reasons.
    static func split(_ outcomes: [OutcomeKey: UInt64]) -> ([Int: Int], [String: Int]) {
        var statusCodes: [Int: Int] = [:]
        var reasons: [String: Int] = [:]
        for (key, count) in outcomes {
            if let status = key.httpStatus {
                statusCodes[status, default: 0] += Int(clamping: count)
            } else if let reason = key.reason {
                reasons[reason, default: 0] += Int(clamping: count)
            }
        }
        return (statusCodes, reasons)
    }

    private enum CodingKeys: String, CodingKey {
        case method, template, requestsStarted, requestsSucceeded, requestsFailed, retriesScheduled
        case deduplicationsHit, totalSuccessDuration, successDuration, statusCodes, failureReasons
        case averageSuccessDuration, successRate
    }

    /// Decodes the stored fields (the derived ones, if present, are recomputed instead).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        method = try container.decode(String.self, forKey: .method)
        template = try container.decode(String.self, forKey: .template)
        requestsStarted = try container.decode(Int.self, forKey: .requestsStarted)
        requestsSucceeded = try container.decode(Int.self, forKey: .requestsSucceeded)
        requestsFailed = try container.decode(Int.self, forKey: .requestsFailed)
        retriesScheduled = try container.decode(Int.self, forKey: .retriesScheduled)
        deduplicationsHit = try container.decode(Int.self, forKey: .deduplicationsHit)
        totalSuccessDuration = try container.decode(TimeInterval.self, forKey: .totalSuccessDuration)
        successDuration = try container.decodeIfPresent(DurationSummary.self, forKey: .successDuration)
        statusCodes = try container.decode([Int: Int].self, forKey: .statusCodes)
        failureReasons = try container.decode([String: Int].self, forKey: .failureReasons)
    }

    /// Encodes every field, the derived `averageSuccessDuration` and `successRate` included.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(method, forKey: .method)
        try container.encode(template, forKey: .template)
        try container.encode(requestsStarted, forKey: .requestsStarted)
        try container.encode(requestsSucceeded, forKey: .requestsSucceeded)
        try container.encode(requestsFailed, forKey: .requestsFailed)
        try container.encode(retriesScheduled, forKey: .retriesScheduled)
        try container.encode(deduplicationsHit, forKey: .deduplicationsHit)
        try container.encode(totalSuccessDuration, forKey: .totalSuccessDuration)
        try container.encodeIfPresent(successDuration, forKey: .successDuration)
        try container.encode(statusCodes, forKey: .statusCodes)
        try container.encode(failureReasons, forKey: .failureReasons)
        try container.encodeIfPresent(averageSuccessDuration, forKey: .averageSuccessDuration)
        try container.encodeIfPresent(successRate, forKey: .successRate)
    }
}
