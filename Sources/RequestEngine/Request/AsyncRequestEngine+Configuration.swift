import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

extension AsyncRequestEngine {
    /// Everything an engine does beyond sending, in one value grouped by strategy (the shape of
    /// AsyncHTTPClient's `HTTPClient.Configuration`). The default retries nothing, opens no
    /// breaker, limits no host, hedges nothing, sets no deadline, caps response bodies at 16 MiB
    /// and shares identical concurrent GET, HEAD and OPTIONS calls.
    ///
    /// ```swift
    /// var configuration = AsyncRequestEngine.Configuration()
    /// configuration.retry = .init(policy: ExponentialRetryPolicy(maxRetries: 3), budget: RetryBudget())
    /// configuration.circuitBreaker = .perHost(CircuitBreakerRegistry())
    /// configuration.limits.concurrencyPerHost = 8
    /// configuration.deadline = .seconds(10)
    /// let engine = AsyncRequestEngine(configuration: configuration)
    /// ```
    ///
    /// An attempt's timeout is the request's own (`NetworkRequest.timeout`); `deadline` bounds the
    /// whole request. Values out of range are taken at the nearest valid one when the engine is
    /// made (negative retry waits, sizes and wait lines as zero, a concurrency limit below 1 as 1;
    /// a deadline of zero or less fails a request at once).
    public struct Configuration: Sendable {
        /// Whether, when and how often a failed request is sent again. Default: never.
        public var retry: RetryStrategy
        /// A breaker that fails sends fast while a dependency is down. Default: none.
        public var circuitBreaker: CircuitBreakerScope
        /// Per-host limits on attempts in flight and their rate. Default: none.
        public var limits: Limits
        /// Hedged attempts for idempotent requests (`HedgingPolicy`). Default `nil`: none.
        public var hedging: HedgingPolicy?
        /// The longest a whole request may take — attempts, backoffs and waits for a permit —
        /// on the engine's clock from `send`; past it the request fails with
        /// `NetworkError.deadlineExceeded`. A retry whose delay would end past it is not scheduled
        /// (the last failure is returned, as when the retry budget is empty). A request's own
        /// `NetworkRequest.deadline` replaces it. Default `nil`: no deadline.
        public var deadline: Duration?
        /// The largest response body accepted, in bytes; a larger one fails with
        /// `NetworkError.responseTooLarge(limit:)` (not retried). Default 16 MiB; `nil` for no
        /// limit. A request's own `maximumResponseBodySize` replaces it. `URLSessionTransport`
        /// (the default session) stops the transfer as soon as the limit is crossed; other
        /// sessions may check only once the body has arrived (`NetworkSession.data(for:maximumBodySize:)`).
        public var maximumResponseBodySize: Int?
        /// Methods whose identical concurrent requests share one call. Default GET, HEAD, OPTIONS.
        public var deduplicatedMethods: Set<HTTPMethod>
        /// Receives `RequestEvent`s (and hedge and throttling events when it conforms to
        /// `HedgingEventSink` or `RetryThrottlingEventSink`). Default `nil`: nothing is emitted,
        /// at no cost.
        public var eventSink: (any RequestEventSink)?

        /// The default `maximumResponseBodySize`: 16 MiB.
        public static let defaultMaximumResponseBodySize = 16 * 1024 * 1024

        public init(
            retry: RetryStrategy = RetryStrategy(policy: nil),
            circuitBreaker: CircuitBreakerScope = .none,
            limits: Limits = Limits(),
            hedging: HedgingPolicy? = nil,
            deadline: Duration? = nil,
            maximumResponseBodySize: Int? = Configuration.defaultMaximumResponseBodySize,
            deduplicatedMethods: Set<HTTPMethod> = [.get, .head, .options],
            eventSink: (any RequestEventSink)? = nil
        ) {
            self.retry = retry
            self.circuitBreaker = circuitBreaker
            self.limits = limits
            self.hedging = hedging
            self.deadline = deadline
            self.maximumResponseBodySize = maximumResponseBodySize
            self.deduplicatedMethods = deduplicatedMethods
            self.eventSink = eventSink
        }

        /// The values an engine runs with: each taken at the nearest valid one.
        var sanitized: Configuration {
            var copy = self
            copy.retry.maximumDelay = max(.zero, retry.maximumDelay)
            if case .honored(let atMost) = retry.retryAfter { copy.retry.retryAfter = .honored(atMost: max(.zero, atMost)) }
            copy.maximumResponseBodySize = maximumResponseBodySize.map { max(0, $0) }
            copy.limits.concurrencyPerHost = limits.concurrencyPerHost.map { max(1, $0) }
            copy.limits.waitingPerHost = max(0, limits.waitingPerHost)
            return copy
        }
    }

