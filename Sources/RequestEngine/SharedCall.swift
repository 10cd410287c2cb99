import Foundation
import ResilienceCore
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
/// behind its lock and performs what it returns — and the call never calls back into the engine:
/// the engine hands it the task to run and the successor to start. Races this guards against:
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

    #if canImport(os)
    private let state: Locked<SharedCallStateMachine>
    #else
    private let state: Mutex<SharedCallStateMachine>
    #endif

    /// The ticket of the waiter registered with the call (the caller that starts it).
    let firstTicket: Ticket

    init(execution: Execution) {
        self.execution = execution
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

/// What every attempt of one logical request needs, fixed when its call is made (before its task
/// starts), so the task and a successor after a timeout read the same plan.
struct Execution: Sendable {
    /// For events.
    let url: URL
    let method: HTTPMethod
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
