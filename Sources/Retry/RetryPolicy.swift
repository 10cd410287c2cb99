import Foundation

/// Decides whether, and after how long, a failed operation is tried again.
///
/// `attempt` is zero-based and counts retries: `delay(forAttempt: 0)` is the wait before the
/// first retry (the second call overall). Returning `nil` stops retrying.
///
/// Callers in this package treat the returned value defensively: a negative or NaN delay is
/// treated as zero and an infinite or huge delay is capped (see `RetryPolicyDelay`), so a
/// custom policy can never trap or hang the engine.
public protocol RetryPolicy: Sendable {
    /// The delay in seconds before retry number `attempt` (zero-based), or `nil` to give up.
    func delay(forAttempt attempt: Int) -> TimeInterval?
}

/// Retries at a fixed interval, up to `maxRetries` times.
public struct FixedIntervalRetryPolicy: RetryPolicy, Hashable {
    /// How many retries are allowed after the first call.
    public var maxRetries: Int
    /// Seconds between two calls.
    public var interval: TimeInterval

    /// - Parameters:
    ///   - maxRetries: retries after the first call (negative is treated as 0).
    ///   - interval: the wait between calls, in seconds.
    public init(maxRetries: Int = 3, interval: TimeInterval = 1.0) {
        self.maxRetries = max(0, maxRetries)
        self.interval = interval
    }

    public func delay(forAttempt attempt: Int) -> TimeInterval? {
        guard attempt >= 0, attempt < maxRetries else { return nil }
        return interval
    }
}

/// Never retries. Useful to switch retries off explicitly, e.g. for one engine in a test.
public struct NoRetryPolicy: RetryPolicy, Hashable {
    public init() {}
    public func delay(forAttempt attempt: Int) -> TimeInterval? { nil }
}

/// How delays coming from any `RetryPolicy` (including a user's own) are made safe to sleep on.
public enum RetryPolicyDelay {
    /// The longest delay the library will ever sleep for one retry unless configured otherwise: 5 minutes.
    public static let defaultMaximum: Duration = .seconds(300)

    /// Turns a policy's answer into a sleepable `Duration`: negative, zero or NaN → `.zero`,
    /// infinite or larger than `maximum` → `maximum`.
    public static func sanitized(_ seconds: TimeInterval, maximum: Duration = defaultMaximum) -> Duration {
        .clamped(seconds: seconds, upperBound: max(.zero, maximum))
    }
}
