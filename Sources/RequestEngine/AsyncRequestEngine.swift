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
        if options.deduplicatedMethods.contains(request.method) {
            return try await sendShared(request)
        }
        return try await execute(request, traceID: makeTraceID()).get()
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

    private nonisolated func sendShared(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let identity = RequestIdentity(request)
        let (call, waiter, joined) = joinOrStart(identity)
        if joined {
            await emit(.deduplicated(traceID: makeTraceID(), url: request.url, method: request.method))
        } else {
            call.attach(Task {
                let outcome = await self.execute(request, traceID: self.makeTraceID())
                // Unregister before answering, so a send after completion starts a fresh call.
                // A newer call may have replaced this one after it was abandoned: leave that one.
                self.inFlight.withLock { calls in
                    if calls[identity] === call { calls[identity] = nil }
                }
                call.complete(outcome)
            })
        }
        return try await call.wait(waiter).get()
    }

    /// Joins the call in flight for `identity`, or registers a new one (lock order: the table,
    /// then the call's own lock; nothing takes them the other way round).
    private nonisolated func joinOrStart(_ identity: RequestIdentity) -> (SharedCall, Int, joined: Bool) {
        inFlight.withLock { calls in
            if let existing = calls[identity], let waiter = existing.join() {
                return (existing, waiter, true)
            }
            let (call, waiter) = SharedCall.started()
            calls[identity] = call
            return (call, waiter, false)
        }
    }

    // MARK: - One logical request: attempts, retries, events

    /// Runs the attempts of one logical request. `.success` carries the final HTTP response of any
    /// status (a non-2xx one once retrying has stopped); `.failure` means no response was obtained.
    private nonisolated func execute(
        _ request: some NetworkRequest,
        traceID: UUID
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        let started = time.now()
        await emit(.started(traceID: traceID, url: request.url, method: request.method))

        let urlRequest: URLRequest
        do {
            urlRequest = try request.makeURLRequest()
        } catch {
            return await fail(traceID, error, attempt: 0)
        }
        let timeout: Duration? = request.timeout.isFinite
            ? .clamped(seconds: request.timeout, upperBound: .seconds(Int64.max / 2))
            : nil
        let mayRetry = retryPolicy != nil && (request.method.isIdempotent || request.hasIdempotencyKey)
        retryBudget?.recordRequest()

        var attempt = 0
        while true {
            if Task.isCancelled { return await fail(traceID, .cancelled, attempt: attempt) }
            var permit: CircuitBreaker.Permit?
            if let circuitBreaker {
                guard let granted = circuitBreaker.acquire() else {
                    return await fail(traceID, .circuitOpen, attempt: attempt)
                }
                permit = granted
            }

            let result = await perform(urlRequest, timeout: timeout)
            if let permit { circuitBreaker?.record(Self.breakerOutcome(of: result), for: permit) }

            let error: NetworkError
            var retryAfter: Duration?
            var finalResponse: (Data, HTTPURLResponse)?
            switch result {
            case .success(let (data, response)):
                if (200...299).contains(response.statusCode) {
                    await emit(.succeeded(
                        traceID: traceID,
                        statusCode: response.statusCode,
                        duration: (time.now() - started).seconds,
                        attempt: attempt
                    ))
                    return .success((data, response))
                }
                error = .httpError(statusCode: response.statusCode, data: data)
                finalResponse = (data, response)
                if options.honorsRetryAfter, response.statusCode == 429 || response.statusCode == 503 {
                    retryAfter = RetryAfter.delay(headerValue: response.value(forHTTPHeaderField: HTTPHeader.retryAfter))
                }
            case .failure(let failure):
                error = failure
            }

            guard mayRetry, error.isRetryable, !Task.isCancelled,
                  let seconds = retryPolicy?.delay(forAttempt: attempt)
            else { return await fail(traceID, error, attempt: attempt, response: finalResponse) }
            var delay = RetryPolicyDelay.sanitized(seconds, maximum: options.maximumRetryDelay)
            if let retryAfter { delay = min(retryAfter, options.maximumRetryAfter) }
            if let retryBudget, !retryBudget.tryWithdraw() {
                return await fail(traceID, error, attempt: attempt, response: finalResponse)
            }

            await emit(.retryScheduled(traceID: traceID, attempt: attempt, delay: delay.seconds))
            do {
                if delay > .zero { try await time.sleep(delay) }
            } catch {
                return await fail(traceID, .cancelled, attempt: attempt)
            }
            attempt += 1
        }
    }

    /// One attempt, bounded by `timeout` on the engine's clock. Non-HTTP responses become `invalidResponse`.
    private nonisolated func perform(
        _ urlRequest: URLRequest,
        timeout: Duration?
    ) async -> Result<(Data, HTTPURLResponse), NetworkError> {
        let session = self.session
        // The attempt runs in a task of its own, and the caller waits on a one-shot box that the
        // first of three things fills: the attempt's result, the watchdog's timeout, or the
        // caller's cancellation. So a timeout cancels just this attempt (not the caller, whose later
        // retries must still run), and neither a timeout nor a cancellation waits for the transport
        // to wind down (libcurl-based URLSession can take seconds to acknowledge a cancel under load).
        let box = OneShot<Result<(Data, HTTPURLResponse), NetworkError>>()
        let attempt = Task { box.fill(await Self.call(urlRequest, on: session)) }
        let registration = timeout.map { timeout in
            watchdog.schedule(after: timeout) {
                box.fill(.failure(.timedOut))
                attempt.cancel()
            }
        }
        let result = await withTaskCancellationHandler {
            await box.value()
        } onCancel: {
            box.fill(.failure(.cancelled))
            attempt.cancel()
        }
        if let registration { watchdog.cancel(registration) }
        return result
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
