import Foundation
import ResilienceCore
import Retry

// The spellings before `AsyncRequestEngine.Configuration`, kept for one release. Each maps onto
// the configuration and means what it meant.

extension AsyncRequestEngine {
    /// Tuning knobs with safe defaults: now `AsyncRequestEngine.Configuration`.
    @available(*, deprecated, message: "Use AsyncRequestEngine.Configuration: retry, limits, hedging, deadline, maximumResponseBodySize, deduplicatedMethods")
    public struct Options: Sendable {
        /// Now `configuration.retry.retryAfter` (`.honored(atMost:)`).
        public var maximumRetryAfter: Duration
        /// Now `configuration.retry.maximumDelay`.
        public var maximumRetryDelay: Duration
        /// Now `configuration.deduplicatedMethods`.
        public var deduplicatedMethods: Set<HTTPMethod>
        /// Now `configuration.retry.retryAfter` (`.ignored` for false).
        public var honorsRetryAfter: Bool
        /// Now `configuration.maximumResponseBodySize`.
        public var maximumResponseBodySize: Int?
        /// Now `configuration.deadline`.
        public var totalDeadline: Duration?
        /// Now `configuration.hedging`.
        public var hedging: HedgingPolicy?
        /// Now `configuration.limits.concurrencyPerHost`.
        public var maxConcurrentPerHost: Int?
        /// Now `configuration.limits.waitingPerHost`.
        public var maxWaitingPerHost: Int
        /// Now `configuration.limits.ratePerHost`.
        public var rateLimitPerHost: HostRateLimit?
        /// Now `configuration.retry.throttling`.
        public var retryThrottling: RetryThrottling?
        /// Now `configuration.limits.adaptiveConcurrencyPerHost`.
        public var adaptiveConcurrencyPerHost: AdaptiveConcurrencyLimiter.Configuration?

        /// Now `Configuration.defaultMaximumResponseBodySize`.
        public static let defaultMaximumResponseBodySize = Configuration.defaultMaximumResponseBodySize

        public init(
            maximumRetryAfter: Duration = .seconds(60),
            maximumRetryDelay: Duration = RetryPolicyDelay.defaultMaximum,
            deduplicatedMethods: Set<HTTPMethod> = [.get, .head, .options],
            honorsRetryAfter: Bool = true,
            maximumResponseBodySize: Int? = Configuration.defaultMaximumResponseBodySize,
            totalDeadline: Duration? = nil,
            hedging: HedgingPolicy? = nil,
            maxConcurrentPerHost: Int? = nil,
            maxWaitingPerHost: Int = 1_000,
            rateLimitPerHost: HostRateLimit? = nil,
            retryThrottling: RetryThrottling? = nil,
            adaptiveConcurrencyPerHost: AdaptiveConcurrencyLimiter.Configuration? = nil
        ) {
            self.maximumRetryAfter = max(.zero, maximumRetryAfter)
            self.maximumRetryDelay = max(.zero, maximumRetryDelay)
            self.deduplicatedMethods = deduplicatedMethods
            self.honorsRetryAfter = honorsRetryAfter
            self.maximumResponseBodySize = maximumResponseBodySize.map { max(0, $0) }
            self.totalDeadline = totalDeadline
            self.hedging = hedging
            self.maxConcurrentPerHost = maxConcurrentPerHost.map { max(1, $0) }
            self.maxWaitingPerHost = max(0, maxWaitingPerHost)
            self.rateLimitPerHost = rateLimitPerHost
            self.retryThrottling = retryThrottling
            self.adaptiveConcurrencyPerHost = adaptiveConcurrencyPerHost
        }
    }

