import Foundation
import Retry
import ResilienceCore
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
/// Races this guards against:
/// - a waiter cancelled before its continuation is installed (cancellation handler runs first):
///   its ticket in the `WaiterList` is handed `.cancelled`, which it takes as it installs;
/// - a timeout racing the last waiter's departure: the successor learns under the lock whether
///   the call was abandoned, and then only winds it down (`cancelled`, no retry);
/// - a superseded task's late response: its attempt number no longer matches, its claim fails
///   (and its watchdog cancellation names an attempt that is no longer registered);
/// - a caller trying to join after the last waiter left or after completion: `join` refuses, and
///   the engine starts a fresh call instead of handing out a cancelled or stale result.
///
/// Performance notes (this is the path every request takes): the call is the only object the
/// engine itself adds per request, besides its task (and that task's closure), its `URLRequest`
/// and, for a deduplicated method, the identity's strings — it carries the execution plan, is the
/// watchdog's registration (its heap slot is stored here, so no table of registrations), and
/// holds its lock inline on Linux; continuations are unsafe (each is resumed exactly once: only
/// after being taken out of the waiter list under the lock).
final class SharedCall: Sendable {
    typealias Outcome = Result<(Data, HTTPURLResponse), NetworkError>
    typealias Waiters = WaiterList<Outcome, Void>
    typealias Ticket = Waiters.Ticket

    struct State: Sendable {
        /// Callers waiting for the outcome: the one that started the call, and any that joined.
        var waiters = Waiters()
        /// Callers that have not left (by cancellation); the call is abandoned when none is left.
        var activeWaiters = 1
        var outcome: Outcome?
        var task: Task<Void, Never>?
        var abandoned = false
        /// The attempt in flight that neither its task nor the watchdog has claimed yet.
        var openAttempt: Int?
        /// That attempt's circuit-breaker permit, handed to the successor if the timeout claims it.
        var openPermit: CircuitBreaker.Permit?
    }

    /// The engine whose task runs the call (and carries it on after a timeout).
    let engine: AsyncRequestEngine
    /// What every attempt needs, fixed before the task starts.
    let execution: Execution

    /// This call's position in the engine's deadline heap while an attempt's deadline is
    /// registered, otherwise -1. `nonisolated(unsafe)`: read and written only under the
    /// `DeadlineWatchdog`'s lock, which orders every access.
    nonisolated(unsafe) var deadlineSlot = -1

    #if canImport(os)
    private let state: Locked<State>
    #else
    private let state: Mutex<State>
    #endif

    /// The ticket of the waiter registered with the call (the caller that starts it).
    let firstTicket: Ticket

    init(engine: AsyncRequestEngine, execution: Execution) {
        self.engine = engine
        self.execution = execution
        var initial = State()
        firstTicket = initial.waiters.issue(())
        #if canImport(os)
        state = Locked(initial)
        #else
        state = Mutex(initial)
        #endif
    }

    /// Registers a waiter; `nil` when the call has completed or been abandoned.
    func join() -> Ticket? {
        state.withLock { state in
            guard state.outcome == nil, !state.abandoned else { return nil }
            state.activeWaiters += 1
            return state.waiters.issue(())
        }
    }

    /// Starts the engine's work in a new task (inheriting the caller's priority and task-local
    /// values). The task is recorded before its body can reach the lock, so a timeout always finds
    /// it. (Waiters start waiting only after this, so none can have left; the check is a guard.)
    func start() {
        let (task, abandoned) = state.withLock { state in
            let task = Task { await self.engine.run(self) }
            state.task = task
            return (task, state.abandoned)
        }
        if abandoned { task.cancel() }
    }

    /// Marks `attempt` as in flight, to be claimed by its task or by its timeout.
    func open(attempt: Int, permit: CircuitBreaker.Permit? = nil) {
        state.withLock { state in
            state.openAttempt = attempt
            state.openPermit = permit
        }
    }

    /// The attempt's task claims its response; false when the timeout claimed it first (this
    /// task has been superseded and must stop).
    func claim(attempt: Int) -> Bool {
        state.withLock { state in
            guard state.openAttempt == attempt else { return false }
            state.openAttempt = nil
            return true
        }
    }

    /// Called by the watchdog when `attempt`'s deadline passes: the engine carries the request on
    /// in a new task, unless the response came first.
    func deadlinePassed(attempt: Int) {
        engine.attemptTimedOut(self, attempt: attempt)
    }

    /// The watchdog claims `attempt` for its timeout and moves the rest of the work to a new task
    /// running `successor`, cancelling the superseded one. Does nothing when the task claimed the
    /// attempt first. `successor` is given the attempt's permit and told whether every waiter had
    /// already left when the timeout fired (decided under the lock, so it cannot race the
    /// departure); it is then also cancelled.
    func timeOut(
        attempt: Int,
        priority: TaskPriority?,
        successor: @escaping @Sendable (TimedOutAttempt) async -> Void
    ) {
        let handed = state.withLock { state -> (old: Task<Void, Never>?, new: Task<Void, Never>, abandoned: Bool)? in
            guard state.openAttempt == attempt, state.outcome == nil else { return nil }
            state.openAttempt = nil
            let old = state.task
            let expired = TimedOutAttempt(permit: state.openPermit, abandoned: state.abandoned)
            // Detached: created on the watchdog's task, a plain `Task` would inherit that task's
            // task-local values, which belong to no request.
            let new = Task.detached(priority: priority) { await successor(expired) }
            state.task = new
            return (old, new, expired.abandoned)
        }
        guard let handed else { return }
        handed.old?.cancel()
        if handed.abandoned { handed.new.cancel() }
    }

    /// Waits for the outcome as the waiter holding `ticket`; returns `.cancelled` promptly if the
    /// caller is cancelled.
    func wait(_ ticket: Ticket) async -> Outcome {
        await suspendCancellably { continuation in
            state.withLock { state -> Outcome? in
                if let outcome = state.outcome {
                    state.waiters.withdraw(ticket)
                    return outcome
                }
                if let handed = state.waiters.claim(ticket) { return handed }
                state.waiters.park(ticket, continuation)
                return nil
            }
        } onCancel: {
            leave(ticket)
        }
    }

    /// Delivers the outcome to every waiter still waiting (those on their way find it as they
    /// install).
    func complete(_ outcome: Outcome) {
        let waiting = state.withLock { state -> [Waiters.Waiter]? in
            guard state.outcome == nil else { return nil }
            state.outcome = outcome
            state.task = nil
            return state.waiters.takeAll()
        }
        guard let waiting else { return }
        for waiter in waiting { waiter.resume(returning: outcome) }
    }

    private func leave(_ ticket: Ticket) {
        let cancelled = Outcome.failure(.cancelled)
        let (waiter, taskToCancel) = state.withLock { state -> (Waiters.Waiter?, Task<Void, Never>?) in
            guard state.outcome == nil else { return (nil, nil) }
            let waiter = state.waiters.cancel(ticket, with: cancelled)
            state.activeWaiters -= 1
            guard state.activeWaiters == 0 else { return (waiter, nil) }
            state.abandoned = true
            return (waiter, state.task)
        }
        waiter?.resume(returning: cancelled)
        taskToCancel?.cancel()
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
}

/// An attempt whose timeout fired: the task the watchdog starts carries on from it.
struct TimedOutAttempt: Sendable {
    /// The attempt's circuit-breaker permit, if a breaker is configured.
    let permit: CircuitBreaker.Permit?
    /// Every waiter had left before the timeout fired: the request ends as cancelled.
    let abandoned: Bool
}
