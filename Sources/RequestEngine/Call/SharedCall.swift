import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if !canImport(os)
import Synchronization
#endif

/// One logical request: what its attempts need, its task, and the callers waiting for it. With
/// single flight, identical concurrent reads share one; every other send has one of its own.
///
/// Each caller waits on a continuation, so a caller whose task is cancelled is answered
/// `.cancelled` at once, without waiting for the network, while the others keep waiting. When the
/// last waiter leaves, the running task is cancelled.
///
/// The work normally runs in one task from start to finish, attempts included. Each attempt is
/// opened with `open(attempt:permit:)` and then claimed by exactly one side: the task, when the
/// response comes first (`claim(attempt:)`), or the engine's watchdog, when the timeout comes first
/// (`timeOut(attempt:…)`). The watchdog hands the rest of the work to a new task and cancels the old
/// one, so neither a retry nor the waiters wait for a transport slow to acknowledge the cancel.
///
/// Over a session that bounds its calls itself, the work runs in the task of the caller that
/// starts the call instead (`Execution.inCallersTask`): no watchdog, no continuation for that
/// caller (it reads `outcome`). Should it be cancelled while others wait, `handOver` moves the
/// rest to a task of its own, as a timeout does.
///
/// The rules live in `SharedCallStateMachine` (SharedCall+StateMachine.swift); this class holds it
/// behind its lock and performs what it returns. The call also runs its own attempts (the
/// extension below performs `RequestStateMachine`'s actions) with its engine's parts
/// (`EngineParts`): the watchdog and the hedges send it events, and it never calls back into the
/// engine. Races this guards against:
/// - a waiter cancelled before its continuation is installed (cancellation handler runs first):
///   its ticket in the `WaiterList` is handed `.cancelled`, which it takes as it installs;
/// - the caller running the call in its own task cancelled as another joins or leaves: under the
///   lock the joiner either counts (the rest is handed over) or finds the call abandoned (it
///   starts a fresh one); a successor's late outcome never becomes the departed caller's answer;
/// - a timeout racing the last waiter's departure: the successor learns under the lock whether
///   the call was abandoned, and then only winds it down (`cancelled`, no retry);
/// - a superseded task's late response: its attempt number no longer matches, its claim fails
///   (and its watchdog cancellation names an attempt that is no longer registered);
/// - a caller trying to join after the last waiter left or after completion: `join` refuses, and
///   the engine starts a fresh call instead of handing out a cancelled or stale result;
/// - the first task running — even to its timeout or to the end — before its handle is recorded
///   (it is made outside the lock): `firstTaskStarted` then cancels it when the call has
///   completed or been handed to a successor, and never lets it replace the successor.
///
/// Performance notes (this is the path every request takes): the call is the only object the
/// engine itself adds per request, besides its task (and that task's closure), its `URLRequest`
/// and, for a deduplicated method, the identity's strings — it carries the execution plan, is
/// what the watchdog's heap entries point to, and holds its lock inline on Linux; continuations are unsafe (each is resumed exactly once: only
/// after being taken out of the waiter list under the lock).
final class SharedCall: Sendable {
    typealias Outcome = SharedCallStateMachine.Outcome
    typealias Ticket = SharedCallStateMachine.Ticket

    /// What every attempt needs, fixed before the task starts.
    let execution: Execution
    /// What the attempts go through: the engine's session, watchdog, limiters, rules and sinks.
    let parts: EngineParts

    #if canImport(os)
    private let state: Locked<SharedCallStateMachine>
    #else
    private let state: Mutex<SharedCallStateMachine>
    #endif

    /// The ticket of the waiter registered with the call (the caller that starts it).
    let firstTicket: Ticket

    @inline(__always)
    init(execution: Execution, parts: EngineParts) {
        self.execution = execution
        self.parts = parts
        let machine = SharedCallStateMachine()
        firstTicket = machine.firstTicket
        #if canImport(os)
        state = Locked(machine)
        #else
        state = Mutex(machine)
        #endif
    }

