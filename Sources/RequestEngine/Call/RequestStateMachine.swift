import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One logical request's attempts as a value: which attempt comes next, whether it may start, what
/// follows its result (success, failure for good, a retry after a backoff), and how an attempt cut
/// by its timeout or its deadline ends. The task carrying the request (its caller's, one of its
/// own, or the one a timeout or a departure hands it to) holds one, feeds it each event and
/// performs the action it returns: sending, sleeping, emitting events, answering the waiters. It
/// keeps no clock and starts no task, so each transition is tested by hand
/// (`RequestStateMachineTests`).
///
/// ```
///            startAttempt               attemptEnded or attemptCut: retry
///   ready(n) ──────────► attempting(n) ─────────────────────────────────► backingOff(n + 1) ──backoffEnded──► ready(n + 1)
///      │                      ▲  │  success, failure for good,                   │
///      │ cancelled, deadline, │  │  retry throttled, cancelled                   │ backoffInterrupted
///      │ circuit open         │  ▼                                               ▼
///      └──────────────────────┼► finished ◄──────────────────────────────────────┘
///                 init(cutAttempt:): a successor after the attempt's timeout or deadline
/// ```
///
/// It decides with the request's strategies: it takes the circuit breaker's permit and reports
/// each attempt's outcome to it, reports to the host's retry throttle, asks the retry policy for a
/// delay and the budget for a token. Those are objects of their own, shared by requests and safe
/// to call from any thread; the machine holds none of them, its transitions are given them.
///
/// Who waits for the request, which task runs it and which side claims an attempt (its task, or
/// its timeout) is `SharedCallStateMachine`'s part, under the call's lock. This part needs no
/// lock: one task at a time carries the request, and a successor starts a machine of its own from
/// the attempt it is handed (`init(attempt:)`, `init(cutAttempt:)`).
///
/// Races it settles:
/// - the caller cancelled while an attempt is on the wire: an attempt that ends as cancelled while
///   its task is cancelled leaves (the engine hands the rest over, or ends the request as
///   cancelled); a transport may report the cancellation as some other failure, which then ends
///   the request with that failure: a cancelled task never schedules a retry;
/// - a timeout that fires after every waiter left: the cut attempt ends as cancelled (no retry,
///   nothing counted against the host), as it would have without the timeout;
/// - a retry due at or past the request's deadline: not scheduled, the request fails at once.
struct RequestStateMachine: Sendable {
    typealias Outcome = Result<(Data, ResponseHead), NetworkError>

    enum State: Sendable, Equatable {
        /// Attempt `attempt` may start.
        case ready(attempt: Int)
        /// Attempt `attempt` is on its way or on the wire.
        case attempting(attempt: Int)
        /// Attempt `attempt - 1` failed; `attempt` starts at `until` on the engine's clock (the
        /// decision's time plus the delay: what the retry event, the deadline check and a task
        /// carrying the request on after a departure all count from).
        case backingOff(attempt: Int, until: Duration)
        /// The request ended in this task (it succeeded, failed, or its task left).
        case finished
    }

    /// What the task carrying the request does next.
    enum Action: Sendable {
        /// Send attempt `attempt`, holding the breaker's permit when there is a breaker.
        case send(attempt: Int, permit: CircuitBreaker.Permit?)
        /// Report that attempt `attempt` is retried after `delay`, then sleep until `until` on the
        /// engine's clock (then `backoffEnded` or `backoffInterrupted`).
        case backOff(delay: Duration, attempt: Int, until: Duration)
        /// A 2xx answered attempt `attempt`: the request succeeds.
        case succeed((Data, ResponseHead), attempt: Int)
        /// The request fails with `error`; a final non-2xx response is handed back with it.
        /// `throttled`: a retry was due and the host's retry throttle refused it.
        case fail(NetworkError, response: (Data, ResponseHead)?, attempt: Int, throttled: Bool)
        /// The task carrying the request was cancelled at attempt `attempt`: the rest of the
        /// request may go on in another task from `resumingAt`, not before `notBefore` (what was
        /// left of a backoff), else the request ends as cancelled.
        case leave(attempt: Int, resumingAt: Int, notBefore: Duration?)
    }

    /// What a request's attempts are decided with, the same for every request of an engine.
    struct Rules: Sendable {
        let policy: (any RetryPolicy)?
        let budget: RetryBudget?
        /// The longest `Retry-After` honoured; `nil` when the configuration ignores it.
        let retryAfterCap: Duration?
        /// The longest policy delay slept.
        let maximumDelay: Duration
    }

    private(set) var state: State

    /// A machine for a request that starts (or goes on) at attempt `attempt`.
    init(attempt: Int = 0) {
        state = .ready(attempt: attempt)
    }

