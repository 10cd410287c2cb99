import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One logical request's life as a value: who waits for it, which task runs it, which attempt is
/// in flight, and how it ended. `SharedCall` holds one behind its lock, feeds it every event, and
/// performs what it returns (starting, cancelling and resuming tasks); the machine does no I/O,
/// so every transition is unit-tested by hand (`SharedCallStateMachineTests`).
///
/// ```
///              last waiter leaves                    (the task winds down)
///   running ─────────────────────► abandoned ───────────────┐
///      │                                                     │ complete(outcome)
///      └─────────────────────────────────────────────────────┴──────────────► completed(outcome)
/// ```
///
/// An attempt is *opened* before it is sent and then *claimed* by exactly one side: its task
/// (`claim`), when the response comes first, or the watchdog (`timeOut`), when the deadline does.
struct SharedCallStateMachine: Sendable {
    typealias Outcome = Result<(Data, ResponseHead), NetworkError>
    typealias Waiters = WaiterList<Outcome, Void>
    typealias Ticket = Waiters.Ticket

    enum Phase: Sendable {
        /// Someone waits for the outcome.
        case running
        /// Every waiter left before an outcome: the task is cancelled and winds down; nobody can
        /// join any more.
        case abandoned
        /// The outcome is known; waiters still on their way to suspend find it.
        case completed(Outcome)
    }

    struct Running: Sendable {
        /// The task carrying the request (replaced after a timeout).
        var task: Task<Void, Never>?
        /// A timeout has handed the request to a successor task: the first task, should its
        /// handle be reported only now, is superseded.
        var handedOver = false
        /// Callers that have not left.
        var waiting: Int
        /// The attempt in flight that neither its task nor the watchdog has claimed yet.
        var open: OpenAttempt?
        /// The last attempt the watchdog claimed: its copies' cancellation was its timeout.
        var timedOutAttempt: Int?
    }

    struct OpenAttempt: Sendable {
        let attempt: Int
        /// Its circuit-breaker permit, handed to the successor if the timeout claims it.
        let permit: CircuitBreaker.Permit?
        /// Its limit is what is left of the request's total deadline, not its own timeout.
        let endsAtDeadline: Bool
        /// It is on the wire: it had no host permit to wait for, or it has them.
        var sent: Bool
    }

    /// What `leave` asks the call to do.
    struct Departure: Sendable {
        /// The waiter to answer `.cancelled` (nil if it had not suspended yet: it takes the
        /// answer as it does, or had been answered already).
        var waiter: Waiters.Waiter?
        /// The task to cancel: the last waiter has left.
        var taskToCancel: Task<Void, Never>?
    }

    private(set) var phase: Phase = .running
    /// The task, the waiters' count and the open attempt, while running or abandoned. Kept
    /// beside the phase rather than as its payload, so an event changes it in place: every
    /// request goes through several events, and taking a payload out of an enum and putting it
    /// back copies it each time.
    private(set) var running = Running(task: nil, waiting: 1, open: nil)
    private(set) var waiters = Waiters()
    /// The ticket of the caller that made the call.
    let firstTicket: Ticket
    /// The caller that ran the call in its own task left it to a successor (`runnerLeaves`): its
    /// answer is `.cancelled`, whatever the call's outcome.
    private(set) var runnerLeft = false

    init() {
        firstTicket = waiters.issue(())
    }

    /// The running (or abandoned) state, changed in place; `nil` once completed.
    private mutating func withRunning<R>(_ body: (inout Running, _ abandoned: Bool) -> R) -> R? {
        switch phase {
        case .running: return body(&running, false)
        case .abandoned: return body(&running, true)
        case .completed: return nil
        }
    }

    // MARK: Waiters

    /// Another caller joins: its ticket, or `nil` when the call has completed or been abandoned
    /// (the engine then starts a fresh call rather than hand out a stale or cancelled result).
    mutating func join() -> Ticket? {
        guard case .running = phase else { return nil }
        running.waiting += 1
        return waiters.issue(())
    }

    /// A waiter suspends on `continuation`: the value to answer it with at once (the outcome, or
    /// `.cancelled` if it left before suspending), or `nil` once it waits.
    mutating func install(_ ticket: Ticket, _ continuation: Waiters.Continuation) -> Outcome? {
        if case .completed(let outcome) = phase {
            waiters.withdraw(ticket)
            return outcome
        }
        if let handed = waiters.claim(ticket) { return handed }
        waiters.park(ticket, continuation)
        return nil
    }

    /// The waiter holding `ticket` was cancelled. When it was the last, the call is abandoned and
    /// its task is to be cancelled.
    mutating func leave(_ ticket: Ticket) -> Departure {
        guard case .running = phase else { return Departure() }
        let waiter = waiters.cancel(ticket, with: .failure(.cancelled))
        running.waiting -= 1
        guard running.waiting == 0 else { return Departure(waiter: waiter) }
        phase = .abandoned
        return Departure(waiter: waiter, taskToCancel: running.task)
    }

