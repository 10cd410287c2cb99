import Foundation

/// Exponential backoff: `baseDelay × multiplier^attempt`, capped at `maxDelay`, with optional jitter.
///
/// With the defaults (`maxRetries: 3, baseDelay: 1.0`, multiplier 2, no jitter) the delays are
/// 1 s, 2 s, 4 s, then `nil` — the schedule the published SwiftResilience API documents.
///
/// Jitter follows AWS's "Exponential Backoff and Jitter". With `e = min(maxDelay, baseDelay × multiplier^attempt)`:
/// - `.none`: exactly `e`.
/// - `.full`: uniformly random in `0 ... e`.
/// - `.equal`: `e/2` plus a random part in `0 ... e/2`.
/// - `.decorrelated`: uniformly random in `baseDelay ... min(maxDelay, 3 × p)`, where `p` is the
///   un-jittered delay of the previous attempt (`baseDelay` for the first retry). The policy is a
///   value without memory, so "previous" is the schedule's, not the last random draw.
///
/// Every delay lies in `0 ... maxDelay`. Out-of-range parameters are normalised at init: a negative
/// `maxRetries` means no retries, an infinite `maxDelay` means the largest finite one, a negative or non-finite `baseDelay` means 0, a `multiplier`
/// below 1 or non-finite means 1, a negative or NaN `maxDelay` means 0.
public struct ExponentialRetryPolicy: RetryPolicy, Hashable {
    /// How the computed delay is randomised to spread out clients that failed together.
    public enum Jitter: String, Sendable, Hashable, CaseIterable, Codable {
        case none, full, equal, decorrelated
    }

    /// Retries allowed after the first call.
    public let maxRetries: Int
    /// The delay before the first retry, in seconds.
    public let baseDelay: TimeInterval
    /// Growth factor between retries.
    public let multiplier: Double
    /// Upper bound for any single delay, in seconds.
    public let maxDelay: TimeInterval
    /// Randomisation applied to each delay.
    public let jitter: Jitter

    public init(
        maxRetries: Int = 3,
        baseDelay: TimeInterval = 1.0,
        multiplier: Double = 2.0,
        maxDelay: TimeInterval = 60,
        jitter: Jitter = .none
    ) {
        self.maxRetries = max(0, maxRetries)
        self.baseDelay = baseDelay.isFinite ? max(0, baseDelay) : 0
        self.multiplier = multiplier.isFinite ? max(1, multiplier) : 1
        self.maxDelay = maxDelay.isNaN ? 0 : min(max(0, maxDelay), .greatestFiniteMagnitude)
        self.jitter = jitter
    }

    public func delay(forAttempt attempt: Int) -> TimeInterval? {
        var generator = SystemRandomNumberGenerator()
        return delay(forAttempt: attempt, using: &generator)
    }

    /// The delay for `attempt`, drawing jitter from `generator` (seed it in tests for repeatable draws).
    public func delay<G: RandomNumberGenerator>(forAttempt attempt: Int, using generator: inout G) -> TimeInterval? {
        guard attempt >= 0, attempt < maxRetries else { return nil }
        let exponential = exponentialDelay(forAttempt: attempt)
        switch jitter {
        case .none:
            return exponential
        case .full:
            return Double.random(in: 0...exponential, using: &generator)
        case .equal:
            return exponential / 2 + Double.random(in: 0...(exponential / 2), using: &generator)
        case .decorrelated:
            let previous = attempt == 0 ? baseDelay : exponentialDelay(forAttempt: attempt - 1)
            let lower = min(baseDelay, maxDelay)
            let upper = max(lower, min(maxDelay, previous * 3))
            return Double.random(in: lower...upper, using: &generator)
        }
    }

    /// `min(maxDelay, baseDelay × multiplier^attempt)` without overflow.
    private func exponentialDelay(forAttempt attempt: Int) -> TimeInterval {
        guard baseDelay > 0 else { return 0 }
        let grown = baseDelay * pow(multiplier, Double(attempt))
        return grown.isFinite ? min(maxDelay, grown) : maxDelay
    }
}
