@_spi(ResilienceCore) import ResilienceCore

/// A token bucket: at most `burst` calls at once after a quiet period, and `permitsPerSecond` calls
/// per second on average after that.
///
/// - The bucket starts full with `burst` tokens and gains one every `1 / permitsPerSecond`
///   seconds on the injected clock, up to `burst`. Each call takes one token.
/// - A call that finds no token is **refused at once** with
///   `LimiterRejection(reason: .rateLimit(retryAfter:))`, `retryAfter` being the time until a
///   token is available for it — unless `maxWait` is positive and a token is due within `maxWait`:
///   then the call reserves that token and sleeps on the clock until it is due. Waiting calls are
///   served in arrival order (each reserves the next token).
/// - A caller cancelled while it waits throws `CancellationError` and gives its reserved token
///   back. A caller already cancelled when it calls gets `CancellationError` and takes no token.
/// - A refused or cancelled call never runs its operation; an admitted call's token is spent
///   whatever the operation does (tokens measure starts, not completions).
///
/// Arithmetic is exact: the bucket is kept as the instant it will be full again, in whole
/// nanoseconds (the generic cell rate algorithm, equivalent to a token bucket), so no rounding
/// accumulates over refills.
///
/// Lock-based (no actor hop), so callers on any actor or none can share one.
public final class RateLimiter: Sendable {
    /// Tokens added per second, after clamping (see `init`).
    public let permitsPerSecond: Double
    /// The bucket's capacity and initial content; at least 1.
    public let burst: Int
    /// The longest a call waits for a token before being refused; `.zero` refuses at once.
    public let maxWait: Duration

    /// The longest interval between tokens (about 73 years): rates at or below zero get this.
    private static let maximumInterval: Int64 = .max / 4

    /// Nanoseconds per token; at least 1.
    private let interval: Int64
    /// `(burst - 1) × interval`, saturated: how far ahead of now the bucket may be drawn.
    private let tolerance: Int64
    private let maxWaitNanoseconds: Int64

    private struct State: Sendable {
        /// When the bucket is full again, in nanoseconds on `time` (the "theoretical arrival time").
        var fullAt: Int64
    }

    private let state: Locked<State>
    private let time: TimeSource

    /// - Parameters:
    ///   - permitsPerSecond: refill rate. NaN, negative or zero → 0 (the bucket never refills in
    ///     practice: one token per ~73 years); above 10⁹ or `+infinity` → 10⁹ (one per nanosecond).
    ///   - burst: capacity and initial tokens; values below 1 become 1.
    ///   - maxWait: how long a call may wait for a token; negative becomes zero (refuse at once),
    ///     very large values saturate at ~73 years.
    ///   - clock: the clock tokens are counted on and waits sleep on.
    public convenience init(
        permitsPerSecond: Double,
        burst: Int,
        maxWait: Duration = .zero,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.init(permitsPerSecond: permitsPerSecond, burst: burst, maxWait: maxWait, time: TimeSource(clock))
    }

    /// The same, on a clock already wrapped (the engine's, for its per-host limits).
    package init(permitsPerSecond: Double, burst: Int, maxWait: Duration, time: TimeSource) {
        let rate: Double = if permitsPerSecond.isNaN || permitsPerSecond <= 0 { 0 } else { min(1e9, permitsPerSecond) }
        self.permitsPerSecond = rate
        self.burst = max(1, burst)
        let nanosecondsPerToken = rate > 0 ? 1e9 / rate : .infinity
        let interval: Int64 =
            nanosecondsPerToken < Double(Self.maximumInterval)
            ? max(1, Int64(nanosecondsPerToken.rounded()))
            : Self.maximumInterval
        self.interval = interval
        let (tolerance, overflow) = Int64(self.burst - 1).multipliedReportingOverflow(by: interval)
        self.tolerance = overflow ? Self.maximumInterval : min(tolerance, Self.maximumInterval)
        self.maxWaitNanoseconds = min(max(0, maxWait.saturatingNanoseconds), Self.maximumInterval)
        self.maxWait = .nanoseconds(maxWaitNanoseconds)
        self.time = time
        self.state = Locked(State(fullAt: time.now().saturatingNanoseconds))
    }

    /// Whole tokens in the bucket now (0 ... `burst`; 0 also while waiting calls hold reservations).
    public var availablePermits: Int {
        let now = time.now().saturatingNanoseconds
        let debt = state.withLock { max(0, $0.fullAt - now) }
        let missing = debt / interval + (debt % interval == 0 ? 0 : 1)
        return max(0, burst - Int(clamping: missing))
    }

    /// Takes a token (waiting up to `maxWait` for one), then runs `operation`.
    ///
    /// Throws `LimiterRejection` (no token within `maxWait`) or `CancellationError` (cancelled
    /// before it got a token) without running `operation`; otherwise returns or rethrows what
    /// `operation` does.
    public func withPermit<T>(
        isolation: isolated (any Actor)? = #isolation,
        _ operation: () async throws -> T
    ) async throws -> T {
        try await acquire()
        return try await operation()
    }

    private enum Admission {
        case admitted
        case wait(nanoseconds: Int64)
        case rejected(retryAfter: Int64)
    }

    private func acquire() async throws {
        if Task.isCancelled { throw CancellationError() }
        let now = time.now().saturatingNanoseconds
        let admission = state.withLock { state -> Admission in
            let earliest = state.fullAt - tolerance  // the first instant a token is available
            if now >= earliest {
                state.fullAt = max(state.fullAt, now) + interval
                return .admitted
            }
            let wait = earliest - now
            guard wait <= maxWaitNanoseconds else { return .rejected(retryAfter: wait) }
            state.fullAt += interval  // reserve the next token; `fullAt > now` here
            return .wait(nanoseconds: wait)
        }
        switch admission {
        case .admitted:
            return
        case .rejected(let retryAfter):
            throw LimiterRejection(reason: .rateLimit(retryAfter: .nanoseconds(retryAfter)))
        case .wait(let nanoseconds):
            do {
                try await time.sleep(.nanoseconds(nanoseconds))
            } catch {
                // Cancelled while waiting: give the reserved token back (later reservations keep
                // theirs; the bucket simply holds one token more).
                let interval = interval
                state.withLock { $0.fullAt -= interval }
                throw CancellationError()
            }
        }
    }
}
