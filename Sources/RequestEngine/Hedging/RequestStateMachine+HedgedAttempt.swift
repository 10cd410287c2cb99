import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension RequestStateMachine {
    /// One attempt sent as up to `maxCopies` hedged copies: when the next copy goes, and which
    /// answer ends the attempt. `HedgeRace` holds one under its lock, with the copies' tasks and
    /// the attempt's continuation, and performs what it returns.
    ///
    /// ```
    ///   start ──► copy 0 sent ──(delay, unanswered)──► copy 1 sent ── … ──► copy maxCopies − 1 sent
    ///                 │ an answer that ends it, every copy failed with none left to send,
    ///                 │ or the attempt cancelled
    ///                 ▼
    ///              decided (once: later answers and timers change nothing)
    /// ```
    struct HedgedAttempt: Sendable {
        /// What `HedgeRace` does next.
        enum Step: Sendable {
            /// Send copy `copy`; arm the hedge timer when `armTimer` (more copies may follow).
            case launch(copy: Int, armTimer: Bool)
            /// The attempt's answer: resume it and cancel every copy and the timer.
            case decide(Outcome)
            /// Nothing to do.
            case wait
        }

        let maxCopies: Int
        private(set) var launched = 0
        /// Copies sent and not answered yet.
        private(set) var pending = 0
        private(set) var decided = false
        /// The latest failure that came from the server or the network (not a limiter's refusal).
        private(set) var lastFailure: Outcome?

        init(maxCopies: Int) {
            self.maxCopies = max(1, maxCopies)
        }

        /// The attempt starts: its first copy goes.
        mutating func start() -> Step {
            precondition(launched == 0, "start after \(launched) copies")
            return launch()
        }

        /// The hedge delay passed since the last copy without an acceptable answer: the next copy
        /// goes, if one is left and `mayHedge` (the throttle and the budget) allows it.
        mutating func timerFired(mayHedge: () -> Bool) -> Step {
            guard !decided, launched < maxCopies, mayHedge() else { return .wait }
            return launch()
        }

        /// Copy's answer. Races settled: two copies answering together (the first to be fed
        /// decides, the other's answer changes nothing); a copy answering after the decision.
        mutating func answered(_ answer: Outcome, mayHedge: () -> Bool) -> Step {
            guard !decided else { return .wait }
            pending -= 1
            switch Self.verdict(on: answer) {
            case .ends:
                return decide(answer)
            case .refused:
                // A limiter kept this copy off the wire: it says nothing of the server. The race
                // ends with a real failure if there was one, and sends no copy at once after it.
                return pending == 0 ? decide(lastFailure ?? answer) : .wait
            case .failed:
                lastFailure = answer
                guard pending == 0 else { return .wait }
                // Every copy sent has failed: the next goes at once, if one may.
                if launched < maxCopies, mayHedge() { return launch() }
                return decide(answer)
            }
        }

        /// The attempt is cancelled (its caller left, or its timeout or deadline fired), possibly
        /// before the race has installed its continuation: `.decide(.cancelled)` unless decided.
        mutating func cancelled() -> Step {
            guard !decided else { return .wait }
            return decide(.failure(.cancelled))
        }

        private mutating func launch() -> Step {
            let copy = launched
            launched += 1
            pending += 1
            return .launch(copy: copy, armTimer: launched < maxCopies)
        }

        private mutating func decide(_ answer: Outcome) -> Step {
            decided = true
            return .decide(answer)
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

        static func verdict(on answer: Outcome) -> Verdict {
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
}
