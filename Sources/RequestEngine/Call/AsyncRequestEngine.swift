import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends requests with retries, typed errors, prompt cancellation, per-attempt timeouts and
/// single-flight deduplication of identical concurrent reads.
///
/// ```swift
/// var configuration = AsyncRequestEngine.Configuration()
/// configuration.retry = .init(policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0))
/// let engine = AsyncRequestEngine(configuration: configuration)
/// let (data, response) = try await engine.send(R(url: url))
/// ```
///
/// What the engine guarantees (see Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md for every edge case):
/// - **Success** is a 2xx response; anything else is thrown as `NetworkError`.
/// - **Retries** (`Configuration.retry`) happen only for `NetworkError.isRetryable` failures, only
///   while the retry policy returns a delay, only while the retry budget (if any) has tokens, and for
///   POST/PATCH only when the request carries an `Idempotency-Key` header. On 429 and 503 a valid
///   `Retry-After` replaces the policy's delay, capped (`RetryStrategy.retryAfter`). Policy delays
///   are sanitised: negative or NaN → 0, infinite or huge → `RetryStrategy.maximumDelay`. Without a
///   policy nothing is retried.
/// - **Timeout**: each attempt is limited to the request's `timeout`, measured on the engine's clock.
/// - **Body size**: a response body above `Configuration.maximumResponseBodySize` (16 MiB by default) or the
///   request's own `maximumResponseBodySize` fails with `NetworkError.responseTooLarge(limit:)`.
/// - **Deduplication**: concurrent sends of GET, HEAD and OPTIONS (configurable) with the same
///   `RequestIdentity` share one network call and its result.
/// - **Cancellation**: a cancelled caller gets `NetworkError.cancelled` at once; a shared call is
///   cancelled only when its last waiter is.
/// - **Circuit breaker** (optional, `Configuration.circuitBreaker`): while open, sends fail fast with
///   `NetworkError.circuitOpen`; `.perHost` keeps one per host.
/// - **Total deadline** (optional, `Configuration.deadline` or `NetworkRequest.deadline`): bounds the
///   whole request; past it, `NetworkError.deadlineExceeded`.
/// - **Hedging** (optional, `Configuration.hedging`): an idempotent attempt unanswered after the hedging
///   delay is sent again beside itself; the first acceptable answer wins.
/// - **Limits per host** (optional, `Configuration.limits`): attempts beyond them wait (in a bounded
///   line, or up to the rate limit's `maxWait`); past that they fail with `NetworkError.limited`.
/// - **Events** go to `Configuration.eventSink` with one traceID per logical request; no sink, no cost.
///
/// The strategies apply outermost first: total deadline, retry (with the host's retry throttle
/// and the budget), circuit breaker, attempt timeout, hedging, per-host rate limit, per-host
/// adaptive limit, per-host concurrency limit, transport (Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md, "In what order
/// the strategies apply").
public final class AsyncRequestEngine: RequestSending {
    /// The transport every attempt goes through.
    public let session: any NetworkSession
    /// What the engine does beyond sending, as it runs with it (out-of-range values taken at the
    /// nearest valid one).
    public let configuration: Configuration
    /// What every call's attempts go through (the session, the watchdog, the host limiters, the
    /// rules, the sinks), handed to each call: a call performs its attempts itself and never calls
    /// back into the engine.
    let parts: EngineParts
    private let sharedBreaker: CircuitBreaker?
    private let breakerRegistry: CircuitBreakerRegistry?
    /// `CircuitBreakerScope.perOperation`: a request with an operation takes its operation's breaker.
    private let breakersPerOperation: Bool
    /// `configuration.deduplicatedMethods` as a bit set, read by every send.
    private let deduplicated: HTTPMethodSet
    /// Whether a retry policy is set, read by every send (testing an optional existential copies
    /// it).
    private let retries: Bool
    /// The per-host retry throttles, when `retry.throttling` is set.
    private let hostThrottles: HostLimiters<RetryThrottle>?
    /// Whether a strategy works per host (breakers from a registry, host limits): the request's
    /// authority is then read off its URL once, as it is validated.
    private let perHost: Bool
    /// The session bounds each call by its timeout and ends it when its caller is cancelled
    /// (`NetworkSession.honorsTimeoutAndCancellation`): an unhedged request with no host limit
    /// runs in its caller's task.
    private let sessionBoundsCalls: Bool