    /// The caller running the call in its own task (a call run in its caller's task, whose ticket
    /// is `firstTicket` and never waits) was cancelled before the outcome: it leaves as a waiter
    /// does. `true` when others still wait: the rest of the request is to move to a task of its
    /// own (reported with `taskStarted`); else the call is abandoned and nobody can join it.
    mutating func runnerLeaves() -> Bool {
        guard case .running = phase else { return false }
        runnerLeft = true
        waiters.withdraw(firstTicket)
        running.waiting -= 1
        guard running.waiting == 0 else { return true }
        phase = .abandoned
        return false
    }

    /// The outcome is known: the waiters to answer with it, or `nil` if an outcome was already
    /// delivered.
    mutating func complete(_ outcome: Outcome) -> [Waiters.Waiter]? {
        if case .completed = phase { return nil }
        phase = .completed(outcome)
        // The task's handle is not kept past the end; which attempt timed out is (a copy still
        // winding down asks, to tell its host's limiter why it was cancelled).
        running = Running(task: nil, waiting: 0, open: nil, timedOutAttempt: running.timedOutAttempt)
        return waiters.takeAll()
    }

    // MARK: Tasks and attempts

    /// The call's first task exists: `true` when it must be cancelled at once (the call has
    /// completed, a timeout has already handed it to a successor, or — a guard — it was abandoned).
    ///
    /// The first task is made outside the call's lock (made under it, the new task's first step,
    /// on another thread, would find the lock still held), so it may run before its handle is
    /// reported here, and what needs the handle may come first: the outcome (completed), or the
    /// attempt's timeout (the successor runs and its handle is recorded; this one must not replace
    /// it). The last waiter cannot have left: the first waiter waits only once the handle is in.
    mutating func firstTaskStarted(_ task: Task<Void, Never>) -> Bool {
        withRunning { running, abandoned in
            guard !running.handedOver else { return true }
            running.task = task
            return abandoned
        } ?? true
    }

    /// A successor task exists (made under the lock by `timeOut`'s caller): `true` when it must
    /// be cancelled at once (every waiter had left).
    mutating func taskStarted(_ task: Task<Void, Never>) -> Bool {
        withRunning { running, abandoned in
            running.task = task
            return abandoned
        } ?? true
    }

    /// Attempt `attempt` is in flight, holding `permit`; `endsAtDeadline` when its limit is the
    /// request's total deadline rather than its own timeout.
    mutating func open(attempt: Int, permit: CircuitBreaker.Permit?, endsAtDeadline: Bool = false, sent: Bool = true) {
        _ = withRunning { running, _ in
            running.open = OpenAttempt(attempt: attempt, permit: permit, endsAtDeadline: endsAtDeadline, sent: sent)
        }
    }

    /// Attempt `attempt` got its host's permits and went on the wire (nothing if it is no longer
    /// the open attempt: its timeout already claimed it).
    mutating func markSent(attempt: Int) {
        _ = withRunning { running, _ in
            if running.open?.attempt == attempt { running.open?.sent = true }
        }
    }

    /// The attempt's task claims its response: `false` when the timeout claimed it first (the
    /// task has been superseded and must stop).
    mutating func claim(attempt: Int) -> Bool {
        withRunning { running, _ in
            guard running.open?.attempt == attempt else { return false }
            running.open = nil
            return true
        } ?? false
    }

    /// Whether the watchdog claimed `attempt` because its own timeout passed before its response
    /// came (not the request's total deadline).
    func timedOut(attempt: Int) -> Bool {
        running.timedOutAttempt == attempt
    }

    /// The deadline of `attempt` passed. Unless its response came first (or the call has
    /// completed): the superseded task (to cancel) and what the successor carries on from —
    /// the attempt's permit, and whether every waiter had already left. The successor's task is
    /// then reported with `taskStarted`.
    mutating func timeOut(attempt: Int) -> (superseded: Task<Void, Never>?, expired: TimedOutAttempt)? {
        withRunning { running, abandoned -> (Task<Void, Never>?, TimedOutAttempt)? in
            guard let open = running.open, open.attempt == attempt else { return nil }
            running.open = nil
            // The caller's deadline cutting an attempt says nothing of the host's capacity.
            if !open.endsAtDeadline { running.timedOutAttempt = attempt }
            let superseded = running.task
            running.task = nil
            running.handedOver = true
            return (superseded, TimedOutAttempt(permit: open.permit, abandoned: abandoned, endsAtDeadline: open.endsAtDeadline, sent: open.sent))
        } ?? nil
    }
}