    /// Registers a waiter; `nil` when the call has completed or been abandoned.
    func join() -> Ticket? {
        state.withLock { $0.join() }
    }

    /// Starts the call's task, made by `makeTask`, and records it. The task is made outside the
    /// lock: its first step, on another thread, takes the lock at once (to open an attempt with a
    /// limit) and would otherwise spin in the lock's slow path while this thread still held it
    /// (Benchmarks/README.md). So it may run before it is recorded; whatever came first (the
    /// attempt's timeout, the outcome) is settled as it is (`SharedCallStateMachine.firstTaskStarted`).
    /// The first waiter waits only after this returns, so the last waiter cannot have left yet.
    func start(_ makeTask: () -> Task<Void, Never>) {
        let task = makeTask()
        if state.withLock({ $0.firstTaskStarted(task) }) { task.cancel() }
    }

    /// Marks `attempt` as in flight, to be claimed by its task or by its timeout (`endsAtDeadline`:
    /// the limit is the request's total deadline, so its expiry is `deadlineExceeded`).
    func open(attempt: Int, permit: CircuitBreaker.Permit? = nil, endsAtDeadline: Bool = false, sent: Bool = true) {
        state.withLock { $0.open(attempt: attempt, permit: permit, endsAtDeadline: endsAtDeadline, sent: sent) }
    }

    /// `attempt` has its host's permits and goes on the wire (a copy of it, when hedged).
    func markSent(attempt: Int) {
        state.withLock { $0.markSent(attempt: attempt) }
    }

    /// Whether `attempt`'s limit passed before its response came (the watchdog claimed it).
    func timedOut(attempt: Int) -> Bool {
        state.withLock { $0.timedOut(attempt: attempt) }
    }

    /// The attempt's task claims its response; false when the timeout claimed it first (this
    /// task has been superseded and must stop).
    func claim(attempt: Int) -> Bool {
        state.withLock { $0.claim(attempt: attempt) }
    }

    /// The watchdog claims `attempt` for its timeout and moves the rest of the work to a new task
    /// running `successor`, cancelling the superseded one (or, when the first task has not been
    /// recorded yet, leaving `start` to cancel it as it records it). Does nothing when the task claimed the
    /// attempt first. `successor` is given the attempt's permit and told whether every waiter had
    /// already left when the timeout fired (decided under the lock, so it cannot race the
    /// departure); it is then also cancelled.
    func timeOut(
        attempt: Int,
        priority: TaskPriority?,
        successor: @escaping @Sendable (TimedOutAttempt) async -> Void
    ) {
        let handed = state.withLock { machine -> (old: Task<Void, Never>?, new: Task<Void, Never>, cancelNew: Bool)? in
            guard let (superseded, expired) = machine.timeOut(attempt: attempt) else { return nil }
            // Detached: created on the watchdog's task, a plain `Task` would inherit that task's
            // task-local values, which belong to no request.
            let new = Task.detached(priority: priority) { await successor(expired) }
            return (superseded, new, machine.taskStarted(new))
        }
        guard let handed else { return }
        handed.old?.cancel()
        if handed.cancelNew { handed.new.cancel() }
    }

    /// The caller running the call in its own task was cancelled: when others still wait, the
    /// rest of the request moves to a new task running `successor` (at `priority`) and `true` is
    /// returned — the caller leaves with `.cancelled`; else (`false`) the call is abandoned and the
    /// caller ends it. Decided under the lock, so it cannot race a joiner's arrival or departure.
    func handOver(priority: TaskPriority?, successor: @escaping @Sendable () async -> Void) -> Bool {
        let handed = state.withLock { machine -> (task: Task<Void, Never>, cancel: Bool)? in
            guard machine.runnerLeaves() else { return nil }
            // Detached: the caller's task-local values belong to the caller that left.
            let task = Task.detached(priority: priority) { await successor() }
            return (task, machine.taskStarted(task))
        }
        guard let handed else { return false }
        if handed.cancel { handed.task.cancel() }
        return true
    }

