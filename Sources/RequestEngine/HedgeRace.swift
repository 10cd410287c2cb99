import Foundation
import ResilienceCore

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
/// Races this settles (all under one lock, decided once):
/// - two copies answering together: the first to take the lock decides, the other's answer is
///   dropped;
/// - the attempt cancelled (its caller left, or its timeout or deadline fired) before the race has
///   installed its continuation: the decision is recorded and taken as it installs;
/// - the hedge timer firing after the decision: it finds the race decided and sends nothing.
final class HedgeRace: Sendable {
    typealias Answer = Result<(Data, HTTPURLResponse), NetworkError>

    private struct State: Sendable {
        var continuation: UnsafeContinuation<Answer, Never>?
        var decided: Answer?
        var tasks: [Task<Void, Never>] = []
        var launched = 0
        var pending = 0
        /// The latest failure that came from the server or the network (not a limiter's refusal).
        var lastFailure: Answer?
    }

    private let state = Locked(State())
    private let policy: HedgingPolicy
    private let time: TimeSource
    private let started: Duration
    /// Sends copy number N (0: the first; further copies are hedges).
    private let send: @Sendable (Int) async -> Answer
    /// Whether a further copy may be sent (the retry budget's token).
    private let mayHedge: @Sendable () -> Bool
    /// Told of each further copy (its number and seconds since the first), before it is sent.
    private let onHedge: (@Sendable (Int, TimeInterval) async -> Void)?

    init(
        policy: HedgingPolicy,
        time: TimeSource,
        send: @escaping @Sendable (Int) async -> Answer,
        mayHedge: @escaping @Sendable () -> Bool,
        onHedge: (@Sendable (Int, TimeInterval) async -> Void)?
    ) {
        self.policy = policy
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
                    if let decided = state.decided { return decided }
                    state.continuation = continuation
                    launch(&state)
                    return nil
                }
                if let decided { continuation.resume(returning: decided) }
            }
        } onCancel: {
            decide(.failure(.cancelled))
        }
    }

    /// Starts copy number `state.launched` (under the lock); the first one also arms the timer.
    private func launch(_ state: inout State) {
        let copy = state.launched
        state.launched += 1
        state.pending += 1
        let elapsed = copy == 0 ? 0 : (time.now() - started).seconds
        state.tasks.append(
            Task { [self] in
                if copy > 0, let onHedge { await onHedge(copy, elapsed) }
                answer(await send(copy))
            })
        if state.launched < policy.maxAttempts { armTimer(&state) }
    }

    private func armTimer(_ state: inout State) {
        let delay = policy.delay
        state.tasks.append(
            Task { [self, time] in
                do { try await time.sleep(delay) } catch { return }
                timerFired()
            })
    }

    /// `delay` passed since the last copy was sent without an acceptable answer.
    private func timerFired() {
        state.withLock { state in
            guard state.decided == nil, state.launched < policy.maxAttempts, mayHedge() else { return }
            launch(&state)
        }
    }

    private func answer(_ answer: Answer) {
        let decision = state.withLock { state -> Answer? in
            guard state.decided == nil else { return nil }
            state.pending -= 1
            switch Self.verdict(on: answer) {
            case .ends:
                return answer
            case .refused:
                // A limiter kept this copy off the wire: it says nothing of the server. The race
                // ends with a real failure if there was one, and sends no copy at once after it.
                return state.pending == 0 ? (state.lastFailure ?? answer) : nil
            case .failed:
                state.lastFailure = answer
                guard state.pending == 0 else { return nil }
                // Every copy sent has failed: the next goes at once, if one may.
                if state.launched < policy.maxAttempts, mayHedge() {
                    launch(&state)
                    return nil
                }
                return answer
            }
        }
        if let decision { decide(decision) }
    }

    /// Settles the race once: resumes the attempt and cancels every copy and the timer.
    private func decide(_ answer: Answer) {
        let settled = state.withLock { state -> (UnsafeContinuation<Answer, Never>?, [Task<Void, Never>])? in
            guard state.decided == nil else { return nil }
            state.decided = answer
            defer { state.continuation = nil; state.tasks = [] }
            return (state.continuation, state.tasks)
        }
        guard let (continuation, tasks) = settled else { return }
        continuation?.resume(returning: answer)
        for task in tasks { task.cancel() }
    }

    /// What an answer means for the race.
    enum Verdict: Equatable {
        /// It ends the race: acceptable (anything but a retryable failure), or a retryable
        /// status that carries `Retry-After` (the server asked for a pause: no more copies now).
        case ends
        /// A retryable failure: the other copies may still do better.
        case failed
        /// A limiter's refusal (or a copy cancelled on its own): nothing was learnt.
        case refused
    }

    static func verdict(on answer: Answer) -> Verdict {
        switch answer {
        case .success(let (_, response)):
            guard ResponseClassification.isRetryable(status: response.statusCode) else { return .ends }
            return ResponseClassification(response).retryAfter == nil ? .failed : .ends
        case .failure(let error):
            switch error {
            case .cancelled, .limited: return .refused
            default: return error.isRetryable ? .failed : .ends
            }
        }
    }
}
