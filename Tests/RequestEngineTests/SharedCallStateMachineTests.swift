import Foundation
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("SharedCallStateMachine: one logical request's life, transition by transition")
struct SharedCallStateMachineTests {
    typealias Machine = SharedCallStateMachine

    private let ok: Machine.Outcome = .success(
        (
            Data("ok".utf8),
            ResponseHead(
                HTTPURLResponse(url: URL(string: "https://api.example.test/")!, statusCode: 200, httpVersion: nil, headerFields: nil)!)
        ))

    private func task() -> Task<Void, Never> { Task {} }

    private func phaseName(_ machine: Machine) -> String {
        switch machine.phase {
        case .running: "running(\(machine.running.waiting))"
        case .abandoned: "abandoned"
        case .completed: "completed"
        }
    }

    @Test func aNewCallRunsWithItsFirstWaiterAndOthersJoin() {
        var machine = Machine()
        #expect(phaseName(machine) == "running(1)")
        let second = machine.join()
        let third = machine.join()
        #expect(second != nil && third != nil && second != third && second != machine.firstTicket)
        #expect(phaseName(machine) == "running(3)")
    }

    // A call run in its caller's task: that caller holds `firstTicket` and never suspends.

    /// Race guarded: the runner's cancellation and a joiner's arrival. Decided under the lock, the
    /// joiner either counts (the runner hands over) or finds the call abandoned (it starts anew).
    @Test func aRunnerThatLeavesWhileOthersWaitHandsOverAndItsOwnAnswerIsCancelled() {
        var machine = Machine()
        let joiner = machine.join()
        #expect(joiner != nil)
        let handsOver = machine.runnerLeaves()
        #expect(handsOver)
        #expect(machine.runnerLeft)
        #expect(phaseName(machine) == "running(1)")
        let cancelSuccessor = machine.taskStarted(task())
        #expect(!cancelSuccessor)  // the successor is recorded and runs
        let answered = machine.complete(ok)
        #expect(answered != nil)
        #expect(phaseName(machine) == "completed")
    }

    @Test func aRunnerThatLeavesAloneAbandonsTheCallAndNobodyCanJoinIt() {
        var machine = Machine()
        let handsOver = machine.runnerLeaves()
        #expect(!handsOver)
        #expect(phaseName(machine) == "abandoned")
        let late = machine.join()
        #expect(late == nil)
        // The joiner that left first: the runner is then the last, and abandons the call too.
        var other = Machine()
        let joiner = other.join()!
        _ = other.leave(joiner)
        let otherHandsOver = other.runnerLeaves()
        #expect(!otherHandsOver)
        #expect(phaseName(other) == "abandoned")
        // After the outcome there is nothing to hand over.
        var done = Machine()
        _ = done.complete(ok)
        let doneHandsOver = done.runnerLeaves()
        #expect(!doneHandsOver)
        #expect(!done.runnerLeft)
    }

    @Test func theTaskIsRecordedAndCancelledAtOnceOnlyIfTheCallWasAbandoned() {
        var machine = Machine()
        let started = machine.taskStarted(task())
        #expect(!started)
        var abandoned = Machine()
        _ = abandoned.leave(abandoned.firstTicket)
        let cancelAtOnce = abandoned.taskStarted(task())
        #expect(cancelAtOnce)
    }

    @Test func theLastWaiterLeavingAbandonsTheCallAndCancelsItsTask() {
        var machine = Machine()
        let running = task()
        _ = machine.taskStarted(running)
        let other = machine.join()!
        let first = machine.leave(machine.firstTicket)
        #expect(first.taskToCancel == nil)
        #expect(phaseName(machine) == "running(1)")
        let last = machine.leave(other)
        #expect(last.taskToCancel == running)
        #expect(phaseName(machine) == "abandoned")
        let lateJoin = machine.join()
        #expect(lateJoin == nil, "nobody joins an abandoned call")
    }

    @Test func aWaiterThatLeftBeforeSuspendingIsAnsweredCancelledAsItInstalls() async {
        var machine = Machine()
        let other = machine.join()!
        let departure = machine.leave(other)
        #expect(departure.waiter == nil, "it had not suspended")
        let answer: Machine.Outcome? = await withUnsafeContinuation { continuation in
            let value = machine.install(other, continuation)
            continuation.resume(returning: value ?? .failure(.invalidResponse))
        }
        guard case .failure(.cancelled)? = answer else {
            Issue.record("expected .cancelled, got \(String(describing: answer))")
            return
        }
    }

