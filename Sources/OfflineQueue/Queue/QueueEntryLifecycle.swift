import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// How one send of a queued request ended, classified by the outcome table of
/// Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md.
enum QueueAttemptOutcome: Sendable {
    /// A 2xx: the server has it.
    case delivered(status: Int)
    /// Failed for good (4xx other than 408/429, 501, an invalid request): sending again would fail
    /// the same way.
    case permanent(NetworkError)
    /// Failed for now; the next attempt may go `after` this wait (backoff or `Retry-After`).
    case retry(NetworkError, after: Duration)
    /// The network is unreachable: the entry is untouched, the attempt not counted.
    case offline
    /// Cancelled (the caller, `stop()`, a drain budget): untouched, not counted.
    case stop
}

/// The life of the queue's entries, as one value the queue's actor owns and follows. It answers
/// three questions: which entry is being sent, which is being replaced by a newer edit of its
/// coalescing key, and what an attempt's outcome does to an entry that may have changed while the
/// attempt was away. `OfflineQueueEngine` performs what it
/// returns (writes, deletions, results); the rules are tested one transition at a time
/// (`QueueEntryLifecycleTests`).
///
/// An entry's states, and what moves it between them:
///
///     offered ──first attempt──▶ gone (delivered · rejected · cancelled)
///        │ failed for now, or no network: stored
///        ▼
///     queued ──replay──▶ sending ──▶ gone (delivered · failed · dead-lettered · superseded)
///      ▲ │ ▲                │
///      │ │ └────────────────┘ kept until a time (backoff, Retry-After)
///      │ ├─▶ being replaced ─▶ gone (a coalescing edit took its place; `superseded`)
///      │ └─▶ gone (expired · cancelled)
///      └── being replaced, but the edit's write failed
///
/// `offered` lives in the enqueue that makes the first attempt (`FirstAttemptRace` decides how
/// that attempt ends); `sending` and `being replaced` are held here; `queued` is the store's
/// index, which other code changes too (`DiskQueueStore.save`, `delete`, `cancel(id:)`), so an
/// attempt that ends asks the store what became of its entry meanwhile and passes the answer in.
/// The store follows the same lifecycle for its files: `FileWrites` (below) decides what a write
/// that ends after its entry has gone does.
struct QueueEntryLifecycle: Sendable {
    /// A stored entry's state beyond "queued".
    enum Phase: Equatable, Sendable {
        /// A replay is sending it.
        case sending
        /// A newer edit of its coalescing key is being written to replace it.
        case beingReplaced
    }

    /// What an enqueue does once its first attempt has ended.
    enum FirstAttemptEnd: Sendable {
        /// Delivered: nothing is stored; the caller gets `.sent`.
        case sent(statusCode: Int)
        /// Rejected for good: nothing is stored; the caller gets the error.
        case rejected(NetworkError)
        /// Cancelled: nothing is stored; the caller gets `cancelled`.
        case cancelled
        /// Stored for a replay, with the first attempt counted (or not, when the network was
        /// unreachable) and its backoff.
        case store(attempts: Int, retryAfter: Duration?, lastError: String?)
        /// The server answered `412`/`428` and the queue has a `ConflictResolver`: stored in
        /// conflict, the attempt counted; the next pass resolves it.
        case storeInConflict(status: Int)
    }

    /// What the queue does with an entry whose replay has ended.
    enum ReplayEnd: Sendable {
        /// Forget it and delete its file; report `result` (nil when it had left the queue meanwhile:
        /// cancelled, so nobody waits for its outcome).
        case remove(QueueRemovalReason, result: QueueEntryResult?)
        /// A newer edit of its coalescing key was stored while it was away: remove it (whatever the
        /// outcome, it must never be sent after the newer edit), reporting nothing.
        case supersede
        /// Count the attempt and keep it (as `entry`) until `nextAttemptAt`; report `keptForRetry`.
        case keep(QueueEntry, error: NetworkError, nextAttemptAt: Date)
        /// Out of attempts, or the retry policy gave up: move it to `dead-letter/` as `entry`.
        case deadLetter(QueueEntry)
        /// Nothing changes: it was cancelled meanwhile, or the attempt did not count (offline,
        /// the pass was stopped).
        case leave
    }

    /// The wait that means the retry policy gave up: the queue's backoff is this for a `nil` from
    /// the policy, and a replay that must wait this long or longer is dead-lettered.
    static let neverAgain = Duration.seconds(Int64.max / 8)

    private(set) var phases: [UUID: Phase] = [:]

