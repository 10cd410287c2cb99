import Foundation
import Retry
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends requests with retries, typed errors, prompt cancellation, per-attempt timeouts and
/// single-flight deduplication of identical concurrent reads.
///
/// ```swift
/// let engine = AsyncRequestEngine(retryPolicy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0))
/// let (data, response) = try await engine.send(R(url: url))
/// ```
///
/// What the engine guarantees (see Docs/RequestEngine.md for every edge case):
/// - **Success** is a 2xx response; anything else is thrown as `NetworkError`.
/// - **Retries** happen only for `NetworkError.isRetryable` failures, only while `retryPolicy` returns a
///   delay, only while the `retryBudget` (if any) has tokens, and for POST/PATCH only when the request
///   carries an `Idempotency-Key` header. On 429 and 503 a valid `Retry-After` replaces the policy's
///   delay, capped at `Options.maximumRetryAfter`. Policy delays are sanitised: negative or NaN → 0,
///   infinite or huge → `Options.maximumRetryDelay`. Without a policy nothing is retried.
/// - **Timeout**: each attempt is limited to the request's `timeout`, measured on the engine's clock.
/// - **Deduplication**: concurrent sends of GET, HEAD and OPTIONS (configurable) with the same
///   `RequestIdentity` share one network call and its result.
/// - **Cancellation**: a cancelled caller gets `NetworkError.cancelled` at once; a shared call is
///   cancelled only when its last waiter is.
/// - **Circuit breaker** (optional): while open, sends fail fast with `NetworkError.circuitOpen`.
/// - **Events** go to `eventSink` with one traceID per logical request; no sink, no cost.
public actor AsyncRequestEngine: RequestSending {
    /// Tuning knobs with safe defaults.
    public struct Options: Sendable {
        /// Longest wait honoured from a `Retry-After` header (longer values are capped). Default 60 s.
        public var maximumRetryAfter: Duration
        /// Longest wait taken from a retry policy (longer, infinite or NaN values are capped or zeroed). Default 300 s.
        public var maximumRetryDelay: Duration
        /// Methods whose identical concurrent requests share one call. Default GET, HEAD, OPTIONS.
        public var deduplicatedMethods: Set<HTTPMethod>
        /// Whether `Retry-After` on 429/503 replaces the policy's delay. Default true.
        public var honorsRetryAfter: Bool

        public init(
            maximumRetryAfter: Duration = .seconds(60),
            maximumRetryDelay: Duration = RetryPolicyDelay.defaultMaximum,
            deduplicatedMethods: Set<HTTPMethod> = [.get, .head, .options],
            honorsRetryAfter: Bool = true
        ) {
            self.maximumRetryAfter = max(.zero, maximumRetryAfter)
            self.maximumRetryDelay = max(.zero, maximumRetryDelay)
            self.deduplicatedMethods = deduplicatedMethods
            self.honorsRetryAfter = honorsRetryAfter
        }
    }

    public nonisolated let session: any NetworkSession
    public nonisolated let retryPolicy: (any RetryPolicy)?
    public nonisolated let eventSink: (any RequestEventSink)?
    public nonisolated let retryBudget: RetryBudget?
    public nonisolated let circuitBreaker: CircuitBreaker?
    public nonisolated let options: Options
    private nonisolated let time: TimeSource
    private nonisolated let watchdog: DeadlineWatchdog

    /// Shared calls in flight, by identity (deduplicated methods only). A lock, not actor state:
    /// every deduplicated send joins or starts a call here, and an actor hop each way measurably
    /// slowed the request path (Benchmarks/README.md).
    private nonisolated let inFlight = Locked<[RequestIdentity: SharedCall]>([:])

    /// - Parameters:
    ///   - session: the transport; `URLSession.shared` by default.
    ///   - retryPolicy: when and how long to wait before retrying; `nil` (the default) never retries.
    ///   - eventSink: receives `RequestEvent`s; `nil` emits nothing.
    ///   - retryBudget: caps retries across all requests of this engine; `nil` means no cap.
    ///   - circuitBreaker: fails fast while the dependency is down; `nil` means none.
    ///   - options: caps and deduplication settings.
    ///   - clock: the clock timeouts and backoff sleeps run on (inject `ManualClock` in tests).
    public init(
        session: any NetworkSession = URLSession.shared,
        retryPolicy: (any RetryPolicy)? = nil,
        eventSink: (any RequestEventSink)? = nil,
        retryBudget: RetryBudget? = nil,
        circuitBreaker: CircuitBreaker? = nil,
        options: Options = Options(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.session = session
        self.retryPolicy = retryPolicy
        self.eventSink = eventSink
        self.retryBudget = retryBudget
        self.circuitBreaker = circuitBreaker
        self.options = options
        self.time = TimeSource(clock)
        self.watchdog = DeadlineWatchdog(time: time)
    }

    deinit {
        watchdog.shutdown()
    }

    /// Sends `request` and returns the body and response of a 2xx reply.
    ///
    /// - Throws: `NetworkError` — the last failure once retrying stops, `.cancelled` when the calling
    ///   task is cancelled, `.invalidRequest` before anything is sent for a malformed request.
    @discardableResult
    public nonisolated func send(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await response(for: request)
        guard (200...299).contains(response.statusCode) else {
            throw NetworkError.httpError(statusCode: response.statusCode, data: data)
        }
        return (data, response)
    }

    /// Like `send(_:)` — same retries, deduplication, timeouts and events — but returns the final
    /// HTTP response whatever its status, so a caller can read headers such as `Retry-After` on a
    /// 503. Throws `NetworkError` only when no HTTP response was obtained (offline, transport
    /// failure, timeout, invalid reply, cancellation, open circuit, invalid request).
    public nonisolated func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        guard options.deduplicatedMethods.contains(request.method) else {
            let call = SharedCall()
            call.start { await self.run(request, on: call, registeredAs: nil) }
            return try await call.wait(SharedCall.firstWaiterID).get()
        }
        let identity = RequestIdentity(request)
        let (call, waiter, joined) = joinOrStart(identity)
        if joined {
            await emit(.deduplicated(traceID: makeTraceID(), url: request.url, method: request.method))
        } else {
            call.start { await self.run(request, on: call, registeredAs: identity) }
        }
        return try await call.wait(waiter).get()
    }

    /// The number of distinct shared calls in flight now (deduplicated methods only).
    public nonisolated var inFlightCount: Int { inFlight.withLock { $0.count } }

    /// A fresh trace id when events are observed; without a sink none is needed (`UUID()` reads
    /// /dev/urandom on Linux: three system calls per request for nothing).
    private nonisolated func makeTraceID() -> UUID {
        eventSink == nil ? Self.unobservedTraceID : UUID()
    }

    private static let unobservedTraceID = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))

    // MARK: - Single flight

    /// Joins the call in flight for `identity`, or registers a new one (lock order: the table,
    /// then the call's own lock; nothing takes them the other way round).
    private nonisolated func joinOrStart(_ identity: RequestIdentity) -> (SharedCall, Int, joined: Bool) {
        inFlight.withLock { calls in
            if let existing = calls[identity], let waiter = existing.join() {
                return (existing, waiter, true)
            }
            let call = SharedCall()
            calls[identity] = call
            return (call, SharedCall.firstWaiterID, false)
        }
    }

    // MARK: - One logical request: attempts, retries, events

    /// What the attempts of one logical request share; a task that takes over after a timeout
    /// carries on from it.
    private struct Execution: Sendable {
        let urlRequest: URLRequest
        let traceID: UUID
        let started: Duration
        let timeout: Duration?
        let mayRetry: Bool
        let priority: TaskPriority
        /// The single-flight table key this call is registered under, if any.
        let identity: RequestIdentity?
    }

    /// The whole logical request, in the call's task: prepare, then attempts and retries.
    private nonisolated func run(
        _ request: some NetworkRequest,
        on call: SharedCall,
        registeredAs identity: RequestIdentity?
    ) async {
        let traceID = makeTraceID()
        let started = eventSink == nil ? .zero : time.now()  // read only for `succeeded`'s duration
        await emit(.started(traceID: traceID, url: request.url, method: request.method))

        let urlRequest: URLRequest
        do {
            urlRequest = try request.makeURLRequest()
        } catch {
            finish(call, identity, await fail(traceID, error, attempt: 0))
            return
        }
        let timeout: Duration? = request.timeout.isFinite
            ? .clamped(seconds: request.timeout, upperBound: .seconds(Int64.max / 2))
            : nil
        let mayRetry = retryPolicy != nil && (request.method.isIdempotent || request.hasIdempotencyKey)
        retryBudget?.recordRequest()
        let execution = Execution(
            urlRequest: urlRequest,
            traceID: traceID,
            started: started,
            timeout: timeout,
            mayRetry: mayRetry,
            priority: Task.currentPriority,
            identity: identity
        )
        await attempts(execution, on: call, from: 0, afterTimeout: nil)
    }

    /// An attempt whose timeout fired: the task the watchdog starts carries on from it.
    private struct TimedOutAttempt: Sendable {
        /// The attempt's circuit-breaker permit, if a breaker is configured.
        let permit: CircuitBreaker.Permit?
        /// Every waiter had left before the timeout fired: the request ends as cancelled.
        let abandoned: Bool
    }

    /// Runs attempts from `first` until the request succeeds, fails for good, or a timeout hands the
    /// rest to a new task. With `afterTimeout`, attempt `first` has already timed out and this is
    /// the task the watchdog started to carry on.
    private nonisolated func attempts(
        _ execution: Execution,
        on call: SharedCall,
        from first: Int,
        afterTimeout: TimedOutAttempt?
    ) async {
        let traceID = execution.traceID
        var attempt = first
        var timedOut = afterTimeout
        while true {
            let result: Result<(Data, HTTPURLResponse), NetworkError>
            if let expired = timedOut {
                timedOut = nil
                // A call whose waiters all left before the timeout fired ends as cancelled, as it
                // would have without the timeout: no retry, ignored by the breaker.
                result = .failure(expired.abandoned || Task.isCancelled ? .cancelled : .timedOut)
                if let permit = expired.permit { circuitBreaker?.record(Self.breakerOutcome(of: result), for: permit) }
            } else {
                if Task.isCancelled { return finish(call, execution.identity, await fail(traceID, .cancelled, attempt: attempt)) }
                var permit: CircuitBreaker.Permit?
                if let circuitBreaker {
                    guard let granted = circuitBreaker.acquire() else {
                        return finish(call, execution.identity, await fail(traceID, .circuitOpen, attempt: attempt))
                    }
                    permit = granted
                }
                guard let outcome = await perform(execution, on: call, attempt: attempt, permit: permit) else {
                    return  // timed out: the watchdog's task carries on
                }
                result = outcome
                if let permit { circuitBreaker?.record(Self.breakerOutcome(of: result), for: permit) }
            }

            let error: NetworkError
            var retryAfter: Duration?
            var finalResponse: (Data, HTTPURLResponse)?
            switch result {
            case .success(let (data, response)):
                if (200...299).contains(response.statusCode) {
                    await emit(.succeeded(
                        traceID: traceID,
                        statusCode: response.statusCode,
                        duration: (time.now() - execution.started).seconds,
                        attempt: attempt
                    ))
                    return finish(call, execution.identity, .success((data, response)))
                }
                error = .httpError(statusCode: response.statusCode, data: data)
                finalResponse = (data, response)
                if options.honorsRetryAfter, response.statusCode == 429 || response.statusCode == 503 {
                    retryAfter = RetryAfter.delay(headerValue: response.value(forHTTPHeaderField: HTTPHeader.retryAfter))
                }
            case .failure(let failure):
                error = failure
            }

            guard execution.mayRetry, error.isRetryable, !Task.isCancelled,
                  let seconds = retryPolicy?.delay(forAttempt: attempt)
            else { return finish(call, execution.identity, await fail(traceID, error, attempt: attempt, response: finalResponse)) }
            var delay = RetryPolicyDelay.sanitized(seconds, maximum: options.maximumRetryDelay)
            if let retryAfter { delay = min(retryAfter, options.maximumRetryAfter) }
            if let retryBudget, !retryBudget.tryWithdraw() {
                return finish(call, execution.identity, await fail(traceID, error, attempt: attempt, response: finalResponse))
            }

            await emit(.retryScheduled(traceID: traceID, attempt: attempt, delay: delay.seconds))
            do {
                if delay > .zero { try await time.sleep(delay) }
            } catch {
                return finish(call, execution.identity, await fail(traceID, .cancelled, attempt: attempt))
            }
            attempt += 1
        }
    }

    /// One attempt, in the call's task, bounded by the request's timeout on the engine's clock.
    /// Returns `nil` when the timeout came first: the watchdog has then moved the rest of the
    /// request (the timed-out result, retries) to a new task and cancelled this one, so neither a
    /// retry nor the waiters wait for the transport to wind down (libcurl-based URLSession can take
    /// seconds to acknowledge a cancel under load). Non-HTTP responses become `invalidResponse`.
    private nonisolated func perform(
        _ execution: Execution,
        on call: SharedCall,
        attempt: Int,
        permit: CircuitBreaker.Permit?
    ) async -> Result<(Data, HTTPURLResponse), NetworkError>? {
        guard let timeout = execution.timeout else {
            return await Self.call(execution.urlRequest, on: session)
        }
        call.open(attempt: attempt)
        let registration = watchdog.schedule(after: timeout) {
            call.timeOut(attempt: attempt, priority: execution.priority) { abandoned in
                await self.attempts(execution, on: call, from: attempt, afterTimeout: TimedOutAttempt(permit: permit, abandoned: abandoned))
            }
        }
        let result = await Self.call(execution.urlRequest, on: session)
        watchdog.cancel(registration)
        return call.claim(attempt: attempt) ? result : nil
    }

    /// Unregisters a finished call from the single-flight table and answers its waiters.
    private nonisolated func finish(
        _ call: SharedCall,
        _ identity: RequestIdentity?,
        _ outcome: Result<(Data, HTTPURLResponse), NetworkError>
    ) {
        // Unregister before answering, so a send after completion starts a fresh call.
        // A newer call may have replaced this one after it was abandoned: leave that one.
        if let identity {
            inFlight.withLock { calls in
                if calls[identity] === call { calls[identity] = nil }
            }
        }
        call.complete(outcome)
    }

    private static func call(
        _ urlRequest: URLRequest,
        on session: any NetworkSession
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        do {
            let (data, response) = try await session.data(for: urlRequest)
            guard let http = response as? HTTPURLResponse else { return .failure(.invalidResponse) }
            return .success((data, http))
        } catch {
            // A session may report our cancellation as some other error; the caller asked to stop.
            if Task.isCancelled { return .failure(.cancelled) }
            return .failure(NetworkError(mapping: error))
        }
    }

    /// How an attempt's result counts for the circuit breaker: only failures that say the
    /// dependency is unhealthy count against it.
    private static func breakerOutcome(of result: Result<(Data, HTTPURLResponse), NetworkError>) -> CircuitBreaker.Outcome {
        switch result {
        case .success(let (_, response)):
            let status = response.statusCode
            let unhealthy = (500...599).contains(status) && status != 501 || status == 408 || status == 429
            return unhealthy ? .failure : .success
        case .failure(let error):
            switch error {
            case .transport, .timedOut, .invalidResponse: return .failure
            case .httpError: return error.isRetryable ? .failure : .success
            case .noConnection, .cancelled, .circuitOpen, .invalidRequest, .underlying: return .ignored
            }
        }
    }

    /// Ends a request without success: emits `failed`, and hands back the final non-2xx response
    /// when there is one (`send` turns it into `httpError`).
    private nonisolated func fail(
        _ traceID: UUID,
        _ error: NetworkError,
        attempt: Int,
        response: (Data, HTTPURLResponse)? = nil
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        await emit(.failed(traceID: traceID, error: error, attempt: attempt))
        if let response { return .success(response) }
        return .failure(error)
    }

    @inline(__always)
    private nonisolated func emit(_ event: @autoclosure () -> RequestEvent) async {
        guard let eventSink else { return }
        await eventSink.record(event())
    }
}
