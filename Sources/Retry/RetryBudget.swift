@_spi(ResilienceCore) import ResilienceCore

/// A token bucket that bounds how much extra load retries may add, shared by every request of an
/// engine (the scheme of Finagle's RetryBudget and gRPC's retry throttling).
///
/// Each original request deposits `retryRatio` tokens; time deposits `minRetriesPerSecond` tokens
/// per second; each retry withdraws one token and is refused when less than one is left. The
/// balance never exceeds `maxBalance`. So over any period, retries are at most
/// `retryRatio × requests + minRetriesPerSecond × seconds + maxBalance` — during an outage the
/// retry traffic stays a fraction of the real traffic instead of multiplying it.
///
/// The bucket starts full. It is a lock-protected class (not an actor) because every request of
/// the engine touches it and it must not add a suspension point to the request path.
public final class RetryBudget: Sendable {
    /// Tokens deposited per original request (0.2: retries add at most 20 %).
    public let retryRatio: Double
    /// Tokens deposited per second regardless of traffic, so a quiet client can still retry.
    public let minRetriesPerSecond: Double
    /// The most tokens the bucket holds, which is also the largest burst of retries.
    public let maxBalance: Double

    /// Balances are kept in whole micro-tokens so that deposits like 0.2 or 0.1 s × 1/s add up
    /// exactly (ten deposits of 0.2 make 2 tokens, not 1.9999999999999996).
    private static let scale: Double = 1_000_000

    /// The largest value of each setting: 10¹² tokens (10¹⁸ micro-tokens), so that the balance
    /// plus any one deposit (each at most this) stays far below `Int64.max`.
    static let largestSetting: Double = 1e12

    /// `tokens` (within 0…`largestSetting`) in micro-tokens.
    private static func scaled(_ tokens: Double) -> Int64 {
        Int64((min(tokens, largestSetting) * scale).rounded())
    }

    /// A setting as used: NaN or infinite → `nonFinite`, below `low` → `low`, above 10¹² → 10¹².
    private static func setting(_ value: Double, atLeast low: Double, nonFinite: Double) -> Double {
        value.isFinite ? min(largestSetting, max(low, value)) : nonFinite
    }

    private struct State {
        var balance: Int64
        var lastRefill: Duration
    }

    private let depositPerRequest: Int64
    private let capacity: Int64

    private let state: Locked<State>
    private let time: TimeSource

    /// Every value is accepted; each setting is clamped to what the bucket can count, and the
    /// properties hold what is used.
    ///
    /// - Parameters:
    ///   - retryRatio: tokens per request; negative, NaN or infinite is treated as 0, above 10¹²
    ///     as 10¹².
    ///   - minRetriesPerSecond: tokens per second; negative, NaN or infinite is treated as 0,
    ///     above 10¹² as 10¹².
    ///   - maxBalance: capacity and initial balance; at least 1 (NaN or infinite: 1), at most 10¹².
    ///   - clock: the clock time deposits are measured on.
    public init(
        retryRatio: Double = 0.2,
        minRetriesPerSecond: Double = 10,
        maxBalance: Double = 100,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.retryRatio = Self.setting(retryRatio, atLeast: 0, nonFinite: 0)
        self.minRetriesPerSecond = Self.setting(minRetriesPerSecond, atLeast: 0, nonFinite: 0)
        self.maxBalance = Self.setting(maxBalance, atLeast: 1, nonFinite: 1)
        self.depositPerRequest = Self.scaled(self.retryRatio)
        self.capacity = Self.scaled(self.maxBalance)
        let time = TimeSource(clock)
        self.time = time
        self.state = Locked(State(balance: capacity, lastRefill: time.now()))
    }

    /// Records an original (non-retry) request.
    public func recordRequest() {
        let now = time.now()
        state.withLock { state in
            refill(&state, now: now)
            state.balance = min(capacity, state.balance + depositPerRequest)
        }
    }

    /// Asks to spend one token for a retry; `false` means the budget is exhausted and the caller
    /// should give up instead of retrying.
    public func tryWithdraw() -> Bool {
        let now = time.now()
        return state.withLock { state in
            refill(&state, now: now)
            guard state.balance >= Self.scaled(1) else { return false }
            state.balance -= Self.scaled(1)
            return true
        }
    }

    /// The tokens available now.
    public var balance: Double {
        let now = time.now()
        return state.withLock { state in
            refill(&state, now: now)
            return Double(state.balance) / Self.scale
        }
    }

    private func refill(_ state: inout State, now: Duration) {
        guard now > state.lastRefill else { return }
        let elapsed = (now - state.lastRefill).seconds
        // Each addend is at most 10¹⁸ micro-tokens (`largestSetting`): the sum cannot overflow.
        state.balance = min(capacity, state.balance + Self.scaled(min(elapsed * minRetriesPerSecond, maxBalance)))
        state.lastRefill = now
    }
}
