import RequestEngine

/// The Prometheus text exposition format (version 0.0.4) that
/// `RequestMetricsCollector.prometheusText()` produces.
///
/// Metric families, each with `# HELP` and `# TYPE` lines, one series per active endpoint:
/// - `http_client_requests_total` (counter): completed requests, labels `method`, `endpoint`
///   (the path template), `status` (the final HTTP status code, or a failure reason such as
///   `timed_out` when there was no response) and `outcome` (`success` or `failure`);
/// - `http_client_request_duration_seconds` (histogram): durations of successful requests with
///   OpenTelemetry's advised buckets 0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1,
///   2.5, 5, 7.5, 10 s and `+Inf`, plus `_sum` and `_count`; labels `method`, `endpoint`;
/// - `http_client_requests_started_total`, `http_client_retries_total`,
///   `http_client_deduplicated_requests_total` (counters): labels `method`, `endpoint`;
/// - per host (label `host`: host and port): `http_client_host_concurrency_limit`,
///   `http_client_host_in_flight`, `http_client_host_waiting` (gauges, for engines exported with
///   `RequestMetricsCollector.exportAdaptiveLimits(of:)`) and `http_client_retries_throttled_total`
///   (counter), each only once there is something to show.
///
/// Label values are escaped as the format requires (backslash, double quote, line feed). Series
/// are sorted by endpoint, method and status, so two scrapes list them in the same order.
public enum PrometheusTextFormat {
    /// The `Content-Type` to serve the text with: `text/plain; version=0.0.4; charset=utf-8`.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    /// `value` escaped for use between the double quotes of a label value.
    public static func escapeLabelValue(_ value: String) -> String {
        guard value.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\n") }) else {
            return value
        }
        var escaped = ""
        escaped.reserveCapacity(value.utf8.count + 8)
        for character in value.unicodeScalars {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"": escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.unicodeScalars.append(character)
            }
        }
        return escaped
    }

    static func render(keys: [EndpointKey], rows: [EndpointAggregate]) -> String {
        let active = zip(keys, rows)
            .filter { $0.1.hasActivity }
            .sorted { ($0.0.template, $0.0.method) < ($1.0.template, $1.0.method) }
            .map { (labels: "method=\"\(escapeLabelValue($0.0.method))\",endpoint=\"\(escapeLabelValue($0.0.template))\"", row: $0.1) }

        var text = ""
        text.reserveCapacity(256 + active.count * 2048)

        family(
            &text, "http_client_requests_total", "counter",
            "Completed HTTP client requests by method, endpoint template, final status (HTTP status code, or failure reason when there was no response) and outcome.")
        for (labels, row) in active {
            for (key, count) in row.outcomes.sorted(by: { $0.key < $1.key }) where count > 0 {
                text += "http_client_requests_total{\(labels),status=\"\(key.statusLabel)\",outcome=\"\(key.outcomeLabel)\"} \(count)\n"
            }
        }

        family(
            &text, "http_client_request_duration_seconds", "histogram",
            "Duration of successful HTTP client requests in seconds, from start to the 2xx response, retries and backoff included.")
        for (labels, row) in active {
            var cumulative: UInt64 = 0
            for (index, bound) in DurationBuckets.labels.enumerated() {
                cumulative &+= row.durationBuckets[index]
                text += "http_client_request_duration_seconds_bucket{\(labels),le=\"\(bound)\"} \(cumulative)\n"
            }
            text += "http_client_request_duration_seconds_bucket{\(labels),le=\"+Inf\"} \(row.succeeded)\n"
            text += "http_client_request_duration_seconds_sum{\(labels)} \(formatSeconds(row.successNanoseconds))\n"
            text += "http_client_request_duration_seconds_count{\(labels)} \(row.succeeded)\n"
        }

        family(
            &text, "http_client_requests_started_total", "counter",
            "HTTP client requests started (deduplicated callers excluded) by method and endpoint template.")
        for (labels, row) in active {
            text += "http_client_requests_started_total{\(labels)} \(row.started)\n"
        }

        family(
            &text, "http_client_retries_total", "counter",
            "Retries scheduled by method and endpoint template.")
        for (labels, row) in active {
            text += "http_client_retries_total{\(labels)} \(row.retries)\n"
        }

        family(
            &text, "http_client_deduplicated_requests_total", "counter",
            "Callers that joined an identical request already in flight instead of sending their own, by method and endpoint template.")
        for (labels, row) in active {
            text += "http_client_deduplicated_requests_total{\(labels)} \(row.deduplicated)\n"
        }
        return text
    }

    /// The per-host families: adaptive limits (gauges) of the engines exported with
    /// `RequestMetricsCollector.exportAdaptiveLimits(of:)`, and retries refused by each host's
    /// retry throttle (a counter). Nothing when there is nothing to say.
    static func renderHosts(limits: [HostAdaptiveLimit], throttledRetries: [String: UInt64]) -> String {
        var text = ""
        if !limits.isEmpty {
            let sorted = limits.sorted { $0.host < $1.host }  // one row per host
            for (name, help, value) in [
                ("http_client_host_concurrency_limit", "The adaptive concurrency limit of each host: attempts allowed in flight at once.", \HostAdaptiveLimit.limit),
                ("http_client_host_in_flight", "Attempts holding a place in each host's adaptive limit.", \HostAdaptiveLimit.inFlight),
                ("http_client_host_waiting", "Attempts waiting for a place in each host's adaptive limit.", \HostAdaptiveLimit.waiting),
            ] {
                family(&text, name, "gauge", help)
                for entry in sorted { text += "\(name){host=\"\(escapeLabelValue(entry.host))\"} \(entry[keyPath: value])\n" }
            }
        }
        if !throttledRetries.isEmpty {
            family(
                &text, "http_client_retries_throttled_total", "counter",
                "Retries not sent because the host's retry throttle (gRPC's token count) was at or below half.")
            for (host, count) in throttledRetries.sorted(by: { $0.key < $1.key }) {
                text += "http_client_retries_throttled_total{host=\"\(escapeLabelValue(host))\"} \(count)\n"
            }
        }
        return text
    }

    private static func family(_ text: inout String, _ name: String, _ type: String, _ help: String) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }

    /// Nanoseconds as decimal seconds, exactly (`1.5`, `0.000250001`, `0`).
    static func formatSeconds(_ nanoseconds: UInt64) -> String {
        let whole = nanoseconds / 1_000_000_000
        let fraction = nanoseconds % 1_000_000_000
        guard fraction > 0 else { return String(whole) }
        var digits = String(fraction)
        digits = String(repeating: "0", count: 9 - digits.count) + digits
        while digits.hasSuffix("0") { digits.removeLast() }
        return "\(whole).\(digits)"
    }
}