    /// The first attempt of an enqueue ended with `outcome`.
    static func firstAttemptEnded(_ outcome: QueueAttemptOutcome) -> FirstAttemptEnd {
        switch outcome {
        case .delivered(let status): .sent(statusCode: status)
        case .permanent(let error): .rejected(error)
        case .stop: .cancelled
        case .offline: .store(attempts: 0, retryAfter: nil, lastError: nil)
        case .retry(let error, let delay): .store(attempts: 1, retryAfter: delay, lastError: error.description)
        }
    }

    /// Whether a new edit of `holder`'s coalescing key may replace it in place — it may unless it is
    /// being sent or already being replaced, in which case the edit is stored beside it (and the
    /// holder superseded when its attempt ends). When it may, `holder` is being replaced until
    /// `replacementEnded(_:)`.
    mutating func startReplacing(_ holder: UUID) -> Bool {
        guard phases[holder] == nil else { return false }
        phases[holder] = .beingReplaced
        return true
    }

    /// The replacing edit is stored, or its write failed (the holder then stays queued as it was).
    mutating func replacementEnded(_ holder: UUID) {
        if phases[holder] == .beingReplaced { phases[holder] = nil }
    }

    /// Whether a replay must hold `id` back: a newer edit is being written over it.
    func isBeingReplaced(_ id: UUID) -> Bool { phases[id] == .beingReplaced }

    /// A replay starts sending `id`.
    mutating func replayStarted(_ id: UUID) {
        phases[id] = .sending
    }

    /// The send of `id` is settled (its claim ended), whatever became of it.
    mutating func sendSettled(_ id: UUID) {
        if phases[id] == .sending { phases[id] = nil }
    }

    /// `entry`'s replay ended with `outcome`.
    ///
    /// - Parameters:
    ///   - stillQueued: whether the store still holds the entry (it may have been cancelled, or
    ///     cleared, while the attempt was away).
    ///   - supersededBy: the id now holding the entry's coalescing key, if another (an edit stored
    ///     beside it while it was being sent).
    ///   - maxAttempts: the queue's dead-letter threshold.
    ///   - now: the queue's wall-clock time, for the next attempt's time.
    mutating func replayEnded(
        _ entry: QueueEntry,
        _ outcome: QueueAttemptOutcome,
        stillQueued: Bool,
        supersededBy: UUID?,
        maxAttempts: Int?,
        now: Date
    ) -> ReplayEnd {
        phases[entry.id] = nil
        let superseded = supersededBy.map { $0 != entry.id } ?? false
        switch outcome {
        case .delivered(let status):
            // Delivered counts even when it was cancelled or superseded meanwhile: the server has it.
            return .remove(.delivered(statusCode: status), result: stillQueued ? .delivered(id: entry.id, statusCode: status) : nil)
        case .permanent(let error):
            return .remove(
                .rejected(statusCode: error.statusCode),
                result: stillQueued ? .failedPermanently(id: entry.id, statusCode: error.statusCode) : nil
            )
        case .retry(let error, let delay):
            guard stillQueued else { return .leave }
            if superseded { return .supersede }
            var updated = entry
            updated.attempts = entry.attemptsAfterOneMore
            updated.lastError = error.description
            let exhausted = maxAttempts.map { updated.attempts >= $0 } ?? false
            if exhausted || delay >= Self.neverAgain { return .deadLetter(updated) }
            let next = now.addingTimeInterval(delay.seconds)
            updated.nextAttemptAt = next
            return .keep(updated, error: error, nextAttemptAt: next)
        case .offline, .stop:
            return superseded && stillQueued ? .supersede : .leave
        }
    }
}

extension QueueEntryLifecycle {
    /// The store's side of an entry's life: its file is being written (an enqueue, a kept retry's
    /// new attempt count, a coalescing edit in place) while the queue may take the entry out of the
    /// index (delivered, failed, dead-lettered, expired, superseded, cancelled: "gone" above). The
    /// removal wins: a write that ends after its entry was removed must delete the file it has just
    /// written, or a delivered entry would come back at the next open. `DiskQueueStore` holds this
    /// value under its lock and performs what it answers.
    ///
    ///     queued ──write starts──▶ writing (n writes) ──the last ends──▶ queued
    ///                                │ removed
    ///                                ▼
    ///                  removed while writing ──a write that began before the removal ends──▶
    ///                                            its file is deleted again
    ///
    /// A write that begins after the removal (the same id stored anew) is not undone by it: each
    /// write keeps a ticket that says which removals it has seen.
    struct FileWrites: Sendable {
        /// Which removals a write had seen when it began.
        struct Ticket: Sendable {
            fileprivate let removalsSeen: UInt64
        }

        private struct Writing: Sendable {
            var count: Int
            /// The number of the last removal while writes were in flight.
            var lastRemoval: UInt64?
        }