    /// Waits for the outcome as the waiter holding `ticket`; returns `.cancelled` promptly if the
    /// caller is cancelled.
    func wait(_ ticket: Ticket) async -> Outcome {
        await suspendCancellably { continuation in
            state.withLock { $0.install(ticket, continuation) }
        } onCancel: {
            let departure = state.withLock { $0.leave(ticket) }
            departure.waiter?.resume(returning: .failure(.cancelled))
            departure.taskToCancel?.cancel()
        }
    }

    /// The answer of the caller that ran the call in its own task (it never waits): the outcome
    /// once the call has completed, `.cancelled` when that caller left it to a successor (`handOver`)
    /// or before the outcome.
    var outcome: Outcome {
        state.withLock { machine in
            if !machine.runnerLeft, case .completed(let outcome) = machine.phase { return outcome }
            return .failure(.cancelled)
        }
    }

    /// Delivers the outcome to every waiter still waiting (those on their way find it as they
    /// install).
    func complete(_ outcome: Outcome) {
        guard let waiting = state.withLock({ $0.complete(outcome) }) else { return }
        for waiter in waiting { waiter.resume(returning: outcome) }
    }
}

// MARK: - The attempts: the call performs `RequestStateMachine`'s actions

/// The call runs its own attempts, with its engine's parts (`EngineParts`): the watchdog's expiry
/// (`attemptExpired`) and the hedges' copies (`HedgeRace` calling `sendOnce`) are events to the
/// call, and nothing here calls back into the engine.
extension SharedCall {
    /// The whole logical request, in the call's task (or its caller's): attempts and retries.
    func run() async {
        if parts.observed { await emitStarted() }
        if let invalid = execution.invalid {
            return await end(invalid, attempt: 0)
        }
        parts.budget?.recordRequest()
        await attempts(from: 0, afterTimeout: nil)
    }

    /// The task running the call was cancelled at attempt `attempt` (before it, during it, or in the
    /// backoff after it). For a call run in its caller's task, that is the caller leaving: when
    /// others still wait on the call (a shared read they joined), the request carries on in a task
    /// of its own — from `resumingAt` (by default `attempt` again: the cancelled attempt is sent
    /// anew), not before `notBefore` on the engine's clock (what was left of a backoff) — and this
    /// caller leaves with `.cancelled` (`response(for:)` reads it). Otherwise, and always for a
    /// call in a task of its own (cancelled only when its last waiter left), the request ends as
    /// cancelled.
    private func callerCancelled(attempt: Int, resumingAt: Int? = nil, notBefore: Duration? = nil) async {
        if execution.inCallersTask, execution.key != nil {
            let next = resumingAt ?? attempt
            let handed = handOver(priority: execution.priority) {
                if let notBefore {
                    let left = notBefore - self.parts.time.now()
                    if left > .zero, (try? await self.parts.time.sleep(left)) == nil {
                        return await self.end(.cancelled, attempt: attempt)  // every waiter left meanwhile
                    }
                }
                await self.attempts(from: next, afterTimeout: nil)
            }
            if handed { return }
        }
        await end(.cancelled, attempt: attempt)
    }

