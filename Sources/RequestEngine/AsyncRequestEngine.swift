import Foundation
import ResilienceCore
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
    /// Read by every send, so kept out of `configuration` (reading an optional existential
    /// through a struct copies it).
    private let sink: (any RequestEventSink)?
    /// What every request's attempts are decided with (`RequestStateMachine`), the retry budget
    /// included (every request records itself with it). Its retry policy, an existential, is read
    /// through it only when an attempt fails.
    private let rules: RequestStateMachine.Rules
    private let sharedBreaker: CircuitBreaker?
    private let breakerRegistry: CircuitBreakerRegistry?
    private let time: TimeSource
    private let watchdog: DeadlineWatchdog

    /// Shared calls in flight, by identity (deduplicated methods only). Locks, not actor state:
    /// every deduplicated send joins or starts a call here, and an actor hop each way measurably
    /// slowed the request path (Benchmarks/README.md).
    private let inFlight = SingleFlightTable()
    /// Where tests observe paths that have no other visible effect (see AsyncRequestEngine+Testing).
    let testHooks = EngineTestHooks()
    /// `configuration.deduplicatedMethods` as a bit set, read by every send.
    private let deduplicated: HTTPMethodSet
    /// Whether an event sink is set and whether a retry policy is, read by every send (testing an
    /// optional existential copies it).
    private let observed: Bool
    private let retries: Bool
    /// The per-host limiters, when `limits.concurrencyPerHost` is set.
    private let hostLimiters: HostLimiters<ConcurrencyLimiter>?
    /// The per-host token buckets, when `limits.ratePerHost` is set.
    private let hostRates: HostLimiters<RateLimiter>?
    /// The per-host adaptive limiters, when `configuration.limits.adaptiveConcurrencyPerHost` is set.
    private let hostAdaptiveLimiters: HostLimiters<AdaptiveConcurrencyLimiter>?
    /// The per-host retry throttles, when `retry.throttling` is set.
    private let hostThrottles: HostLimiters<RetryThrottle>?
    /// The event sink, when it also hears of hedges.
    private let hedgeSink: (any HedgingEventSink)?
    /// The event sink, when it also hears of throttled retries.
    private let throttleSink: (any RetryThrottlingEventSink)?
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
        self.sink = configuration.eventSink
        switch configuration.circuitBreaker {
        case .none: (sharedBreaker, breakerRegistry) = (nil, nil)
        case .shared(let breaker): (sharedBreaker, breakerRegistry) = (breaker, nil)
        case .perHost(let registry): (sharedBreaker, breakerRegistry) = (nil, registry)
        }
        let limits = configuration.limits
        self.hostLimiters = limits.concurrencyPerHost.map {
            HostLimiters(maxConcurrent: $0, maxWaiting: limits.waitingPerHost)
        }
        self.hostThrottles = configuration.retry.throttling.map { HostLimiters(throttling: $0) }
        self.hedgeSink = sink as? any HedgingEventSink
        self.throttleSink = sink as? any RetryThrottlingEventSink
        self.perHost =
            breakerRegistry != nil || limits.concurrencyPerHost != nil || limits.ratePerHost != nil
            || configuration.retry.throttling != nil || limits.adaptiveConcurrencyPerHost != nil
        let time = TimeSource(clock)
        self.hostAdaptiveLimiters = limits.adaptiveConcurrencyPerHost.map { HostLimiters($0, clock: clock) }
        self.hostRates = limits.ratePerHost.map { HostLimiters($0, time: time) }
        self.deduplicated = HTTPMethodSet(configuration.deduplicatedMethods)
        self.observed = sink != nil
        self.retries = configuration.retry.policy != nil
        let retryAfterCap: Duration? =
            switch configuration.retry.retryAfter {
            case .ignored: nil
            case .honored(let atMost): atMost
            }
        self.rules = RequestStateMachine.Rules(
            policy: configuration.retry.policy,
            budget: configuration.retry.budget,
            retryAfterCap: retryAfterCap,
            maximumDelay: configuration.retry.maximumDelay
        )
        self.sessionBoundsCalls = session.honorsTimeoutAndCancellation
        self.time = time
        self.watchdog = DeadlineWatchdog(time: time)
        // Weak: the watchdog's sleeper may outlive the engine by a moment (deinit shuts it down).
        watchdog.onExpiry { [weak self] call, attempt in self?.attemptTimedOut(call, attempt: attempt) }
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

    deinit {
        watchdog.shutdown()
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
    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let entry = enter(request)
        if entry.runsHere {
            await run(entry.call)
            return try entry.call.outcome.get()  // `.cancelled` when this caller left a shared call
        }
        if let joinedAs = entry.joinedAs {
            await emitDeduplicated(joinedAs.traceID, url: joinedAs.url, method: entry.call.execution.method)
        }
        return try await entry.call.wait(entry.waiter).get()
    }

    /// The adaptive concurrency limiter of `url`'s host (host and port), with its `currentLimit`,
    /// `inFlight` and `waiting`: `nil` when `Limits.adaptiveConcurrencyPerHost` is off or no
    /// request has gone to that host yet.
    public func adaptiveConcurrencyLimiter(for url: URL) -> AdaptiveConcurrencyLimiter? {
        guard let hostAdaptiveLimiters, let authority = CircuitBreakerRegistry.authority(of: url) else { return nil }
        return hostAdaptiveLimiters.existing(forAuthority: authority)
    }

    /// Every host's adaptive concurrency limiter, by authority (host and port, as
    /// `CircuitBreakerRegistry.authority(of:)` writes it): empty when
    /// `Limits.adaptiveConcurrencyPerHost` is off. What a metrics exporter reads.
    public var adaptiveConcurrencyLimiters: [String: AdaptiveConcurrencyLimiter] {
        hostAdaptiveLimiters?.all ?? [:]
    }

    /// The number of distinct shared calls in flight now (deduplicated methods only); approximate
    /// while sends run concurrently.
    public var inFlightCount: Int { inFlight.count }

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
        let limiterPriority = hostAdaptiveLimiters == nil ? RequestPriority.interactive : request.requestPriority
        let deadline = ownDeadline ?? configuration.deadline
        // Read before any lock: the clock is the caller's (a test clock takes a lock of its own).
        let traceID = makeTraceID()
        // Read only for `succeeded`'s duration and the deadline.
        let started = observed || deadline != nil ? time.now() : .zero
        let priority = Task.currentPriority
        // Capped like timeouts, so no clock is asked to sleep past its range.
        let endsAt = deadline.map { started + min($0, .seconds(Int64.max / 2)) }
        guard deduplicated.contains(method) else {
            let execution = plan(url, method, headers, body, timeout, bodyLimit, traceID, started, priority, endsAt, limiterPriority, key: nil)
            let call = SharedCall(execution: execution)
            // Run by the caller (`response(for:)`) when nothing needs a task of its own.
            if !execution.inCallersTask { call.start { Task { await self.run(call) } } }
            return (call, call.firstTicket, nil, execution.inCallersTask)
        }
        // Requests with different body limits never share a call: one could fail where the other must not.
        // Nor with different deadlines of their own (the engine's default is the same for all).
        let key = SingleFlightTable.Key(
            RequestIdentity(method: method, url: url, headers: headers, body: body),
            maximumBodySize: bodyLimit ?? configuration.maximumResponseBodySize,
            deadline: ownDeadline
        )
        let (call, waiter, joined) = inFlight.joinOrStart(key) {
            SharedCall(execution: plan(url, method, headers, body, timeout, bodyLimit, traceID, started, priority, endsAt, limiterPriority, key: key))
        }
        guard joined else {
            // The caller that starts a call runs it when nothing needs a task of its own: should it
            // be cancelled while others wait, the rest moves to a task then (`callerCancelled`).
            if !call.execution.inCallersTask { call.start { Task { await self.run(call) } } }
            return (call, waiter, nil, call.execution.inCallersTask)
        }
        return (call, waiter, observed ? (traceID, url) : nil, false)
    }

    /// A fresh trace id when events are observed; without a sink none is needed (`UUID()` reads
    /// /dev/urandom on Linux: three system calls per request for nothing).
    private func makeTraceID() -> UUID {
        observed ? UUID() : Self.unobservedTraceID
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
        key: SingleFlightTable.Key?
    ) -> Execution {
        let urlRequest: URLRequest
        var invalid: NetworkError?
        var authority: String? = perHost ? "" : nil  // non-nil asks the builder for it
        let limitsHosts = hostLimiters != nil || hostRates != nil || hostAdaptiveLimiters != nil
        let hedging = configuration.hedging.flatMap { policy in
            policy.maxAttempts > 1 && (Self.hedgeable.contains(method) || HeaderValidation.containsIdempotencyKey(headers))
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
            urlRequest: urlRequest,
            invalid: invalid,
            timeout: timeout.isFinite ? .clamped(seconds: timeout, upperBound: .seconds(Int64.max / 2)) : nil,
            maximumBodySize: bodyLimit ?? configuration.maximumResponseBodySize,
            mayRetry: retries && (method.isIdempotent || HeaderValidation.containsIdempotencyKey(headers)),
            traceID: traceID,
            started: started,
            priority: priority,
            key: key,
            deadline: deadline,
            breaker: breakerRegistry.flatMap { registry in authority.map { registry.breaker(forHost: $0) } } ?? sharedBreaker,
            authority: limitsHosts ? authority : nil,
            hedging: hedging,
            throttle: hostThrottles.flatMap { throttles in authority.map { throttles.limiter(forAuthority: $0) } },
            limiterPriority: priorityForLimits,
            inCallersTask: inCallersTask
        )
    }

    // MARK: - One logical request: attempts, retries, events

    /// The whole logical request, in the call's task (or its caller's): attempts and retries.
    func run(_ call: SharedCall) async {
        if observed { await emitStarted(call) }
        if let invalid = call.execution.invalid {
            return await end(call, invalid, attempt: 0)
        }
        rules.budget?.recordRequest()
        await attempts(call, from: 0, afterTimeout: nil)
    }

    /// The task running `call` was cancelled at attempt `attempt` (before it, during it, or in the
    /// backoff after it). For a call run in its caller's task, that is the caller leaving: when
    /// others still wait on the call (a shared read they joined), the request carries on in a task
    /// of its own — from `resumingAt` (by default `attempt` again: the cancelled attempt is sent
    /// anew), not before `notBefore` on the engine's clock (what was left of a backoff) — and this
    /// caller leaves with `.cancelled` (`response(for:)` reads it). Otherwise, and always for a
    /// call in a task of its own (cancelled only when its last waiter left), the request ends as
    /// cancelled.
    private func callerCancelled(_ call: SharedCall, attempt: Int, resumingAt: Int? = nil, notBefore: Duration? = nil) async {
        if call.execution.inCallersTask, call.execution.key != nil {
            let next = resumingAt ?? attempt
            let handed = call.handOver(priority: call.execution.priority) {
                if let notBefore {
                    let left = notBefore - self.time.now()
                    if left > .zero, (try? await self.time.sleep(left)) == nil {
                        return await self.end(call, .cancelled, attempt: attempt)  // every waiter left meanwhile
                    }
                }
                await self.attempts(call, from: next, afterTimeout: nil)
            }
            if handed { return }
        }
        await end(call, .cancelled, attempt: attempt)
    }

    /// Attempt `attempt` of `call` timed out (the watchdog's deadline passed): unless its response
    /// came first, the rest of the request moves to a new task at the caller's priority.
    func attemptTimedOut(_ call: SharedCall, attempt: Int) {
        call.timeOut(attempt: attempt, priority: call.execution.priority) { expired in
            await self.attempts(call, from: attempt, afterTimeout: expired)
        }
    }

    /// Runs attempts from `first` until the request succeeds, fails for good, or a timeout hands the
    /// rest to a new task. With `afterTimeout`, attempt `first` has already timed out and this is
    /// the task the watchdog started to carry on. The decisions are `RequestStateMachine`'s; this
    /// loop performs its actions.
    ///
    /// Every event is built in an out-of-line helper: an async frame holds every value kept across
    /// an `await`, so keeping those few keeps this frame small (figures in Benchmarks/README.md)
    /// and the task needs fewer allocator slabs.
    private func attempts(
        _ call: SharedCall,
        from first: Int,
        afterTimeout: TimedOutAttempt?
    ) async {
        let time = self.time
        var machine: RequestStateMachine
        var action: RequestStateMachine.Action
        if let expired = afterTimeout {
            machine = RequestStateMachine(cutAttempt: first)
            action = machine.attemptCut(expired, cancelled: Task.isCancelled, request: call.execution, rules: rules, now: time.now)
        } else {
            machine = RequestStateMachine(attempt: first)
            action = machine.startAttempt(
                cancelled: Task.isCancelled, deadline: call.execution.deadline, now: time.now, breaker: call.execution.breaker)
        }
        while true {
            switch consume action {
            case .send(let attempt, let permit):
                guard let result = await perform(call, attempt: attempt, permit: permit) else {
                    return  // timed out: the watchdog's task carries on
                }
                action = machine.attemptEnded(
                    result, permit: permit, cancelled: Task.isCancelled, request: call.execution, rules: rules, now: time.now)
            case .backOff(let delay, let attempt, let until):
                if observed { await emitRetryScheduled(call, attempt: attempt, delay: delay) }
                do {
                    // From the decision, not from the event: a slow sink does not lengthen it.
                    let left = delay > .zero ? until - time.now() : .zero
                    if left > .zero { try await time.sleep(left) }
                    machine.backoffEnded()
                    action = machine.startAttempt(
                        cancelled: Task.isCancelled, deadline: call.execution.deadline, now: time.now, breaker: call.execution.breaker)
                } catch {
                    action = machine.backoffInterrupted()
                }
            case .succeed(let response, let attempt):
                if observed { await emitSucceeded(call, status: response.1.statusCode, attempt: attempt) }
                return finish(call, .success(response))
            case .fail(let error, let response, let attempt, let throttled):
                if throttled, let throttleSink { await emitRetryThrottled(call, attempt: attempt, sink: throttleSink) }
                return await end(call, error, attempt: attempt, response: response)
            case .leave(let attempt, let resumingAt, let notBefore):
                return await callerCancelled(call, attempt: attempt, resumingAt: resumingAt, notBefore: notBefore)
            }
        }
    }

    /// One attempt, in the call's task, bounded by the request's timeout — or by what is left of
    /// its total deadline, when that is sooner — on the engine's clock. Returns `nil` when that
    /// limit came first: the watchdog has then moved the rest of the request (the timed-out
    /// result, retries) to a new task and cancelled this one (at once, or as soon as `start` has
    /// recorded it), so neither a retry nor the waiters wait for the transport to wind down
    /// (libcurl-based URLSession can take seconds to acknowledge a cancel under load). Non-HTTP
    /// responses become `invalidResponse`.
    ///
    /// What is decided before and after the transport call is in synchronous helpers (`arm`,
    /// `disarm`): an async function's frame holds every value it keeps across an `await`, and the
    /// attempt's frames must fit the task's first allocator slab, or every request pays a `malloc`
    /// and a `free` for another (Benchmarks/README.md, "Cost of the strategies"). Inlined into
    /// `attempts`, as is `call(_:on:)` into it: each async function called on its own costs a
    /// frame, a hop check on the executor and a return per request (about 500 instructions).
    @inline(__always)
    private func perform(
        _ call: SharedCall,
        attempt: Int,
        permit: CircuitBreaker.Permit?
    ) async -> Result<(Data, HTTPURLResponse), NetworkError>? {
        if call.execution.inCallersTask { return await sessionTimedAttempt(call) }
        let registration = arm(call, attempt: attempt, permit: permit)
        // Without hedging or host limits — or with a free place in the adaptive limit, when that
        // is the only one — the session is called straight from here: each async layer between
        // costs a frame on every request.
        let result: Result<(Data, HTTPURLResponse), NetworkError>
        if call.execution.isDirect {
            result = await Self.call(call, on: session)
        } else if let (adaptive, permit) = freeAdaptivePlace(call) {
            call.markSent(attempt: attempt)
            result = await Self.call(call, on: session)
            Self.release(permit, of: adaptive, after: result, call, attempt: attempt)
        } else {
            result = await send(call, attempt: attempt)
        }
        guard let registration else { return result }
        return disarm(call, attempt: attempt, registration) ? result : nil
    }

    /// An attempt of a request run in its caller's task: the session bounds it by the request's
    /// timeout — or by what is left of its total deadline, when that is sooner, and then its
    /// timeout is `deadlineExceeded` — and ends it when the caller is cancelled. No watchdog.
    private func sessionTimedAttempt(_ call: SharedCall) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        guard let deadline = call.execution.deadline else { return await Self.call(call, on: session) }
        let left = deadline - time.now()
        if let timeout = call.execution.timeout, timeout < left { return await Self.call(call, on: session) }
        var urlRequest = call.execution.urlRequest
        // At least a millisecond: a session may read a zero or negative interval as no limit.
        urlRequest.timeoutInterval = max(left.seconds, 0.001)
        let result = await Self.call(urlRequest, maximumBodySize: call.execution.maximumBodySize, on: session)
        if case .failure(.timedOut) = result { return .failure(.deadlineExceeded) }
        return result
    }

    /// A free place in the host's adaptive limit, when that limit is the only thing between the
    /// attempt and the session (no hedging, no rate or fixed limit); `nil` otherwise, and when
    /// the limit is full (then `sendOnce` waits in its line).
    @inline(__always)
    private func freeAdaptivePlace(_ call: SharedCall) -> (AdaptiveConcurrencyLimiter, AdaptiveConcurrencyLimiter.Permit)? {
        guard call.execution.hedging == nil, hostRates == nil, hostLimiters == nil,
            let hostAdaptiveLimiters, let authority = call.execution.authority
        else { return nil }
        let adaptive = hostAdaptiveLimiters.limiter(forAuthority: authority)
        guard let permit = adaptive.tryAcquire(priority: call.execution.limiterPriority) else { return nil }
        return (adaptive, permit)
    }

    /// Opens `attempt` and schedules its limit with the watchdog: the request's timeout, or what
    /// is left of its total deadline when that is sooner. `nil` when the attempt has no limit.
    @inline(never)
    private func arm(_ call: SharedCall, attempt: Int, permit: CircuitBreaker.Permit?) -> DeadlineWatchdog.Registration? {
        var limit = call.execution.timeout
        var endsAtDeadline = false
        if let deadline = call.execution.deadline {
            let left = deadline - time.now()
            if limit.map({ left <= $0 }) ?? true {
                limit = left
                endsAtDeadline = true
            }
        }
        guard let limit else { return nil }
        // An attempt that must wait for a host's limits is not on the wire until it has its
        // permits: if its limit passes before, the breaker does not count it.
        call.open(attempt: attempt, permit: permit, endsAtDeadline: endsAtDeadline, sent: call.execution.authority == nil)
        return watchdog.schedule(call, attempt: attempt, after: limit)
    }

    /// Cancels the attempt's limit and claims its response: false when the limit came first (the
    /// watchdog's task carries on and this one stops).
    @inline(never)
    private func disarm(_ call: SharedCall, attempt: Int, _ registration: DeadlineWatchdog.Registration) -> Bool {
        watchdog.cancel(registration)
        guard call.claim(attempt: attempt) else {
            testHooks.lateAnswerDropped()
            return false
        }
        return true
    }

    /// Sends the attempt: hedged when the request may be, else once.
    private func send(_ call: SharedCall, attempt: Int) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        let execution = call.execution
        guard let hedging = execution.hedging else {
            return await sendOnce(call, attempt: attempt)
        }
        return await hedge(call, attempt: attempt, policy: hedging)
    }

    @inline(never)
    private func hedge(
        _ call: SharedCall,
        attempt: Int,
        policy: HedgingPolicy
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        let execution = call.execution
        let budget = rules.budget
        var onHedge: (@Sendable (Int, TimeInterval) async -> Void)?
        if let sink = hedgeSink {
            let traceID = execution.traceID
            onHedge = { @Sendable copy, after in
                await sink.recordHedge(HedgeEvent(traceID: traceID, attempt: attempt, copy: copy, after: after))
            }
        }
        let throttle = execution.throttle
        let race = HedgeRace(
            policy: policy,
            time: time,
            send: { copy in await self.sendOnce(call, attempt: attempt, hedge: copy > 0) },
            mayHedge: { (throttle?.allowsRetry ?? true) && (budget?.tryWithdraw() ?? true) },
            onHedge: onHedge
        )
        return await race.run()
    }

    /// One copy of an attempt: through the host's rate limit and concurrency limit when there
    /// are any (a token first: tokens measure starts), then the session. The host's limiters are
    /// looked up for each copy, so a limiter dropped from the table while idle is never used again.
    private func sendOnce(_ call: SharedCall, attempt: Int, hedge: Bool = false) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        guard let authority = call.execution.authority else {
            return await Self.call(call, on: session)
        }
        let rate = hostRates?.limiter(forAuthority: authority)
        let limiter = hostLimiters?.limiter(forAuthority: authority)
        let adaptive = hostAdaptiveLimiters?.limiter(forAuthority: authority)
        let session = session
        // Each copy takes a rate token, then its adaptive place, then its fixed place: a copy
        // waiting in the adaptive line (a background one, say) holds no fixed place an
        // interactive copy could use.
        do {
            if rate == nil, limiter == nil, let adaptive {
                // The adaptive limit alone (its usual use): no closures on the path.
                let permit = try await adaptivePlace(adaptive, call, hedge: hedge)
                call.markSent(attempt: attempt)
                let result = await Self.call(call, on: session)
                Self.release(permit, of: adaptive, after: result, call, attempt: attempt)
                return result
            }
            let onTheWire = { @Sendable () async -> Result<(Data, HTTPURLResponse), NetworkError> in
                call.markSent(attempt: attempt)
                return await Self.call(call, on: session)
            }
            if adaptive == nil {  // the fixed limits only: as few closures as they need
                switch (rate, limiter) {
                case (nil, nil): return await onTheWire()
                case (nil, let limiter?): return try await limiter.withPermit { await onTheWire() }
                case (let rate?, nil): return try await rate.withPermit { await onTheWire() }
                case (let rate?, let limiter?): return try await rate.withPermit { try await limiter.withPermit { await onTheWire() } }
                }
            }
            let placed = { @Sendable () async throws -> Result<(Data, HTTPURLResponse), NetworkError> in
                guard let limiter else { return await onTheWire() }
                return try await limiter.withPermit { await onTheWire() }
            }
            let limited = { @Sendable () async throws -> Result<(Data, HTTPURLResponse), NetworkError> in
                guard let adaptive else { return try await placed() }
                let permit = try await self.adaptivePlace(adaptive, call, hedge: hedge)
                let result: Result<(Data, HTTPURLResponse), NetworkError>
                do {
                    result = try await placed()
                } catch {
                    adaptive.release(permit, outcome: .ignored)  // refused or cancelled by the fixed limit
                    throw error
                }
                Self.release(permit, of: adaptive, after: result, call, attempt: attempt)
                return result
            }
            guard let rate else { return try await limited() }
            return try await rate.withPermit { try await limited() }
        } catch let rejection as LimiterRejection {
            return .failure(.limited(rejection))
        } catch {
            return .failure(.cancelled)  // cancelled while waiting for a place
        }
    }

    /// A place in the host's adaptive limit for a copy: a hedge takes the background share (it is
    /// extra load, sent only in case), any other copy its request's. A free place is taken
    /// without a suspension point; only a full limiter is waited on. Inlined: as a call of its
    /// own, an async function costs a frame allocation per request even when nothing waits.
    @inline(__always)
    private func adaptivePlace(_ adaptive: AdaptiveConcurrencyLimiter, _ call: SharedCall, hedge: Bool) async throws -> AdaptiveConcurrencyLimiter.Permit {
        let priority = hedge ? RequestPriority.background : call.execution.limiterPriority
        if let free = adaptive.tryAcquire(priority: priority) { return free }
        return try await adaptive.acquire(priority: priority)
    }

    /// Gives a copy's adaptive place back with what its result says of the host. Whether the
    /// attempt timed out is asked (a lock) only of a cancelled copy.
    private static func release(
        _ permit: AdaptiveConcurrencyLimiter.Permit,
        of adaptive: AdaptiveConcurrencyLimiter,
        after result: Result<(Data, HTTPURLResponse), NetworkError>,
        _ call: SharedCall,
        attempt: Int
    ) {
        let timedOut = if case .failure(.cancelled) = result { call.timedOut(attempt: attempt) } else { false }
        adaptive.release(permit, outcome: RequestStateMachine.limiterOutcome(of: result, timedOut: timedOut))
    }

    /// The transport call. Takes the call, not its `Execution`: a struct of that size passed by
    /// value is copied into the caller's frame.
    @inline(__always)
    private static func call(
        _ call: SharedCall,
        on session: any NetworkSession
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        await Self.call(call.execution.urlRequest, maximumBodySize: call.execution.maximumBodySize, on: session)
    }

    @inline(__always)
    private static func call(
        _ urlRequest: URLRequest,
        maximumBodySize: Int?,
        on session: any NetworkSession
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        do {
            let (data, response) = try await session.data(for: urlRequest, maximumBodySize: maximumBodySize)
            guard let http = response as? HTTPURLResponse else { return .failure(.invalidResponse) }
            return .success((data, http))
        } catch {
            // A session may report our cancellation as some other error; the caller asked to stop.
            if Task.isCancelled { return .failure(.cancelled) }
            return .failure(NetworkError(mapping: error))
        }
    }

    // MARK: - Ending a request

    /// Unregisters a finished call from the single-flight table and answers its waiters.
    private func finish(
        _ call: SharedCall,
        _ outcome: Result<(Data, HTTPURLResponse), NetworkError>
    ) {
        // Unregister before answering, so a send after completion starts a fresh call.
        inFlight.remove(call)
        call.complete(outcome)
    }

    /// Ends a request without success: emits `failed`, then answers the waiters with the final
    /// non-2xx response when there is one (`send` turns it into `httpError`), else with `error`.
    @inline(never)
    private func end(
        _ call: SharedCall,
        _ error: NetworkError,
        attempt: Int,
        response: (Data, HTTPURLResponse)? = nil
    ) async {
        if let sink {
            await sink.record(.failed(traceID: call.execution.traceID, error: error, attempt: attempt))
        }
        finish(call, response.map { .success($0) } ?? .failure(error))
    }

    // MARK: - Events (out of line: only an observed engine pays for building them)

    @inline(never)
    private func emitStarted(_ call: SharedCall) async {
        await sink?.record(.started(traceID: call.execution.traceID, url: call.execution.url, method: call.execution.method))
    }

    @inline(never)
    private func emitDeduplicated(_ traceID: UUID, url: URL, method: HTTPMethod) async {
        await sink?.record(.deduplicated(traceID: traceID, url: url, method: method))
    }

    @inline(never)
    private func emitSucceeded(_ call: SharedCall, status: Int, attempt: Int) async {
        let duration = (time.now() - call.execution.started).seconds
        await sink?.record(.succeeded(traceID: call.execution.traceID, statusCode: status, duration: duration, attempt: attempt))
    }

    @inline(never)
    private func emitRetryThrottled(_ call: SharedCall, attempt: Int, sink: any RetryThrottlingEventSink) async {
        await sink.recordRetryThrottled(RetryThrottledEvent(traceID: call.execution.traceID, url: call.execution.url, attempt: attempt))
    }

    private func emitRetryScheduled(_ call: SharedCall, attempt: Int, delay: Duration) async {
        await sink?.record(.retryScheduled(traceID: call.execution.traceID, attempt: attempt, delay: delay.seconds))
    }
}
