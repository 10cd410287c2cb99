import Foundation

/// Percentiles of the durations of successful requests, in seconds, from a log-linear histogram:
/// each reported percentile is within 1 % (at most 0.79 %) of the exact nearest-rank percentile
/// of the recorded durations. `minimum` and `maximum` are exact (to the nanosecond). Durations
/// longer than about 2 h 26 min are counted as that.
public struct DurationSummary: Sendable, Equatable, Codable {
    /// How many durations the summary covers (the successes).
    public let count: Int
    /// The shortest duration.
    public let minimum: TimeInterval
    /// The longest duration.
    public let maximum: TimeInterval
    /// The median (nearest rank).
    public let p50: TimeInterval
    /// The 95th percentile (nearest rank).
    public let p95: TimeInterval
    /// The 99th percentile (nearest rank).
    public let p99: TimeInterval

    /// A summary with the given values (for tests and decoding).
    public init(count: Int, minimum: TimeInterval, maximum: TimeInterval, p50: TimeInterval, p95: TimeInterval, p99: TimeInterval) {
        self.count = count
        self.minimum = minimum
        self.maximum = maximum
        self.p50 = p50
        self.p95 = p95
        self.p99 = p99
    }

    init?(_ histogram: LogLinearHistogram) {
        guard histogram.count > 0,
            let p50 = histogram.percentile(0.50),
            let p95 = histogram.percentile(0.95),
            let p99 = histogram.percentile(0.99)
        else { return nil }
        self.init(
            count: Int(clamping: histogram.count),
            minimum: Self.seconds(histogram.minimum),
            maximum: Self.seconds(histogram.maximum),
            p50: Self.seconds(p50),
            p95: Self.seconds(p95),
            p99: Self.seconds(p99)
        )
    }

    static func seconds(_ nanoseconds: UInt64) -> TimeInterval {
        Double(nanoseconds) / 1e9
    }
}
