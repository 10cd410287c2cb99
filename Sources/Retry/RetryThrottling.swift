@_spi(ResilienceCore) import ResilienceCore

/// Retry throttling in gRPC's form (proposal A6), per server: a token count that starts at
/// `maxTokens`; each failed attempt takes one token, each success gives `tokenRatio` back (never
/// above `maxTokens`); while the count is at or below half of `maxTokens`, no retry and no hedge
/// is sent. So when a server fails most calls, its clients stop multiplying the load within a few
/// failures, and start retrying again once it answers again.
///
/// Beside `RetryBudget`, which bounds retries against the traffic of the whole engine, this one
/// watches each server's own health. `RetryThrottle` is the counter for one server.
public struct RetryThrottling: Sendable, Equatable {
    /// The count's ceiling and start (gRPC allows 0 < maxTokens ≤ 1 000).
    public let maxTokens: Double
    /// Tokens a success gives back (gRPC allows 0 < tokenRatio, kept to three decimals).
    public let tokenRatio: Double

    /// A setting that cannot work, said at construction.
    public enum ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
        case maxTokensOutOfRange(Double)
        case tokenRatioOutOfRange(Double)

        public var description: String {
            switch self {
            case .maxTokensOutOfRange(let value): "maxTokens must be within (0, 1000] (\(value))"
            case .tokenRatioOutOfRange(let value): "tokenRatio must be positive and at most maxTokens (\(value))"
            }
        }
    }

    /// gRPC's usual settings, which cannot fail: 10 tokens, 0.1 back per success.
    public init() {
        maxTokens = 10
        tokenRatio = 0.1
    }

    /// - Throws: `ConfigurationError` for `maxTokens` outside (0, 1 000], or a `tokenRatio` that is
    ///   not positive, rounds to zero at three decimals, or exceeds `maxTokens`.
    public init(maxTokens: Double = 10, tokenRatio: Double = 0.1) throws(ConfigurationError) {
        guard maxTokens > 0, maxTokens <= 1_000 else { throw .maxTokensOutOfRange(maxTokens) }
        let ratio = (tokenRatio * 1_000).rounded(.down) / 1_000
        guard ratio > 0, ratio <= maxTokens else { throw .tokenRatioOutOfRange(tokenRatio) }
        self.maxTokens = maxTokens
        self.tokenRatio = ratio
    }
}

/// One server's token count under `RetryThrottling`. Lock-protected, so that every attempt to the
/// server can report to it without a suspension point.
public final class RetryThrottle: Sendable {
    public let throttling: RetryThrottling

    /// Kept in thousandths, so that ratios like 0.1 add up exactly.
    private let tokens: Locked<Int64>
    private let ceiling: Int64
    private let ratio: Int64

    public init(_ throttling: RetryThrottling) {
        self.throttling = throttling
        ceiling = Int64((throttling.maxTokens * 1_000).rounded())
        ratio = Int64((throttling.tokenRatio * 1_000).rounded())
        tokens = Locked(ceiling)
    }

    /// The count now.
    public var tokenCount: Double { Double(tokens.withLock { $0 }) / 1_000 }

    /// Whether the count is at `maxTokens` (nothing to remember).
    public var isFull: Bool { tokens.withLock { $0 >= ceiling } }

    /// Whether a retry or a hedge may be sent now: the count is above half of `maxTokens`.
    public var allowsRetry: Bool { tokens.withLock { $0 * 2 > ceiling } }

    /// An attempt to the server failed in a way that says it is unhealthy (the statuses and
    /// failures the engine retries).
    public func recordFailure() {
        tokens.withLock { $0 = max(0, $0 - 1_000) }
    }

    /// An attempt to the server succeeded (or failed in a way that says nothing about its health).
    public func recordSuccess() {
        let (ceiling, ratio) = (ceiling, ratio)
        tokens.withLock { $0 = min(ceiling, $0 + ratio) }
    }
}