    /// Makes an engine.
    ///
    /// - Parameters:
    ///   - session: the transport; `URLSessionTransport.shared` by default. A plain `URLSession`
    ///     works too, but checks the body limit only once the whole body has arrived.
    ///   - configuration: retries, circuit breaker, limits, hedging, deadline, body limit,
    ///     deduplication and events; by default none but the 16 MiB body limit and deduplication.
    ///   - clock: the clock timeouts and backoff sleeps run on (inject `ManualClock` in tests).
    public init(
        session: any NetworkSession = URLSessionTransport.shared,
        configuration: Configuration = Configuration(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        let configuration = configuration.sanitized
        self.session = session
        self.configuration = configuration
        let sink = configuration.eventSink
        switch configuration.circuitBreaker {
        case .none: (sharedBreaker, breakerRegistry, breakersPerOperation) = (nil, nil, false)
        case .shared(let breaker): (sharedBreaker, breakerRegistry, breakersPerOperation) = (breaker, nil, false)
        case .perHost(let registry): (sharedBreaker, breakerRegistry, breakersPerOperation) = (nil, registry, false)
        case .perOperation(let registry): (sharedBreaker, breakerRegistry, breakersPerOperation) = (nil, registry, true)
        }
        let limits = configuration.limits
        self.hostThrottles = configuration.retry.throttling.map { HostLimiters(throttling: $0) }
        self.perHost =
            breakerRegistry != nil || limits.concurrencyPerHost != nil || limits.ratePerHost != nil
            || configuration.retry.throttling != nil || limits.adaptiveConcurrencyPerHost != nil
        let time = TimeSource(clock)
        self.deduplicated = HTTPMethodSet(configuration.deduplicatedMethods)
        self.retries = configuration.retry.policy != nil
        let retryAfterCap: Duration? =
            switch configuration.retry.retryAfter {
            case .ignored: nil
            case .honored(let atMost): atMost
            }
        let rules = RequestStateMachine.Rules(
            policy: configuration.retry.policy,
            budget: configuration.retry.budget,
            retryAfterCap: retryAfterCap,
            maximumDelay: configuration.retry.maximumDelay
        )
        self.sessionBoundsCalls = session.honorsTimeoutAndCancellation
        self.parts = EngineParts(
            session: session,
            sink: sink,
            rules: rules,
            time: time,
            hostLimiters: limits.concurrencyPerHost.map { HostLimiters(maxConcurrent: $0, maxWaiting: limits.waitingPerHost) },
            hostRates: limits.ratePerHost.map { HostLimiters($0, time: time) },
            hostAdaptiveLimiters: limits.adaptiveConcurrencyPerHost.map { HostLimiters($0, clock: clock) }
        )
    }

    /// The engine SwiftResilience published: a session, a retry policy and an event sink, the
    /// rest as `Configuration()` has it.
    public convenience init(
        session: any NetworkSession = URLSessionTransport.shared,
        retryPolicy: (any RetryPolicy)? = nil,
        eventSink: (any RequestEventSink)? = nil,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.init(
            session: session,
            configuration: Configuration(retry: RetryStrategy(policy: retryPolicy), eventSink: eventSink),
            clock: clock
        )
    }

    /// Sends `request` — with retries, deduplication, timeouts and events — and returns the final
    /// HTTP response whatever its status, so a caller can read headers such as `Retry-After` on a
    /// 503. `send(_:)` (from `RequestSending`) is this, with a final status outside 2xx thrown as
    /// `NetworkError.httpError`.
    ///
    /// - Throws: `NetworkError` only when no HTTP response was obtained — the last failure once
    ///   retrying stops (offline, transport failure, timeout, invalid reply, open circuit),
    ///   `.cancelled` when the calling task is cancelled, `.invalidRequest` before anything is sent
    ///   for a malformed request.
    /// What its session adds to a request for `url` (`NetworkSession.credentialHeaders(for:)`).
    public func credentialHeaders(for url: URL) -> [String: String] {
        session.credentialHeaders(for: url)
    }

    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, head) = try await exchange(request)
        return (data, head.httpURLResponse)
    }

    /// `response(for:)`, answering with the response's head as the session received it: over a
    /// session that reads fields itself (`AsyncHTTPClientSession`) no `HTTPURLResponse` is built.
    public func responseWithHead(for request: some NetworkRequest) async throws -> (Data, ResponseHead) {
        try await exchange(request)
    }

    /// Both answers' one path. Inlined into each: an async function called on its own costs a
    /// frame and a return per request.
    @inline(__always)
    private func exchange(_ request: some NetworkRequest) async throws -> (Data, ResponseHead) {
        let entry = enter(request)
        if entry.runsHere {
            await entry.call.run()
            return try entry.call.outcome.get()  // `.cancelled` when this caller left a shared call
        }
        if let joinedAs = entry.joinedAs {
            await emitDeduplicated(joinedAs.traceID, url: joinedAs.url, method: entry.call.execution.method, operationID: entry.call.execution.operationID)
        }
        return try await entry.call.wait(entry.waiter).get()
    }

    /// The adaptive concurrency limiter of `url`'s host (host and port), with its `currentLimit`,
    /// `inFlight` and `waiting`: `nil` when `Limits.adaptiveConcurrencyPerHost` is off or no
    /// request has gone to that host yet.
    public func adaptiveConcurrencyLimiter(for url: URL) -> AdaptiveConcurrencyLimiter? {
        guard let hostAdaptiveLimiters = parts.hostAdaptiveLimiters, let authority = CircuitBreakerRegistry.authority(of: url) else {
            return nil
        }
        return hostAdaptiveLimiters.existing(forAuthority: authority)
    }

    /// Every host's adaptive concurrency limiter, by authority (host and port, as
    /// `CircuitBreakerRegistry.authority(of:)` writes it): empty when
    /// `Limits.adaptiveConcurrencyPerHost` is off. What a metrics exporter reads.
    public var adaptiveConcurrencyLimiters: [String: AdaptiveConcurrencyLimiter] {
        parts.hostAdaptiveLimiters?.all ?? [:]
    }

    /// The number of distinct shared calls in flight now (deduplicated methods only); approximate
    /// while sends run concurrently.
    public var inFlightCount: Int { parts.inFlight.count }

    // MARK: - Entering a request

    /// Reads the request's properties (once: from here on nothing is generic), then joins the
    /// identical call in flight or starts a new one. Synchronous, so the caller's async frame
    /// stays small. A caller that joined gets its own trace id and URL back for its
    /// `deduplicated` event (only when events are observed).
    @inline(never)
    private func enter(
        _ request: some NetworkRequest
    ) -> (call: SharedCall, waiter: SharedCall.Ticket, joinedAs: (traceID: UUID, url: URL)?, runsHere: Bool) {
        let url = request.url
        let method = request.method
        let headers = request.headers
        let body = request.body
        let timeout = request.timeout
        let bodyLimit = request.maximumResponseBodySize
        let ownDeadline = request.deadline
        let operation = Operation(id: request.operationID, retryable: request.retryable)
        let parts = self.parts
        let limiterPriority = parts.hostAdaptiveLimiters == nil ? RequestPriority.interactive : request.requestPriority
        let deadline = ownDeadline ?? configuration.deadline
        // Read before any lock: the clock is the caller's (a test clock takes a lock of its own).
        let traceID = makeTraceID()
        // Read only for `succeeded`'s duration and the deadline.
        let started = parts.observed || deadline != nil ? parts.time.now() : .zero
        let priority = Task.currentPriority
        // Capped like timeouts, so no clock is asked to sleep past its range.
        let endsAt = deadline.map { started + min($0, .seconds(Int64.max / 2)) }
        guard deduplicated.contains(method), (request as? PreparedRequest)?.sharesCallsInFlight != false else {
            let execution = plan(url, method, headers, body, timeout, bodyLimit, traceID, started, priority, endsAt, limiterPriority, operation, key: nil)
            let call = SharedCall(execution: execution, parts: parts)
            // Run by the caller (`response(for:)`) when nothing needs a task of its own.
            if !execution.inCallersTask { call.start { Task { await call.run() } } }
            return (call, call.firstTicket, nil, execution.inCallersTask)
        }
        // Requests with different body limits never share a call: one could fail where the other must not.
        // Nor with different deadlines of their own (the engine's default is the same for all).
        let key = SingleFlightTable.Key(
            RequestIdentity(method: method, url: url, headers: headers, body: body),
            maximumBodySize: bodyLimit ?? configuration.maximumResponseBodySize,
            deadline: ownDeadline,
            operationID: operation.id,
            retryable: operation.retryable
        )
        let (call, waiter, joined) = parts.inFlight.joinOrStart(key) {
            SharedCall(
                execution: plan(url, method, headers, body, timeout, bodyLimit, traceID, started, priority, endsAt, limiterPriority, operation, key: key),
                parts: parts
            )
        }
        guard joined else {
            // The caller that starts a call runs it when nothing needs a task of its own: should it
            // be cancelled while others wait, the rest moves to a task then (`callerCancelled`).
            if !call.execution.inCallersTask { call.start { Task { await call.run() } } }
            return (call, waiter, nil, call.execution.inCallersTask)
        }
        return (call, waiter, parts.observed ? (traceID, url) : nil, false)
    }

    /// A fresh trace id when events are observed; without a sink none is needed (`UUID()` reads
    /// /dev/urandom on Linux: three system calls per request for nothing).
    private func makeTraceID() -> UUID {
        parts.observed ? UUID() : Self.unobservedTraceID
    }

    /// A request's operation (`NetworkRequest.operationID`) and whether it may be sent more than once.
    private struct Operation {
        let id: String?
        let retryable: Bool?

        /// `retryable`, else the method and `Idempotency-Key` rule: `repeatable` says whether the
        /// method (with the headers) allows a repeat on its own.
        func allowsRepeats(_ repeatable: @autoclosure () -> Bool) -> Bool {
            retryable ?? repeatable()
        }
    }

    /// The breaker a request goes through: its operation's (`perOperation`), its host's, or the
    /// engine's one.
    private func breaker(authority: String?, operationID: String?) -> CircuitBreaker? {
        guard let breakerRegistry else { return sharedBreaker }
        guard let authority else { return nil }
        if breakersPerOperation, let operationID { return breakerRegistry.breaker(forOperation: operationID, onHost: authority) }
        return breakerRegistry.breaker(forHost: authority)
    }

    /// Methods hedged without an `Idempotency-Key`: those that only read.
    private static let hedgeable = HTTPMethodSet([.get, .head, .options])

    private static let unobservedTraceID = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))

    /// What the call's attempts will need. A request that cannot be sent gets a plan that reports
    /// why (after `started`), so every send has the same event sequence.
    private func plan(
        _ url: URL,
        _ method: HTTPMethod,
        _ headers: [String: String],
        _ body: Data?,
        _ timeout: TimeInterval,
        _ bodyLimit: Int?,
        _ traceID: UUID,
        _ started: Duration,
        _ priority: TaskPriority,
        _ deadline: Duration?,
        _ priorityForLimits: RequestPriority,
        _ operation: Operation,
        key: SingleFlightTable.Key?
    ) -> Execution {
        let urlRequest: URLRequest
        var invalid: NetworkError?
        var authority: String? = perHost ? "" : nil  // non-nil asks the builder for it
        let limitsHosts = parts.hostLimiters != nil || parts.hostRates != nil || parts.hostAdaptiveLimiters != nil
        let hedging = configuration.hedging.flatMap { policy in
            policy.maxAttempts > 1
                && operation.allowsRepeats(Self.hedgeable.contains(method) || HeaderValidation.containsIdempotencyKey(headers))
                ? policy : nil
        }
        // Hedged never, waiting for no host's place, over a session that bounds its calls: the
        // caller's task runs it (for a shared call, the caller that starts it), and the session
        // times each attempt.
        let inCallersTask = sessionBoundsCalls && hedging == nil && !limitsHosts
        do {
            urlRequest = try URLRequestBuilder.make(
                url: url, method: method, headers: headers, body: body, timeout: timeout,
                sessionTimesAttempts: inCallersTask, authority: &authority
            )
        } catch {
            authority = nil
            urlRequest = URLRequest(url: url)
            invalid = error
        }
        if invalid == nil, let bodyLimit, bodyLimit < 0 {
            invalid = .invalidRequest(reason: "maximumResponseBodySize must not be negative")
        }
        return Execution(
            url: url,
            method: method,
            operationID: operation.id,
            urlRequest: urlRequest,
            invalid: invalid,
            timeout: timeout.isFinite ? .clamped(seconds: timeout, upperBound: .seconds(Int64.max / 2)) : nil,
            maximumBodySize: bodyLimit ?? configuration.maximumResponseBodySize,
            mayRetry: retries && operation.allowsRepeats(method.isIdempotent || HeaderValidation.containsIdempotencyKey(headers)),
            traceID: traceID,
            started: started,
            priority: priority,
            key: key,
            deadline: deadline,
            breaker: breaker(authority: authority, operationID: operation.id),
            authority: limitsHosts ? authority : nil,
            hedging: hedging,
            throttle: hostThrottles.flatMap { throttles in authority.map { throttles.limiter(forAuthority: $0) } },
            limiterPriority: priorityForLimits,
            inCallersTask: inCallersTask
        )
    }

    // MARK: - Events

    @inline(never)
    private func emitDeduplicated(_ traceID: UUID, url: URL, method: HTTPMethod, operationID: String?) async {
        await parts.sink?.record(.deduplicated(traceID: traceID, url: url, method: method), operationID: operationID)
    }

    /// Where tests observe paths that have no other visible effect (see AsyncRequestEngine+Testing).
    var testHooks: EngineTestHooks { parts.testHooks }
}

