import Foundation

/// Hedged requests (Dean and Barroso, "The Tail at Scale"): when an attempt has not answered after
/// `delay`, the engine sends the same request again beside it, up to `maxAttempts` copies in
/// flight; the first acceptable answer wins and the others are cancelled.
///
/// Set it as `AsyncRequestEngine.Configuration.hedging`. It applies only to requests that are safe to
/// send twice: GET, HEAD and OPTIONS, or any request carrying an `Idempotency-Key` header. Rules
/// (Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md, "Hedging"):
/// - An answer is **acceptable** unless it is a retryable failure (a 5xx other than 501, 408, 429,
///   a timeout or a transport failure) or a limiter's refusal; an acceptable one ends the race at
///   once, whatever the copies still in flight. When every copy sent has failed and more are
///   allowed, the next is sent at once instead of after `delay`; when none is left, the last
///   failure is the attempt's result (and may be retried like any other).
/// - Each copy after the first draws a token from the engine's `RetryBudget`, the same budget
///   retries draw from (gRPC's throttling rule): with the budget empty, no copy is sent, so an
///   overloaded server is not hedged into the ground.
/// - The copies are one engine attempt: they share its timeout, its total deadline and its
///   circuit-breaker permit. Each copy takes its own place under `maxConcurrentPerHost`.
/// - A copy is reported to a sink that conforms to `HedgingEventSink`; `RequestEvent` is
///   unchanged, so exhaustive switches over it keep compiling.
public struct HedgingPolicy: Sendable, Hashable {
    /// How long an attempt may go unanswered before the next copy is sent (zero to about 146
    /// billion years: longer values are capped, so no clock is asked to sleep past its range).
    public let delay: Duration
    /// Copies of one attempt allowed in flight, the first included: 1 (no hedging) to 10.
    public let maxAttempts: Int

    /// - Parameters:
    ///   - delay: the wait before each further copy; negative values become zero, huge ones are
    ///     capped. A good value is the endpoint's p95 latency: about 5 % of requests are then hedged.
    ///   - maxAttempts: copies allowed in flight, the first included; clamped to 1...10.
    public init(delay: Duration, maxAttempts: Int = 2) {
        self.delay = min(max(.zero, delay), .seconds(Int64.max / 2))
        self.maxAttempts = min(10, max(1, maxAttempts))
    }
}

/// A hedge: a further copy of an attempt, sent because the earlier ones had not answered
/// acceptably.
public struct HedgeEvent: Sendable, Hashable {
    /// The logical request's trace id (as in its `RequestEvent`s).
    public let traceID: UUID
    /// The zero-based engine attempt the copy belongs to.
    public let attempt: Int
    /// Which copy: 1 for the first hedge (the second copy in flight), 2 for the next, ...
    public let copy: Int
    /// Seconds since the attempt's first copy was sent.
    public let after: TimeInterval

    public init(traceID: UUID, attempt: Int, copy: Int, after: TimeInterval) {
        self.traceID = traceID
        self.attempt = attempt
        self.copy = copy
        self.after = after
    }
}

/// An event sink that also wants to hear of hedges. The engine checks its `eventSink` for this
/// conformance once, at init; a sink without it hears nothing of hedges.
public protocol HedgingEventSink: RequestEventSink {
    func recordHedge(_ event: HedgeEvent) async
}

/// A retry the host's retry throttle refused (`AsyncRequestEngine.Configuration.retry.throttling`): the
/// request ended with the failure of `attempt` instead of retrying it.
public struct RetryThrottledEvent: Sendable, Hashable {
    /// The logical request's trace id (as in its `RequestEvent`s).
    public let traceID: UUID
    /// The request's URL (never headers or a body).
    public let url: URL
    /// The zero-based attempt whose failure was not retried.
    public let attempt: Int

    public init(traceID: UUID, url: URL, attempt: Int) {
        self.traceID = traceID
        self.url = url
        self.attempt = attempt
    }
}

/// An event sink that also hears of throttled retries, so they can be counted. The engine reports
/// a throttled request's end as usual too (`failed`).
public protocol RetryThrottlingEventSink: RequestEventSink {
    func recordRetryThrottled(_ event: RetryThrottledEvent) async
}
