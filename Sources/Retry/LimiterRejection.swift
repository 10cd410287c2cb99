/// Thrown by `ConcurrencyLimiter.withPermit` and `RateLimiter.withPermit` when a call is refused:
/// the operation was not run. A limiter never drops a call silently; it either runs it or throws
/// this (or `CancellationError` when the caller was cancelled while it waited).
///
/// `RequestEngine` maps it to `NetworkError.limited`.
public struct LimiterRejection: Error, Sendable, Hashable {
    /// Which limit refused the call, with what the caller needs to act on it.
    public enum Reason: Sendable, Hashable {
        /// `maxConcurrent` calls were running and `maxWaiting` callers were already in line.
        case concurrencyLimit(maxConcurrent: Int, maxWaiting: Int)
        /// No token was available (or none within the limiter's `maxWait`); `retryAfter` is the
        /// time until the next token, measured on the limiter's clock when the call was refused.
        case rateLimit(retryAfter: Duration)
    }

    public let reason: Reason

    public init(reason: Reason) {
        self.reason = reason
    }

    /// How long to wait before a new call can be admitted: the rate limiter's time to its next
    /// token; `nil` for a concurrency limit (it depends on when running calls end).
    public var retryAfter: Duration? {
        switch reason {
        case .rateLimit(let retryAfter): retryAfter
        case .concurrencyLimit: nil
        }
    }
}

extension LimiterRejection: CustomStringConvertible {
    public var description: String {
        switch reason {
        case .concurrencyLimit(let maxConcurrent, let maxWaiting):
            "concurrency limit reached (\(maxConcurrent) in flight, \(maxWaiting) waiting)"
        case .rateLimit(let retryAfter):
            "rate limit reached (next permit in \(retryAfter))"
        }
    }
}