    @Test func completingAnswersEveryoneOnceAndLateInstallersFindTheOutcome() {
        var machine = Machine()
        let joined = machine.join()!
        let waiters = machine.complete(ok)
        #expect(waiters?.isEmpty == true, "nobody had suspended")
        #expect(phaseName(machine) == "completed")
        let second = machine.complete(.failure(.timedOut))
        #expect(second == nil, "a second outcome is dropped")
        let lateJoin = machine.join()
        #expect(lateJoin == nil)
        let leaving = machine.leave(joined)
        #expect(leaving.waiter == nil && leaving.taskToCancel == nil, "leaving after completion changes nothing")
    }

    @Test func anAttemptIsClaimedByItsTaskOrByItsTimeoutNeverBoth() {
        var machine = Machine()
        let first = task()
        _ = machine.taskStarted(first)
        machine.open(attempt: 0, permit: nil)
        let claimed = machine.claim(attempt: 0)
        #expect(claimed)
        let lateTimeout = machine.timeOut(attempt: 0)
        #expect(lateTimeout == nil, "the response came first")

        machine.open(attempt: 1, permit: nil)
        let handOff = machine.timeOut(attempt: 1)
        #expect(handOff?.superseded == first)
        #expect(handOff?.expired.abandoned == false)
        let lateClaim = machine.claim(attempt: 1)
        #expect(!lateClaim, "the superseded task's late response is dropped")
        let successorCancelled = machine.taskStarted(task())
        #expect(!successorCancelled)
    }

    @Test func aTimeoutAfterEveryWaiterLeftTellsTheSuccessorAndCancelsIt() {
        var machine = Machine()
        _ = machine.taskStarted(task())
        machine.open(attempt: 0, permit: nil)
        _ = machine.leave(machine.firstTicket)
        let handOff = machine.timeOut(attempt: 0)
        #expect(handOff?.expired.abandoned == true)
        let cancelSuccessor = machine.taskStarted(task())
        #expect(cancelSuccessor)
    }

    // The first task is made outside the call's lock, so it may run, and a timeout or the outcome
    // may come, before `firstTaskStarted` records it (an abandoned call is a guard: the first
    // waiter waits only once the task is recorded).

    @Test func aFirstTaskReportedAfterItsTimeoutHandedOverIsCancelledAndDoesNotReplaceTheSuccessor() {
        var machine = Machine()
        machine.open(attempt: 0, permit: nil)
        let handOff = machine.timeOut(attempt: 0)
        #expect(handOff != nil && handOff?.superseded == nil, "no handle to cancel yet")
        let successor = task()
        let cancelSuccessor = machine.taskStarted(successor)
        #expect(!cancelSuccessor)
        let cancelFirst = machine.firstTaskStarted(task())
        #expect(cancelFirst, "the first task has been superseded")
        let other = machine.join()!
        _ = machine.leave(machine.firstTicket)
        let last = machine.leave(other)
        #expect(last.taskToCancel == successor, "the successor is still the call's task")
    }

    @Test func aFirstTaskReportedAfterTheOutcomeOrAfterEveryWaiterLeftIsCancelled() {
        var completed = Machine()
        _ = completed.complete(ok)
        let cancelCompleted = completed.firstTaskStarted(task())
        #expect(cancelCompleted)
        #expect(completed.running.task == nil, "a completed call keeps no task")
        var abandoned = Machine()
        let departure = abandoned.leave(abandoned.firstTicket)
        #expect(departure.taskToCancel == nil, "no handle yet")
        let cancelAbandoned = abandoned.firstTaskStarted(task())
        #expect(cancelAbandoned)
    }

    @Test func aFirstTaskReportedBeforeAnythingElseIsRecorded() {
        var machine = Machine()
        let first = task()
        let cancel = machine.firstTaskStarted(first)
        #expect(!cancel)
        machine.open(attempt: 0, permit: nil)
        let handOff = machine.timeOut(attempt: 0)
        #expect(handOff?.superseded == first)
    }

    @Test func aTimeoutOfAnotherAttemptOrAfterCompletionDoesNothing() {
        var machine = Machine()
        machine.open(attempt: 2, permit: nil)
        let otherAttempt = machine.timeOut(attempt: 1)
        #expect(otherAttempt == nil)
        _ = machine.complete(ok)
        let afterCompletion = machine.timeOut(attempt: 2)
        #expect(afterCompletion == nil)
        let claimed = machine.claim(attempt: 2)
        #expect(!claimed)
    }
}
