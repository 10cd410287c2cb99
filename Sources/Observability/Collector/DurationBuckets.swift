import Foundation

/// The bucket boundaries of `http_client_request_duration_seconds`: OpenTelemetry's advised
/// explicit boundaries for `http.client.request.duration`, in seconds.
enum DurationBuckets {
    /// The finite upper bounds (`le`), ascending. A value v falls in the first bucket with v ≤ bound.
    static let upperBounds: [Double] = [0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]
    /// The `le` label values, in the same order, as Prometheus clients print them.
    static let labels = ["0", "0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1", "2.5", "5", "7.5", "10"]
    /// The finite buckets plus the one above the last bound (`+Inf` only).
    static let count = 16

    /// The bucket of a duration in seconds: 0 for zero, negative or NaN durations (counted as 0 s),
    /// 15 for durations above 10 s. The same as the first index `i` with `seconds <= upperBounds[i]`,
    /// written as a branch tree because it runs on every success.
    @inline(__always)
    static func index(of seconds: Double) -> Int {
        guard seconds > 0 else { return 0 }
        if seconds <= 0.1 {
            if seconds <= 0.025 { return seconds <= 0.005 ? 1 : (seconds <= 0.01 ? 2 : 3) }
            return seconds <= 0.05 ? 4 : (seconds <= 0.075 ? 5 : 6)
        }
        if seconds <= 1 { return seconds <= 0.25 ? 7 : (seconds <= 0.5 ? 8 : (seconds <= 0.75 ? 9 : 10)) }
        return seconds <= 2.5 ? 11 : (seconds <= 5 ? 12 : (seconds <= 7.5 ? 13 : (seconds <= 10 ? 14 : 15)))
    }

    /// A duration in whole nanoseconds: 0 for zero, negative or NaN; at most 2^62.
    @inline(__always)
    static func nanoseconds(_ seconds: TimeInterval) -> UInt64 {
        guard seconds > 0 else { return 0 }
        let nanoseconds = (seconds * 1e9).rounded()
        return nanoseconds < 4.6e18 ? UInt64(nanoseconds) : 1 << 62
    }
}