    /// A machine for the task that carries a request on after its attempt `attempt` was cut by
    /// its timeout or its deadline (`attemptCut` is its first event).
    init(cutAttempt attempt: Int) {
        state = .attempting(attempt: attempt)
    }

    /// The attempt in `ready` may start: `.send` unless the task is `cancelled`, the request's
    /// `deadline` has passed at `now` (read only when there is a deadline), or `breaker` refuses.
    @inline(__always)
    mutating func startAttempt(
        cancelled: @autoclosure () -> Bool,
        deadline: Duration?,
        now: () -> Duration,
        breaker: CircuitBreaker?
    ) -> Action {
        guard case .ready(let attempt) = state else { preconditionFailure("startAttempt in \(state)") }
        if cancelled() {
            state = .finished
            return .leave(attempt: attempt, resumingAt: attempt, notBefore: nil)
        }
        if let deadline, now() >= deadline {
            state = .finished
            return .fail(.deadlineExceeded, response: nil, attempt: attempt, throttled: false)
        }
        var permit: CircuitBreaker.Permit?
        if let breaker {
            guard let granted = breaker.acquire() else {
                state = .finished
                return .fail(.circuitOpen, response: nil, attempt: attempt, throttled: false)
            }
            permit = granted
        }
        state = .attempting(attempt: attempt)
        return .send(attempt: attempt, permit: permit)
    }

    /// The attempt's task has its result (it claimed the attempt before its timeout). It counts
    /// for the breaker through `permit`, then for the host's `throttle`, unless the task was
    /// `cancelled` and the attempt ended as cancelled: then the task leaves.
    @inline(__always)
    mutating func attemptEnded(
        _ result: Outcome,
        permit: CircuitBreaker.Permit?,
        cancelled: @autoclosure () -> Bool,
        request execution: Execution,
        rules: Rules,
        now: () -> Duration
    ) -> Action {
        guard case .attempting(let attempt) = state else { preconditionFailure("attemptEnded in \(state)") }
        if let permit { execution.breaker?.record(Self.breakerOutcome(of: result), for: permit) }
        if case .failure(.cancelled) = result, cancelled() {
            state = .finished
            return .leave(attempt: attempt, resumingAt: attempt, notBefore: nil)
        }
        return decide(after: result, attempt: attempt, cancelled: cancelled(), request: execution, rules: rules, now: now)
    }

    /// The attempt's limit passed before its result (`expired`, handed over by the call): it ends
    /// as `timedOut`, or `deadlineExceeded` when the limit was the request's deadline, or
    /// `cancelled` when every waiter had left or this task is `cancelled` (no retry, nothing
    /// counted against the host).
    mutating func attemptCut(
        _ expired: TimedOutAttempt,
        cancelled: @autoclosure () -> Bool,
        request execution: Execution,
        rules: Rules,
        now: () -> Duration
    ) -> Action {
        guard case .attempting(let attempt) = state else { preconditionFailure("attemptCut in \(state)") }
        let error: NetworkError =
            expired.abandoned || cancelled() ? .cancelled : expired.endsAtDeadline ? .deadlineExceeded : .timedOut
        let result: Outcome = .failure(error)
        if let permit = expired.permit {
            // Not on the wire (still waiting for a host's permit): nothing was learnt of the host.
            // On the wire and cut by the deadline: the host did not answer in the time the caller
            // had, which counts against it (a host that never answers must open its breaker even
            // when every request's deadline is shorter than its timeout).
            let outcome: CircuitBreaker.Outcome
            switch error {
            case .cancelled: outcome = .ignored
            case _ where !expired.sent: outcome = .ignored
            case .deadlineExceeded: outcome = .failure
            default: outcome = Self.breakerOutcome(of: result)
            }
            execution.breaker?.record(outcome, for: permit)
        }
        return decide(after: result, attempt: attempt, cancelled: cancelled(), request: execution, rules: rules, now: now)
    }

    /// The backoff slept its time: the next attempt may start.
    mutating func backoffEnded() {
        guard case .backingOff(let attempt, _) = state else { preconditionFailure("backoffEnded in \(state)") }
        state = .ready(attempt: attempt)
    }

    /// The task was cancelled while backing off: it leaves, the rest may go on from the next
    /// attempt once the backoff is over.
    mutating func backoffInterrupted() -> Action {
        guard case .backingOff(let attempt, let until) = state else {
            preconditionFailure("backoffInterrupted in \(state)")
        }
        state = .finished
        return .leave(attempt: attempt - 1, resumingAt: attempt, notBefore: until)
    }

