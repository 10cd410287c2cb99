import Foundation
import RequestEngine
import Testing

@testable import OfflineQueue

/// `QueueEntryLifecycle`, its store side `FileWrites`, and `FirstAttemptRace.StateMachine`, one
/// transition at a time.
@Suite struct QueueEntryLifecycleTests {
    private let now = Date(timeIntervalSince1970: 1_000_000)

    private func entry(coalescingKey: String? = nil, attempts: Int = 0) -> QueueEntry {
        var request = Mutation("/profile", body: "v")
        request.coalescingKey = coalescingKey
        var entry = QueueEntry(request)
        entry.attempts = attempts
        return entry
    }

    // MARK: First attempt

    @Test func aFirstAttemptThatIsDeliveredStoresNothing() {
        guard case .sent(201) = QueueEntryLifecycle.firstAttemptEnded(.delivered(status: 201)) else { Issue.record(); return }
    }

    @Test func aFirstAttemptRejectedForGoodStoresNothingAndThrowsItsError() {
        guard case .rejected(.httpError(422, _)) = QueueEntryLifecycle.firstAttemptEnded(.permanent(.httpError(statusCode: 422, data: nil))) else {
            Issue.record(); return
        }
    }

    @Test func aCancelledFirstAttemptStoresNothing() {
        guard case .cancelled = QueueEntryLifecycle.firstAttemptEnded(.stop) else { Issue.record(); return }
    }

    @Test func aFirstAttemptThatFoundNoNetworkIsStoredUncounted() {
        guard case .store(0, nil, nil) = QueueEntryLifecycle.firstAttemptEnded(.offline) else { Issue.record(); return }
    }

    @Test func aFirstAttemptThatFailedForNowIsStoredCountedWithItsBackoff() {
        guard case .store(1, .seconds(10)?, let error?) = QueueEntryLifecycle.firstAttemptEnded(.retry(.timedOut, after: .seconds(10))) else {
            Issue.record(); return
        }
        #expect(error == NetworkError.timedOut.description)
    }

    // MARK: Replacement by a coalescing edit

    @Test func aQueuedHolderIsReplacedInPlaceAndHeldBackUntilTheEditIsStored() {
        var lifecycle = QueueEntryLifecycle()
        let holder = UUID()
        let replacedInPlace = lifecycle.startReplacing(holder)
        #expect(replacedInPlace)
        #expect(lifecycle.isBeingReplaced(holder))
        // A second edit arriving meanwhile does not replace it a second time.
        let replacedTwice = lifecycle.startReplacing(holder)
        #expect(!replacedTwice)
        lifecycle.replacementEnded(holder)
        #expect(!lifecycle.isBeingReplaced(holder))
        #expect(lifecycle.phases.isEmpty)
    }

    @Test func aHolderBeingSentIsNotReplacedInPlace() {
        var lifecycle = QueueEntryLifecycle()
        let holder = UUID()
        lifecycle.replayStarted(holder)
        let replacedWhileSent = lifecycle.startReplacing(holder)
        #expect(!replacedWhileSent)  // the edit is stored beside it
        lifecycle.replacementEnded(holder)  // the edit's end does not touch the send
        #expect(lifecycle.phases[holder] == .sending)
    }

    // MARK: Replay

