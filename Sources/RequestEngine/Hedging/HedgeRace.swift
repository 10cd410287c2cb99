import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One engine attempt sent as up to `maxAttempts` hedged copies (see `HedgingPolicy`).
///
/// The copies run in tasks of their own, not in a task group: a group waits for every child, so a
/// session that is slow to honour cancellation would hold the winner's answer back. Here the
/// first acceptable answer resumes the attempt at once and the other copies are cancelled and
/// left to wind down.
///
/// The decisions (when the next copy goes, which answer ends the attempt) are
/// `RequestStateMachine.HedgedAttempt`'s; this class holds it under one lock with the copies'
/// tasks and the attempt's continuation, and performs what it returns. Races settled there, once:
/// - two copies answering together: the first to take the lock decides, the other's answer is
///   dropped;
/// - the attempt cancelled (its caller left, or its timeout or deadline fired) before the race has
///   installed its continuation: the decision is recorded and taken as it installs;
/// - the hedge timer firing after the decision: it finds the race decided and sends nothing.
final class HedgeRace: Sendable {
    typealias Answer = Result<(Data, ResponseHead), NetworkError>
    private typealias Machine = RequestStateMachine.HedgedAttempt

    private struct State: Sendable {
        /// When the next copy goes and which answer ends the attempt.
        var machine: Machine
        var continuation: UnsafeContinuation<Answer, Never>?
        /// The answer once decided: a continuation installed after the decision takes it.
        var answer: Answer?
        var tasks: [Task<Void, Never>] = []
    }

    /// A decision to perform once the lock is released.
    private typealias Settlement = (continuation: UnsafeContinuation<Answer, Never>?, tasks: [Task<Void, Never>], answer: Answer)

    private let state: Locked<State>
    private let time: TimeSource
    private let started: Duration
    /// Sends copy number N (0: the first; further copies are hedges).
    private let send: @Sendable (Int) async -> Answer
    /// Whether a further copy may be sent (the retry budget's token).
    private let mayHedge: @Sendable () -> Bool
    /// Told of each further copy (its number and seconds since the first), before it is sent.
    private let onHedge: (@Sendable (Int, TimeInterval) async -> Void)?
    private let delay: Duration

    init(
        policy: HedgingPolicy,
        time: TimeSource,
        send: @escaping @Sendable (Int) async -> Answer,
        mayHedge: @escaping @Sendable () -> Bool,
        onHedge: (@Sendable (Int, TimeInterval) async -> Void)?
    ) {
        self.state = Locked(State(machine: Machine(maxCopies: policy.maxAttempts)))
        self.delay = policy.delay
        self.time = time
        self.started = time.now()
        self.send = send
        self.mayHedge = mayHedge
        self.onHedge = onHedge
    }

    /// Sends the first copy, hedges as the policy says, and returns the winning answer.
    /// A cancelled caller gets `.cancelled` at once and every copy is cancelled.
    func run() async -> Answer {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                let decided = state.withLock { state -> Answer? in
                    if let answer = state.answer { return answer }
                    state.continuation = continuation
                    let settled = perform(state.machine.start(), &state)
                    precondition(settled == nil, "a hedged attempt's start launches its first copy")
                    return nil
                }
                if let decided { continuation.resume(returning: decided) }
            }
        } onCancel: {
            feed { $0.cancelled() }
        }
    }

    /// Feeds the machine an event under the lock and performs its step; a decision resumes the
    /// attempt and cancels the copies and the timer after the lock is released.
    private func feed(_ event: (inout Machine) -> Machine.Step) {
        let settlement = state.withLock { state in perform(event(&state.machine), &state) }
        guard let settlement else { return }
        settlement.continuation?.resume(returning: settlement.answer)
        for task in settlement.tasks { task.cancel() }
    }

    /// Performs `step` under the lock: a copy is started at once (its task is recorded before any
    /// decision can need to cancel it); a decision is recorded and returned to be carried out.
    private func perform(_ step: Machine.Step, _ state: inout State) -> Settlement? {
        switch step {
        case .wait:
            return nil
        case .launch(let copy, let armTimer):
            let elapsed = copy == 0 ? 0 : (time.now() - started).seconds
            state.tasks.append(
                Task { [self] in
                    if copy > 0, let onHedge { await onHedge(copy, elapsed) }
                    let answer = await send(copy)
                    feed { [mayHedge] in $0.answered(answer, mayHedge: mayHedge) }
                })
            if armTimer {
                state.tasks.append(
                    Task { [self, time, delay] in
                        do { try await time.sleep(delay) } catch { return }
                        feed { [mayHedge] in $0.timerFired(mayHedge: mayHedge) }
                    })
            }
            return nil
        case .decide(let answer):
            state.answer = answer
            defer {
                state.continuation = nil
                state.tasks = []
            }
            return (state.continuation, state.tasks, answer)
        }
    }
}
