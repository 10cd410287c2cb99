import ResilienceCore

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
    private static let maxScaled: Int64 = 1 << 62

    private static func scaled(_ tokens: Double) -> Int64 {
        let value = (tokens * scale).rounded()
        return value >= Double(maxScaled) ? maxScaled : Int64(value)
    }

    private struct State {
        var balance: Int64
        var lastRefill: Duration
    }

    private let depositPerRequest: Int64
    private let capacity: Int64

    private let state: Locked<State>
    private let time: TimeSource

    /// - Parameters:
    ///   - retryRatio: tokens per request; negative or NaN is treated as 0.
    ///   - minRetriesPerSecond: tokens per second; negative or NaN is treated as 0.
    ///   - maxBalance: capacity and initial balance; at least 1.
    ///   - clock: the clock time deposits are measured on.
    public init(
        retryRatio: Double = 0.2,
        minRetriesPerSecond: Double = 10,
        maxBalance: Double = 100,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.retryRatio = retryRatio.isFinite ? max(0, retryRatio) : 0
        self.minRetriesPerSecond = minRetriesPerSecond.isFinite ? max(0, minRetriesPerSecond) : 0
        self.maxBalance = maxBalance.isFinite ? max(1, maxBalance) : 1
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
        state.balance = min(capacity, state.balance + Self.scaled(min(elapsed * minRetriesPerSecond, maxBalance)))
        state.lastRefill = now
    }
}