/// One host's adaptive concurrency limit at a moment, summed over the engines that share the host
/// (`AsyncRequestEngine.Configuration.limits.adaptiveConcurrencyPerHost`): what the collector's text and the
/// swift-metrics sink export.
public struct HostAdaptiveLimit: Sendable, Equatable {
    /// Host and port, as `CircuitBreakerRegistry.authority(of:)` writes them.
    public var host: String
    public var limit: Int
    public var inFlight: Int
    public var waiting: Int

    public init(host: String, limit: Int, inFlight: Int, waiting: Int) {
        self.host = host
        self.limit = limit
        self.inFlight = inFlight
        self.waiting = waiting
    }

    /// Every host's adaptive limit over `engines`, one row per host, sorted by host.
    public static func summed(_ engines: [AsyncRequestEngine]) -> [HostAdaptiveLimit] {
        var rows: [String: HostAdaptiveLimit] = [:]
        for engine in engines {
            for (host, limiter) in engine.adaptiveConcurrencyLimiters {
                var row = rows[host] ?? HostAdaptiveLimit(host: host, limit: 0, inFlight: 0, waiting: 0)
                row.limit += limiter.currentLimit
                row.inFlight += limiter.inFlight
                row.waiting += limiter.waiting
                rows[host] = row
            }
        }
        return rows.values.sorted { $0.host < $1.host }
    }
}