    /// The engine with its strategies as separate arguments: now `init(session:configuration:clock:)`.
    /// `circuitBreakers`, when set, is used instead of `circuitBreaker`, as it was.
    @available(
        *, deprecated,
        message:
            "Use init(session:configuration:clock:): retryBudget is configuration.retry.budget, circuitBreaker(s) is configuration.circuitBreaker (.shared or .perHost), options' fields are configuration's"
    )
    public convenience init(
        session: any NetworkSession = URLSessionTransport.shared,
        retryPolicy: (any RetryPolicy)? = nil,
        eventSink: (any RequestEventSink)? = nil,
        retryBudget: RetryBudget? = nil,
        circuitBreaker: CircuitBreaker? = nil,
        circuitBreakers: CircuitBreakerRegistry? = nil,
        options: Options = Options(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        let breaking: CircuitBreakerScope =
            if let circuitBreakers { .perHost(circuitBreakers) } else if let circuitBreaker { .shared(circuitBreaker) } else { .none }
        let configuration = Configuration(
            retry: RetryStrategy(
                policy: retryPolicy,
                budget: retryBudget,
                throttling: options.retryThrottling,
                retryAfter: options.honorsRetryAfter ? .honored(atMost: options.maximumRetryAfter) : .ignored,
                maximumDelay: options.maximumRetryDelay
            ),
            circuitBreaker: breaking,
            limits: Limits(
                concurrencyPerHost: options.maxConcurrentPerHost,
                waitingPerHost: options.maxWaitingPerHost,
                ratePerHost: options.rateLimitPerHost,
                adaptiveConcurrencyPerHost: options.adaptiveConcurrencyPerHost
            ),
            hedging: options.hedging,
            deadline: options.totalDeadline,
            maximumResponseBodySize: options.maximumResponseBodySize,
            deduplicatedMethods: options.deduplicatedMethods,
            eventSink: eventSink
        )
        self.init(session: session, configuration: configuration, clock: clock)
    }

    /// Now `configuration.retry.policy`.
    @available(*, deprecated, renamed: "configuration.retry.policy")
    public var retryPolicy: (any RetryPolicy)? { configuration.retry.policy }
    /// Now `configuration.eventSink`.
    @available(*, deprecated, renamed: "configuration.eventSink")
    public var eventSink: (any RequestEventSink)? { configuration.eventSink }
    /// Now `configuration.retry.budget`.
    @available(*, deprecated, renamed: "configuration.retry.budget")
    public var retryBudget: RetryBudget? { configuration.retry.budget }
    /// Now `configuration.circuitBreaker` (`.shared`); `nil` when the engine was given a registry,
    /// even if it was given a single breaker too (the registry is the one used).
    @available(*, deprecated, message: "Use configuration.circuitBreaker")
    public var circuitBreaker: CircuitBreaker? {
        if case .shared(let breaker) = configuration.circuitBreaker { breaker } else { nil }
    }
    /// Now `configuration.circuitBreaker` (`.perHost`).
    @available(*, deprecated, message: "Use configuration.circuitBreaker")
    public var circuitBreakers: CircuitBreakerRegistry? {
        if case .perHost(let registry) = configuration.circuitBreaker { registry } else { nil }
    }
    /// Now `configuration`. With `retry.retryAfter` `.ignored`, `maximumRetryAfter` reads 60 s
    /// (the value given then is not used, so not kept).
    @available(*, deprecated, renamed: "configuration")
    public var options: Options {
        Options(
            maximumRetryAfter: { if case .honored(let atMost) = configuration.retry.retryAfter { atMost } else { .seconds(60) } }(),
            maximumRetryDelay: configuration.retry.maximumDelay,
            deduplicatedMethods: configuration.deduplicatedMethods,
            honorsRetryAfter: configuration.retry.retryAfter != .ignored,
            maximumResponseBodySize: configuration.maximumResponseBodySize,
            totalDeadline: configuration.deadline,
            hedging: configuration.hedging,
            maxConcurrentPerHost: configuration.limits.concurrencyPerHost,
            maxWaitingPerHost: configuration.limits.waitingPerHost,
            rateLimitPerHost: configuration.limits.ratePerHost,
            retryThrottling: configuration.retry.throttling,
            adaptiveConcurrencyPerHost: configuration.limits.adaptiveConcurrencyPerHost
        )
    }
}