    /// What follows an attempt's result: a 2xx succeeds; a retryable failure is retried while the
    /// request may be retried, the task is not cancelled, the policy gives a delay, a retry would
    /// start before the deadline, the host's throttle allows it and the budget grants a token
    /// (`Retry-After` on 429/503 replaces the policy's delay, capped); anything else fails.
    private mutating func decide(
        after result: Outcome,
        attempt: Int,
        cancelled: @autoclosure () -> Bool,
        request execution: Execution,
        rules: Rules,
        now: () -> Duration
    ) -> Action {
        if let throttle = execution.throttle { Self.record(result, in: throttle) }
        state = .finished
        let error: NetworkError
        var retryAfter: Duration?
        var finalResponse: (Data, ResponseHead)?
        switch result {
        case .success(let (data, response)):
            let status = response.statusCode
            if (200...299).contains(status) { return .succeed((data, response), attempt: attempt) }
            error = .httpError(statusCode: status, data: data)
            finalResponse = (data, response)
            if rules.retryAfterCap != nil { retryAfter = ResponseClassification(response).retryAfter }
        case .failure(let failure):
            error = failure
        }
        let fail = Action.fail(error, response: finalResponse, attempt: attempt, throttled: false)
        guard execution.mayRetry, error.isRetryable, !cancelled(),
            let seconds = rules.policy?.delay(forAttempt: attempt)
        else { return fail }
        var delay = RetryPolicyDelay.sanitized(seconds, maximum: rules.maximumDelay)
        if let retryAfter, let cap = rules.retryAfterCap { delay = min(retryAfter, cap) }
        let until = now() + delay
        // A retry that would start at or past the deadline is not scheduled.
        if let deadline = execution.deadline, until >= deadline { return fail }
        if let throttle = execution.throttle, !throttle.allowsRetry {
            return .fail(error, response: finalResponse, attempt: attempt, throttled: true)
        }
        if let budget = rules.budget, !budget.tryWithdraw() { return fail }
        state = .backingOff(attempt: attempt + 1, until: until)
        return .backOff(delay: delay, attempt: attempt, until: until)
    }

    // MARK: What an attempt's result says of its host

    /// How an attempt's result counts for the circuit breaker: only failures that say the
    /// dependency is unhealthy count against it.
    static func breakerOutcome(of result: Outcome) -> CircuitBreaker.Outcome {
        switch result {
        case .success(let (_, response)):
            return ResponseClassification.isRetryable(status: response.statusCode) ? .failure : .success
        case .failure(let error):
            switch error {
            // `deadlineExceeded` here is an attempt the deadline cut on the wire (the session timed
            // it): the host did not answer in the time the caller had.
            case .transport, .timedOut, .invalidResponse, .deadlineExceeded: return .failure
            case .httpError: return error.isRetryable ? .failure : .success
            case .noConnection, .cancelled, .circuitOpen, .invalidRequest, .responseTooLarge, .underlying,
                .limited, .tooManyRedirects, .responseHeadersTooLarge:
                // The last two: the host answered, with something this request cannot use.
                return .ignored
            }
        }
    }

    /// What an attempt's result says of its host's health, for its retry throttle: a failure the
    /// engine would retry (a retryable status or transport failure, a timeout) takes a token; any
    /// other answer gives one back; a cancellation, the deadline, a refusal or being offline says
    /// nothing.
    static func record(_ result: Outcome, in throttle: RetryThrottle) {
        switch result {
        case .success(let (_, response)):
            if ResponseClassification.isRetryable(status: response.statusCode) { throttle.recordFailure() } else { throttle.recordSuccess() }
        case .failure(.cancelled), .failure(.deadlineExceeded), .failure(.limited), .failure(.circuitOpen), .failure(.invalidRequest),
            .failure(.noConnection):  // the device is offline: nothing learnt of the host
            break
        case .failure(let error):
            if error.isRetryable { throttle.recordFailure() } else { throttle.recordSuccess() }
        }
    }

    /// What a copy's result tells its host's adaptive limit: the host could not take it (a
    /// timeout — its limit passed, or the transport's —, 429, 503, a failed connection, a reply
    /// that is not HTTP), it answered (any other status), or nothing (a cancellation, a body
    /// over the limit, a refusal before sending).
    static func limiterOutcome(of result: Outcome, timedOut: Bool) -> AdaptiveConcurrencyLimiter.Outcome {
        switch result {
        case .success(let (_, response)):
            return response.statusCode == 429 || response.statusCode == 503 ? .dropped : .success
        case .failure(.cancelled):
            return timedOut ? .dropped : .ignored
        case .failure(.timedOut), .failure(.transport), .failure(.invalidResponse):
            return .dropped
        case .failure:
            return .ignored
        }
    }
}