    /// The watchdog's event: attempt `attempt`'s limit passed. Unless its response came first, the
    /// rest of the request moves to a new task at the caller's priority (`timeOut`).
    func attemptExpired(_ attempt: Int) {
        timeOut(attempt: attempt, priority: execution.priority) { expired in
            await self.attempts(from: attempt, afterTimeout: expired)
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
        from first: Int,
        afterTimeout: TimedOutAttempt?
    ) async {
        let time = parts.time
        var machine: RequestStateMachine
        var action: RequestStateMachine.Action
        if let expired = afterTimeout {
            machine = RequestStateMachine(cutAttempt: first)
            action = machine.attemptCut(expired, cancelled: Task.isCancelled, request: execution, rules: parts.rules, now: time.now)
        } else {
            machine = RequestStateMachine(attempt: first)
            action = machine.startAttempt(
                cancelled: Task.isCancelled, deadline: execution.deadline, now: time.now, breaker: execution.breaker)
        }
        while true {
            switch consume action {
            case .send(let attempt, let permit):
                guard let result = await perform(attempt: attempt, permit: permit) else {
                    return  // timed out: the watchdog's task carries on
                }
                action = machine.attemptEnded(
                    result, permit: permit, cancelled: Task.isCancelled, request: execution, rules: parts.rules, now: time.now)
            case .backOff(let delay, let attempt, let until):
                if parts.observed { await emitRetryScheduled(attempt: attempt, delay: delay) }
                do {
                    // From the decision, not from the event: a slow sink does not lengthen it.
                    let left = delay > .zero ? until - time.now() : .zero
                    if left > .zero { try await time.sleep(left) }
                    machine.backoffEnded()
                    action = machine.startAttempt(
                        cancelled: Task.isCancelled, deadline: execution.deadline, now: time.now, breaker: execution.breaker)
                } catch {
                    action = machine.backoffInterrupted()
                }
            case .succeed(let response, let attempt):
                if parts.observed { await emitSucceeded(status: response.1.statusCode, attempt: attempt) }
                return finish(.success(response))
            case .fail(let error, let response, let attempt, let throttled):
                if throttled, let throttleSink = parts.throttleSink { await emitRetryThrottled(attempt: attempt, sink: throttleSink) }
                return await end(error, attempt: attempt, response: response)
            case .leave(let attempt, let resumingAt, let notBefore):
                return await callerCancelled(attempt: attempt, resumingAt: resumingAt, notBefore: notBefore)
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
    /// `attempts`, as is `transfer(on:)` into it: each async function called on its own costs a
    /// frame, a hop check on the executor and a return per request (about 500 instructions).
    @inline(__always)
    private func perform(
        attempt: Int,
        permit: CircuitBreaker.Permit?
    ) async -> Result<(Data, ResponseHead), NetworkError>? {
        if execution.inCallersTask { return await sessionTimedAttempt() }
        let registration = arm(attempt: attempt, permit: permit)
        // Without hedging or host limits — or with a free place in the adaptive limit, when that
        // is the only one — the session is called straight from here: each async layer between
        // costs a frame on every request.
        let result: Result<(Data, ResponseHead), NetworkError>
        if execution.isDirect {
            result = await transfer(on: parts.session)
        } else if let (adaptive, permit) = freeAdaptivePlace() {
            markSent(attempt: attempt)
            result = await transfer(on: parts.session)
            release(permit, of: adaptive, after: result, attempt: attempt)
        } else {
            result = await send(attempt: attempt)
        }
        guard let registration else { return result }
        return disarm(attempt: attempt, registration) ? result : nil
    }

    /// An attempt of a request run in its caller's task: the session bounds it by the request's
    /// timeout — or by what is left of its total deadline, when that is sooner, and then its
    /// timeout is `deadlineExceeded` — and ends it when the caller is cancelled. No watchdog.
    private func sessionTimedAttempt() async -> Result<(Data, ResponseHead), NetworkError> {
        guard let deadline = execution.deadline else { return await transfer(on: parts.session) }
        let left = deadline - parts.time.now()
        if let timeout = execution.timeout, timeout < left { return await transfer(on: parts.session) }
        var urlRequest = execution.urlRequest
        // At least a millisecond: a session may read a zero or negative interval as no limit.
        urlRequest.timeoutInterval = max(left.seconds, 0.001)
        let result = await Self.transfer(urlRequest, maximumBodySize: execution.maximumBodySize, on: parts.session)
        if case .failure(.timedOut) = result { return .failure(.deadlineExceeded) }
        return result
    }

    /// A free place in the host's adaptive limit, when that limit is the only thing between the
    /// attempt and the session (no hedging, no rate or fixed limit); `nil` otherwise, and when
    /// the limit is full (then `sendOnce` waits in its line).
    @inline(__always)
    private func freeAdaptivePlace() -> (AdaptiveConcurrencyLimiter, AdaptiveConcurrencyLimiter.Permit)? {
        guard execution.hedging == nil, parts.hostRates == nil, parts.hostLimiters == nil,
            let hostAdaptiveLimiters = parts.hostAdaptiveLimiters, let authority = execution.authority
        else { return nil }
        let adaptive = hostAdaptiveLimiters.limiter(forAuthority: authority)
        guard let permit = adaptive.tryAcquire(priority: execution.limiterPriority) else { return nil }
        return (adaptive, permit)
    }

    /// Opens `attempt` and schedules its limit with the watchdog: the request's timeout, or what
    /// is left of its total deadline when that is sooner. `nil` when the attempt has no limit.
    @inline(never)
    private func arm(attempt: Int, permit: CircuitBreaker.Permit?) -> DeadlineWatchdog.Registration? {
        var limit = execution.timeout
        var endsAtDeadline = false
        if let deadline = execution.deadline {
            let left = deadline - parts.time.now()
            if limit.map({ left <= $0 }) ?? true {
                limit = left
                endsAtDeadline = true
            }
        }
        guard let limit else { return nil }
        // An attempt that must wait for a host's limits is not on the wire until it has its
        // permits: if its limit passes before, the breaker does not count it.
        open(attempt: attempt, permit: permit, endsAtDeadline: endsAtDeadline, sent: execution.authority == nil)
        return parts.watchdog.schedule(self, attempt: attempt, after: limit)
    }

    /// Cancels the attempt's limit and claims its response: false when the limit came first (the
    /// watchdog's task carries on and this one stops).
    @inline(never)
    private func disarm(attempt: Int, _ registration: DeadlineWatchdog.Registration) -> Bool {
        parts.watchdog.cancel(registration)
        guard claim(attempt: attempt) else {
            parts.testHooks.lateAnswerDropped()
            return false
        }
        return true
    }

    /// Sends the attempt: hedged when the request may be, else once.
    private func send(attempt: Int) async -> Result<(Data, ResponseHead), NetworkError> {
        let execution = execution
        guard let hedging = execution.hedging else {
            return await sendOnce(attempt: attempt)
        }
        return await hedge(attempt: attempt, policy: hedging)
    }

    @inline(never)
    private func hedge(
        attempt: Int,
        policy: HedgingPolicy
    ) async -> Result<(Data, ResponseHead), NetworkError> {
        let execution = execution
        let budget = parts.budget
        var onHedge: (@Sendable (Int, TimeInterval) async -> Void)?
        if let sink = parts.hedgeSink {
            let traceID = execution.traceID
            onHedge = { @Sendable copy, after in
                await sink.recordHedge(HedgeEvent(traceID: traceID, attempt: attempt, copy: copy, after: after))
            }
        }
        let throttle = execution.throttle
        let race = HedgeRace(
            policy: policy,
            time: parts.time,
            send: { copy in await self.sendOnce(attempt: attempt, hedge: copy > 0) },
            mayHedge: { (throttle?.allowsRetry ?? true) && (budget?.tryWithdraw() ?? true) },
            onHedge: onHedge
        )
        return await race.run()
    }

    /// One copy of an attempt: through the host's rate limit and concurrency limit when there
    /// are any (a token first: tokens measure starts), then the session. The host's limiters are
    /// looked up for each copy, so a limiter dropped from the table while idle is never used again.
    private func sendOnce(attempt: Int, hedge: Bool = false) async -> Result<(Data, ResponseHead), NetworkError> {
        guard let authority = execution.authority else {
            return await transfer(on: parts.session)
        }
        let rate = parts.hostRates?.limiter(forAuthority: authority)
        let limiter = parts.hostLimiters?.limiter(forAuthority: authority)
        let adaptive = parts.hostAdaptiveLimiters?.limiter(forAuthority: authority)
        let session = parts.session
        // Each copy takes a rate token, then its adaptive place, then its fixed place: a copy
        // waiting in the adaptive line (a background one, say) holds no fixed place an
        // interactive copy could use.
        do {
            if rate == nil, limiter == nil, let adaptive {
                // The adaptive limit alone (its usual use): no closures on the path.
                let permit = try await adaptivePlace(adaptive, hedge: hedge)
                markSent(attempt: attempt)
                let result = await transfer(on: session)
                release(permit, of: adaptive, after: result, attempt: attempt)
                return result
            }
            let onTheWire = { @Sendable () async -> Result<(Data, ResponseHead), NetworkError> in
                self.markSent(attempt: attempt)
                return await self.transfer(on: session)
            }
            if adaptive == nil {  // the fixed limits only: as few closures as they need
                switch (rate, limiter) {
                case (nil, nil): return await onTheWire()
                case (nil, let limiter?): return try await limiter.withPermit { await onTheWire() }
                case (let rate?, nil): return try await rate.withPermit { await onTheWire() }
                case (let rate?, let limiter?): return try await rate.withPermit { try await limiter.withPermit { await onTheWire() } }
                }
            }
            let placed = { @Sendable () async throws -> Result<(Data, ResponseHead), NetworkError> in
                guard let limiter else { return await onTheWire() }
                return try await limiter.withPermit { await onTheWire() }
            }
            let limited = { @Sendable () async throws -> Result<(Data, ResponseHead), NetworkError> in
                guard let adaptive else { return try await placed() }
                let permit = try await self.adaptivePlace(adaptive, hedge: hedge)
                let result: Result<(Data, ResponseHead), NetworkError>
                do {
                    result = try await placed()
                } catch {
                    adaptive.release(permit, outcome: .ignored)  // refused or cancelled by the fixed limit
                    throw error
                }
                self.release(permit, of: adaptive, after: result, attempt: attempt)
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
    private func adaptivePlace(_ adaptive: AdaptiveConcurrencyLimiter, hedge: Bool) async throws -> AdaptiveConcurrencyLimiter.Permit {
        let priority = hedge ? RequestPriority.background : execution.limiterPriority
        if let free = adaptive.tryAcquire(priority: priority) { return free }
        return try await adaptive.acquire(priority: priority)
    }

    /// Gives a copy's adaptive place back with what its result says of the host. Whether the
    /// attempt timed out is asked (a lock) only of a cancelled copy.
    private func release(
        _ permit: AdaptiveConcurrencyLimiter.Permit,
        of adaptive: AdaptiveConcurrencyLimiter,
        after result: Result<(Data, ResponseHead), NetworkError>,
        attempt: Int
    ) {
        let timedOut = if case .failure(.cancelled) = result { timedOut(attempt: attempt) } else { false }
        adaptive.release(permit, outcome: RequestStateMachine.limiterOutcome(of: result, timedOut: timedOut))
    }

    /// The transport call, reading the request from the call's `Execution` in place (a struct of
    /// that size passed by value is copied into the caller's frame).
    @inline(__always)
    private func transfer(on session: any NetworkSession) async -> Result<(Data, ResponseHead), NetworkError> {
        await Self.transfer(execution.urlRequest, maximumBodySize: execution.maximumBodySize, on: session)
    }

    @inline(__always)
    private static func transfer(
        _ urlRequest: URLRequest,
        maximumBodySize: Int?,
        on session: any NetworkSession
    ) async -> Result<(Data, ResponseHead), NetworkError> {
        do {
            return .success(try await session.dataWithHead(for: urlRequest, maximumBodySize: maximumBodySize))
        } catch {
            // A session may report our cancellation as some other error; the caller asked to stop.
            if Task.isCancelled { return .failure(.cancelled) }
            return .failure(NetworkError(mapping: error))
        }
    }

    // MARK: - Ending a request

    /// Unregisters a finished call from the single-flight table and answers its waiters.
    private func finish(
        _ outcome: Result<(Data, ResponseHead), NetworkError>
    ) {
        // Unregister before answering, so a send after completion starts a fresh call.
        parts.inFlight.remove(self)
        complete(outcome)
    }

    /// Ends a request without success: emits `failed`, then answers the waiters with the final
    /// non-2xx response when there is one (`send` turns it into `httpError`), else with `error`.
    @inline(never)
    private func end(
        _ error: NetworkError,
        attempt: Int,
        response: (Data, ResponseHead)? = nil
    ) async {
        if let sink = parts.sink {
            await sink.record(.failed(traceID: execution.traceID, error: error, attempt: attempt))
        }
        finish(response.map { .success($0) } ?? .failure(error))
    }

    // MARK: - Events (out of line: only an observed engine pays for building them)

    @inline(never)
    private func emitStarted() async {
        let started = RequestEvent.started(traceID: execution.traceID, url: execution.url, method: execution.method)
        await parts.sink?.record(started, operationID: execution.operationID)
    }

    @inline(never)
    private func emitSucceeded(status: Int, attempt: Int) async {
        let duration = (parts.time.now() - execution.started).seconds
        await parts.sink?.record(.succeeded(traceID: execution.traceID, statusCode: status, duration: duration, attempt: attempt))
    }

    @inline(never)
    private func emitRetryThrottled(attempt: Int, sink: any RetryThrottlingEventSink) async {
        await sink.recordRetryThrottled(RetryThrottledEvent(traceID: execution.traceID, url: execution.url, attempt: attempt))
    }

    private func emitRetryScheduled(attempt: Int, delay: Duration) async {
        await parts.sink?.record(.retryScheduled(traceID: execution.traceID, attempt: attempt, delay: delay.seconds))
    }
}

/// What every attempt of one logical request needs, fixed when its call is made (before its task
/// starts), so the task and a successor after a timeout read the same plan.
struct Execution: Sendable {
    /// For events.
    let url: URL
    let method: HTTPMethod
    /// The request's `operationID`, for events.
    var operationID: String? = nil
    /// The request to send; meaningful only when `invalid` is nil.
    let urlRequest: URLRequest
    /// Why the request cannot be sent (reported as `failed` after `started`, nothing sent).
    let invalid: NetworkError?
    /// Each attempt's limit on the engine's clock; nil for no limit.
    let timeout: Duration?
    /// The largest response body accepted, in bytes (the request's, else the engine's); nil for no limit.
    let maximumBodySize: Int?
    /// A retry policy exists and the method is idempotent or carries an `Idempotency-Key`.
    let mayRetry: Bool
    let traceID: UUID
    /// When the request began on the engine's clock (read only when events are observed).
    let started: Duration
    /// The caller's priority, for the task that carries on after a timeout.
    let priority: TaskPriority
    /// The single-flight table key this call is registered under, if any.
    let key: SingleFlightTable.Key?
    /// When the whole request must end, on the engine's clock; nil for no total deadline.
    var deadline: Duration? = nil
    /// The circuit breaker for this request's host (the registry's) or the engine's one.
    var breaker: CircuitBreaker? = nil
    /// The request's authority (host and port) when the engine limits hosts; its limiters are
    /// looked up by it for each attempt.
    var authority: String? = nil
    /// The hedging policy, when the engine hedges and this request may be sent twice.
    var hedging: HedgingPolicy? = nil
    /// The retry throttle of this request's host, when the engine throttles retries.
    var throttle: RetryThrottle? = nil
    /// The request's share of its host's adaptive limit.
    var limiterPriority: RequestPriority = .interactive
    /// Run in its caller's task (for a shared call, the caller that starts it), not one of its
    /// own: it is not hedged, has no host limit to wait for, and the session bounds each call by
    /// the request's timeout and its caller's cancellation
    /// (`NetworkSession.honorsTimeoutAndCancellation`). Should that caller leave while others
    /// wait, the rest moves to a task of its own (`handOver`).
    var inCallersTask = false

    /// Nothing to hedge or limit: an attempt calls the session straight.
    var isDirect: Bool { hedging == nil && authority == nil }
}

/// An attempt whose timeout fired: the task the watchdog starts carries on from it.
struct TimedOutAttempt: Sendable {
    /// The attempt's circuit-breaker permit, if a breaker is configured.
    let permit: CircuitBreaker.Permit?
    /// Every waiter had left before the timeout fired: the request ends as cancelled.
    let abandoned: Bool
    /// The limit that passed was the request's total deadline: it ends as `deadlineExceeded`.
    var endsAtDeadline = false
    /// The attempt was on the wire (had its host's permits) when its limit passed.
    var sent = true
}