/// What every call's attempts go through, made once by the engine and held by each of its calls
/// (`SharedCall`, which performs its attempts with them): the session, the watchdog, the host
/// limiters, the rules and the event sinks. Nothing here refers back to the engine.
final class EngineParts: Sendable {
    /// The transport every attempt goes through.
    let session: any NetworkSession
    /// Read by every send, so kept out of `configuration` (reading an optional existential
    /// through a struct copies it).
    let sink: (any RequestEventSink)?
    /// Whether an event sink is set, read by every send (testing an optional existential copies
    /// it).
    let observed: Bool
    /// The event sink, when it also hears of hedges.
    let hedgeSink: (any HedgingEventSink)?
    /// The event sink, when it also hears of throttled retries.
    let throttleSink: (any RetryThrottlingEventSink)?
    /// What every request's attempts are decided with (`RequestStateMachine`), the retry budget
    /// included (every request records itself with it). Its retry policy, an existential, is read
    /// through it only when an attempt fails.
    let rules: RequestStateMachine.Rules
    /// `rules.budget`, read by every request (reading it through `rules` copies the rules).
    let budget: RetryBudget?
    let time: TimeSource
    /// Times attempts out: tells the call (`SharedCall.attemptExpired`) when an attempt's limit
    /// passes.
    let watchdog: DeadlineWatchdog
    /// Shared calls in flight, by identity (deduplicated methods only). Locks, not actor state:
    /// every deduplicated send joins or starts a call here, and an actor hop each way measurably
    /// slowed the request path (Benchmarks/README.md).
    let inFlight = SingleFlightTable()
    /// The per-host limiters, when `limits.concurrencyPerHost` is set.
    let hostLimiters: HostLimiters<ConcurrencyLimiter>?
    /// The per-host token buckets, when `limits.ratePerHost` is set.
    let hostRates: HostLimiters<RateLimiter>?
    /// The per-host adaptive limiters, when `limits.adaptiveConcurrencyPerHost` is set.
    let hostAdaptiveLimiters: HostLimiters<AdaptiveConcurrencyLimiter>?
    /// Where tests observe paths that have no other visible effect (see AsyncRequestEngine+Testing).
    let testHooks = EngineTestHooks()

    init(
        session: any NetworkSession,
        sink: (any RequestEventSink)?,
        rules: RequestStateMachine.Rules,
        time: TimeSource,
        hostLimiters: HostLimiters<ConcurrencyLimiter>?,
        hostRates: HostLimiters<RateLimiter>?,
        hostAdaptiveLimiters: HostLimiters<AdaptiveConcurrencyLimiter>?
    ) {
        self.session = session
        self.sink = sink
        self.observed = sink != nil
        self.hedgeSink = sink as? any HedgingEventSink
        self.throttleSink = sink as? any RetryThrottlingEventSink
        self.rules = rules
        self.budget = rules.budget
        self.time = time
        self.watchdog = DeadlineWatchdog(time: time)
        self.hostLimiters = hostLimiters
        self.hostRates = hostRates
        self.hostAdaptiveLimiters = hostAdaptiveLimiters
        // The watchdog's event goes to the call whose attempt it timed; the call carries on.
        watchdog.onExpiry { call, attempt in call.attemptExpired(attempt) }
    }

    deinit {
        // Held by the engine and by each call in flight: the last of them gone, no attempt is
        // left to time out.
        watchdog.shutdown()
    }
}