        private var writing: [UUID: Writing] = [:]
        /// Counts removals of ids with writes in flight.
        private var removals: UInt64 = 0

        /// Whether no write is in flight (for tests: nothing is kept once the writes end).
        var isIdle: Bool { writing.isEmpty }

        /// A write of `id`'s file begins.
        mutating func writeStarted(_ id: UUID) -> Ticket {
            writing[id, default: Writing(count: 0)].count += 1
            return Ticket(removalsSeen: removals)
        }

        /// `id` left the index. Matters only while a write of it is in flight.
        mutating func removed(_ id: UUID) {
            guard writing[id] != nil else { return }
            removals += 1
            writing[id]?.lastRemoval = removals
        }

        /// A removal of `id` did not happen after all (its file could not be deleted, so it is
        /// queued again): the writes in flight stand.
        mutating func removalUndone(_ id: UUID) {
            writing[id]?.lastRemoval = nil
        }

        /// The write with `ticket` has ended (written or failed). True when `id` was removed after
        /// it began: the file it wrote must be deleted.
        mutating func writeEnded(_ id: UUID, _ ticket: Ticket) -> Bool {
            guard var entry = writing[id] else { return false }
            let removedMeanwhile = (entry.lastRemoval ?? 0) > ticket.removalsSeen
            entry.count -= 1
            writing[id] = entry.count == 0 ? nil : entry
            return removedMeanwhile
        }
    }
}

/// An enqueue's first attempt races its time limit and its caller's cancellation: the first of
/// the three to answer decides how the attempt ended, and the later ones are ignored. Its state
/// machine is `FirstAttemptRace.StateMachine` (tested on its own); this class holds it under a lock
/// and the enqueue's continuation in it.
///
/// The same race decides other first answers (a claimed entry's send against its lease's end and
/// its pass's cancellation): `FirstAnswer` is generic over who answers.
final class FirstAnswer<Answer: Sendable>: Sendable {
    /// The race as a value: running, someone waiting, answered, finished. `Waiter` is the waiting
    /// task's continuation (anything in tests).
    struct StateMachine<Waiter: Sendable>: Sendable {
        private enum State {
            /// Nobody has answered and nobody waits yet.
            case running
            /// The waiter waits; nobody has answered.
            case waiting(Waiter)
            /// Answered before anyone waited.
            case answered(Answer)
            /// The enqueue has its answer.
            case finished
        }

        /// What the owner does after an event.
        enum Action {
            /// Resume the waiting enqueue with the answer.
            case resume(Waiter, Answer)
            /// Nothing (the answer is kept for the wait, or comes too late and is ignored).
            case none
        }

        private var state = State.running

        init() {}

        /// One racer answers. Only the first answer counts — the race guarded here: an attempt
        /// that ends just as its timer fires, or as its caller is cancelled, must not resume the
        /// enqueue twice, nor hand it the later of the two.
        mutating func answer(_ answer: Answer) -> Action {
            switch state {
            case .running:
                state = .answered(answer)
                return .none
            case .waiting(let waiter):
                state = .finished
                return .resume(waiter, answer)
            case .answered, .finished:
                return .none
            }
        }

        /// The waiter waits for the answer: resumed at once if one came first. Waiting twice is a
        /// programming error.
        mutating func wait(_ waiter: Waiter) -> Action {
            switch state {
            case .running:
                state = .waiting(waiter)
                return .none
            case .answered(let answer):
                state = .finished
                return .resume(waiter, answer)
            case .waiting, .finished:
                preconditionFailure("a first answer is awaited once")
            }
        }
    }

    private let machine = Locked(StateMachine<CheckedContinuation<Answer, Never>>())

    func answer(_ answer: Answer) {
        if case .resume(let waiter, let answer) = machine.withLock({ $0.answer(answer) }) {
            waiter.resume(returning: answer)
        }
    }

    /// The first answer; awaited once.
    var value: Answer {
        get async {
            await withCheckedContinuation { continuation in
                if case .resume(let waiter, let answer) = machine.withLock({ $0.wait(continuation) }) {
                    waiter.resume(returning: answer)
                }
            }
        }
    }
}

/// Who answers first in an enqueue's first attempt.
enum FirstAttemptAnswer: Sendable {
    /// The attempt ended, with this outcome.
    case attempt(QueueAttemptOutcome)
    /// The time limit passed first (the attempt is cancelled and counts as timed out).
    case timedOut
    /// The enqueue's caller was cancelled first.
    case callerCancelled
}

/// An enqueue's first attempt against its time limit and its caller's cancellation.
typealias FirstAttemptRace = FirstAnswer<FirstAttemptAnswer>