    /// When a failed request is sent again, and what bounds the retries.
    ///
    /// Retries happen only for `NetworkError.isRetryable` failures, only while `policy` returns a
    /// delay, only while `budget` and the host's `throttling` allow, and for POST/PATCH only when
    /// the request carries an `Idempotency-Key` header.
    public struct RetryStrategy: Sendable {
        /// When and how long to wait before retrying; `nil` never retries.
        public var policy: (any RetryPolicy)?
        /// Caps retries (and hedges) across all requests of the engine; `nil` means no cap.
        public var budget: RetryBudget?
        /// Retry throttling per host, in gRPC's form (`RetryThrottling`): each attempt that fails
        /// in a way the engine would retry takes a token from its host's count, each other answer
        /// gives `tokenRatio` back, and while the count is at or below half, no retry and no hedge
        /// goes to that host — the request ends with its last failure, and a sink conforming to
        /// `RetryThrottlingEventSink` hears of it. `nil`: no throttling.
        public var throttling: RetryThrottling?
        /// What a valid `Retry-After` on 429 and 503 does. Default: it replaces the policy's
        /// delay, capped at 60 s.
        public var retryAfter: RetryAfterPolicy
        /// Longest wait taken from the policy (longer, infinite or NaN values are capped or
        /// zeroed). Default 300 s.
        public var maximumDelay: Duration

        public init(
            policy: (any RetryPolicy)?,
            budget: RetryBudget? = nil,
            throttling: RetryThrottling? = nil,
            retryAfter: RetryAfterPolicy = .honored(atMost: .seconds(60)),
            maximumDelay: Duration = RetryPolicyDelay.defaultMaximum
        ) {
            self.policy = policy
            self.budget = budget
            self.throttling = throttling
            self.retryAfter = retryAfter
            self.maximumDelay = maximumDelay
        }
    }

    /// What a server's `Retry-After` (on 429 and 503) does to the wait before a retry.
    public enum RetryAfterPolicy: Sendable, Hashable {
        /// The policy's delay is used whatever the server says.
        case ignored
        /// A valid `Retry-After` replaces the policy's delay, capped at `atMost`.
        case honored(atMost: Duration)
    }

    /// Which circuit breaker a request goes through.
    public enum CircuitBreakerScope: Sendable {
        /// No breaker.
        case none
        /// One breaker for every request of the engine: for an engine that calls one dependency.
        case shared(CircuitBreaker)
        /// One breaker per host (host and port), for an engine that calls several dependencies.
        case perHost(CircuitBreakerRegistry)
        /// One breaker per API operation (`NetworkRequest.operationID`, as a generated OpenAPI
        /// client names it) and host (`CircuitBreakerRegistry.breaker(forOperation:onHost:)`), and
        /// per host for requests without one: a failing operation opens its own breaker while the
        /// host's other operations go on.
        case perOperation(CircuitBreakerRegistry)
    }

    /// Limits per host (host and port) on the attempts an engine sends. Every limit is off by
    /// default. With more than one, a copy of an attempt takes a rate token first, then its
    /// adaptive place, then a fixed one.
    public struct Limits: Sendable {
        /// Attempts allowed in flight at once per host; further attempts wait in line, first come
        /// first served, and the wait counts against the attempt's timeout and the request's
        /// deadline. `nil`: no limit.
        public var concurrencyPerHost: Int?
        /// Attempts allowed to wait per host when `concurrencyPerHost` is set; beyond that an
        /// attempt fails at once with `NetworkError.limited` (not retried). Default 1 000.
        public var waitingPerHost: Int
        /// A token bucket per host: an attempt without a token waits up to the limit's `maxWait`
        /// for one (the wait counts against its timeout and deadline), else fails at once with
        /// `NetworkError.limited` carrying when a token is due (not retried). `nil`: no rate limit.
        public var ratePerHost: HostRateLimit?
        /// An `AdaptiveConcurrencyLimiter` per host, made with this configuration, whose limit
        /// follows the host's latency and drops (a timeout, 429, 503, a failed connection, a reply
        /// that is not HTTP). Each copy of an attempt takes a place for its request's
        /// `requestPriority`; a full wait line is `NetworkError.limited`, not retried. `nil`: off.
        public var adaptiveConcurrencyPerHost: AdaptiveConcurrencyLimiter.Configuration?

        public init(
            concurrencyPerHost: Int? = nil,
            waitingPerHost: Int = 1_000,
            ratePerHost: HostRateLimit? = nil,
            adaptiveConcurrencyPerHost: AdaptiveConcurrencyLimiter.Configuration? = nil
        ) {
            self.concurrencyPerHost = concurrencyPerHost
            self.waitingPerHost = waitingPerHost
            self.ratePerHost = ratePerHost
            self.adaptiveConcurrencyPerHost = adaptiveConcurrencyPerHost
        }
    }
}