    @Test func aDeliveredReplayRemovesTheEntryAndReportsIt() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry()
        lifecycle.replayStarted(queued.id)
        let end = lifecycle.replayEnded(queued, .delivered(status: 201), stillQueued: true, supersededBy: nil, maxAttempts: nil, now: now)
        guard case .remove(.delivered(201), .delivered(queued.id, 201)?) = end else { Issue.record("\(end)"); return }
        #expect(lifecycle.phases.isEmpty)
    }

    @Test func aDeliveryOfAnEntryCancelledMeanwhileRemovesItWithoutAReport() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry()
        lifecycle.replayStarted(queued.id)
        let end = lifecycle.replayEnded(queued, .delivered(status: 200), stillQueued: false, supersededBy: nil, maxAttempts: nil, now: now)
        guard case .remove(.delivered(200), nil) = end else { Issue.record("\(end)"); return }
    }

    @Test func aDeliveryOfASupersededEntryStillCountsAsDelivered() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(coalescingKey: "profile")
        lifecycle.replayStarted(queued.id)
        let end = lifecycle.replayEnded(queued, .delivered(status: 204), stillQueued: true, supersededBy: UUID(), maxAttempts: nil, now: now)
        guard case .remove(.delivered(204), .delivered?) = end else { Issue.record("\(end)"); return }
    }

    @Test func aReplayRejectedForGoodRemovesTheEntryAsFailed() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry()
        let end = lifecycle.replayEnded(queued, .permanent(.httpError(statusCode: 409, data: nil)), stillQueued: true, supersededBy: nil, maxAttempts: nil, now: now)
        guard case .remove(.rejected(409), .failedPermanently(queued.id, 409)?) = end else { Issue.record("\(end)"); return }
    }

    @Test func aReplayThatFailedForNowIsCountedAndKeptUntilItsBackoffEnds() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(attempts: 2)
        lifecycle.replayStarted(queued.id)
        let end = lifecycle.replayEnded(queued, .retry(.httpError(statusCode: 503, data: nil), after: .seconds(30)), stillQueued: true, supersededBy: nil, maxAttempts: 5, now: now)
        guard case .keep(let updated, .httpError(503, _), let next) = end else { Issue.record("\(end)"); return }
        #expect(updated.id == queued.id)
        #expect(updated.attempts == 3)
        #expect(next == now.addingTimeInterval(30))
        #expect(updated.nextAttemptAt == next)
        #expect(updated.lastError != nil)
        #expect(lifecycle.phases.isEmpty)
    }

    @Test func aFailedReplayOfAnEntryCancelledMeanwhileChangesNothing() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry()
        let end = lifecycle.replayEnded(queued, .retry(.timedOut, after: .seconds(1)), stillQueued: false, supersededBy: nil, maxAttempts: nil, now: now)
        guard case .leave = end else { Issue.record("\(end)"); return }
    }

    @Test func aFailedReplayOfAnEntryANewerEditSupersededIsRemovedNotRetried() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(coalescingKey: "profile")
        let end = lifecycle.replayEnded(queued, .retry(.timedOut, after: .seconds(1)), stillQueued: true, supersededBy: UUID(), maxAttempts: nil, now: now)
        guard case .supersede = end else { Issue.record("\(end)"); return }
    }

    @Test func theKeysHolderBeingTheEntryItselfIsNotSupersession() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(coalescingKey: "profile")
        let end = lifecycle.replayEnded(queued, .retry(.timedOut, after: .seconds(1)), stillQueued: true, supersededBy: queued.id, maxAttempts: nil, now: now)
        guard case .keep = end else { Issue.record("\(end)"); return }
    }

    @Test func theLastAllowedAttemptDeadLettersTheEntry() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(attempts: 2)
        let end = lifecycle.replayEnded(queued, .retry(.timedOut, after: .seconds(1)), stillQueued: true, supersededBy: nil, maxAttempts: 3, now: now)
        guard case .deadLetter(let updated) = end else { Issue.record("\(end)"); return }
        #expect(updated.attempts == 3)
    }

    @Test func aRetryPolicyThatGivesUpDeadLettersTheEntry() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry()
        let end = lifecycle.replayEnded(queued, .retry(.timedOut, after: QueueEntryLifecycle.neverAgain), stillQueued: true, supersededBy: nil, maxAttempts: nil, now: now)
        guard case .deadLetter(let updated) = end else { Issue.record("\(end)"); return }
        #expect(updated.attempts == 1)
    }

    @Test func anAttemptThatDidNotCountLeavesTheEntryUnlessANewerEditSupersededIt() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(coalescingKey: "profile")
        for outcome in [QueueAttemptOutcome.offline, .stop] {
            guard case .leave = lifecycle.replayEnded(queued, outcome, stillQueued: true, supersededBy: nil, maxAttempts: nil, now: now) else {
                Issue.record(); return
            }
            guard case .supersede = lifecycle.replayEnded(queued, outcome, stillQueued: true, supersededBy: UUID(), maxAttempts: nil, now: now) else {
                Issue.record(); return
            }
            // Cancelled meanwhile: already gone, nothing to supersede.
            guard case .leave = lifecycle.replayEnded(queued, outcome, stillQueued: false, supersededBy: UUID(), maxAttempts: nil, now: now) else {
                Issue.record(); return
            }
        }
    }

    @Test func anEntryWhoseReplayEndedMayBeReplacedAgain() {
        var lifecycle = QueueEntryLifecycle()
        let queued = entry(coalescingKey: "profile")
        lifecycle.replayStarted(queued.id)
        let replacedWhileSent = lifecycle.startReplacing(queued.id)
        #expect(!replacedWhileSent)
        _ = lifecycle.replayEnded(queued, .retry(.timedOut, after: .seconds(1)), stillQueued: true, supersededBy: nil, maxAttempts: nil, now: now)
        let replacedAfterwards = lifecycle.startReplacing(queued.id)
        #expect(replacedAfterwards)
    }

    // MARK: The first attempt's race

    private typealias Race = FirstAttemptRace.StateMachine<Int>

    @Test func anAnswerBeforeTheWaitIsHandedOverWhenTheEnqueueWaits() {
        var race = Race()
        guard case .none = race.answer(.timedOut) else { Issue.record(); return }
        guard case .resume(7, .timedOut) = race.wait(7) else { Issue.record(); return }
    }

    @Test func anAnswerAfterTheWaitResumesTheEnqueue() {
        var race = Race()
        guard case .none = race.wait(7) else { Issue.record(); return }
        guard case .resume(7, .attempt(.delivered(201))) = race.answer(.attempt(.delivered(status: 201))) else { Issue.record(); return }
    }

    @Test func onlyTheFirstAnswerCountsBeforeTheWait() {
        // The timer fires as the attempt ends: the enqueue sees the timeout, never both.
        var race = Race()
        _ = race.answer(.timedOut)
        guard case .none = race.answer(.attempt(.delivered(status: 200))) else { Issue.record(); return }
        guard case .resume(1, .timedOut) = race.wait(1) else { Issue.record(); return }
    }

    @Test func onlyTheFirstAnswerCountsAfterTheWait() {
        // The caller is cancelled as the attempt ends: resumed once, with the cancellation.
        var race = Race()
        _ = race.wait(1)
        guard case .resume(1, .callerCancelled) = race.answer(.callerCancelled) else { Issue.record(); return }
        guard case .none = race.answer(.attempt(.delivered(status: 200))) else { Issue.record(); return }
        guard case .none = race.answer(.timedOut) else { Issue.record(); return }
    }

    @Test func theRaceHandsTheFirstAnswerToItsWaiter() async {
        let race = FirstAttemptRace()
        let waiter = Task { await race.value }
        race.answer(.attempt(.offline))
        race.answer(.timedOut)
        guard case .attempt(.offline) = await waiter.value else { Issue.record(); return }
    }

    // MARK: The store's side: a file's writes against its entry's removal

    @Test func aWriteWithNoRemovalKeepsItsFile() {
        var writes = QueueEntryLifecycle.FileWrites()
        let id = UUID()
        let ticket = writes.writeStarted(id)
        #expect(writes.writeEnded(id, ticket) == false)
        #expect(writes.isIdle)
    }

    @Test func anEntryRemovedWhileItsFileIsWrittenHasThatFileDeletedAgain() {
        // The race guarded: a delivery (or a cancel) that removes the entry while a kept retry's
        // write is on the pool; the write lands after the unlink and would bring the entry back
        // at the next open.
        var writes = QueueEntryLifecycle.FileWrites()
        let id = UUID()
        let ticket = writes.writeStarted(id)
        writes.removed(id)
        #expect(writes.writeEnded(id, ticket) == true)
        #expect(writes.isIdle)
    }

    @Test func aWriteThatBeganAfterTheRemovalStands() {
        // The same id stored anew (a coalescing edit in place) while an older write of it is still
        // in flight: only the older write is undone by the removal between them.
        var writes = QueueEntryLifecycle.FileWrites()
        let id = UUID()
        let older = writes.writeStarted(id)
        writes.removed(id)
        let newer = writes.writeStarted(id)
        #expect(writes.writeEnded(id, older) == true)
        #expect(writes.writeEnded(id, newer) == false)
        #expect(writes.isIdle)
    }

    @Test func aRemovalUndoneLeavesTheWritesInFlightStanding() {
        // `remove(id:)` could not delete the file (a read-only folder): the entry is queued again,
        // so a write in flight must keep its file.
        var writes = QueueEntryLifecycle.FileWrites()
        let id = UUID()
        let ticket = writes.writeStarted(id)
        writes.removed(id)
        writes.removalUndone(id)
        #expect(writes.writeEnded(id, ticket) == false)
    }

    @Test func aRemovalWithNoWriteInFlightLeavesNothingBehind() {
        var writes = QueueEntryLifecycle.FileWrites()
        let id = UUID()
        writes.removed(id)
        #expect(writes.isIdle)
        let ticket = writes.writeStarted(id)  // stored again later: not undone by the old removal
        #expect(writes.writeEnded(id, ticket) == false)
    }

    @Test func anotherEntrysRemovalDoesNotUndoAWrite() {
        var writes = QueueEntryLifecycle.FileWrites()
        let written = UUID()
        let other = UUID()
        let ticket = writes.writeStarted(written)
        let otherTicket = writes.writeStarted(other)
        writes.removed(other)
        #expect(writes.writeEnded(written, ticket) == false)
        #expect(writes.writeEnded(other, otherTicket) == true)
    }
}
