import Foundation
import Testing

@testable import OfflineQueue

/// `QueueEngineLifecycle`, transition by transition: the table in its documentation.
@Suite("QueueEngineLifecycle: an engine's start, timer, stop and close as one value")
struct QueueEngineLifecycleTests {
    typealias Lifecycle = QueueEngineLifecycle
    static let t0 = Date(timeIntervalSince1970: 1_000_000)

    /// A task that does nothing, to stand for the engine's own.
    static func task() -> Task<Void, Never> { Task {} }

    static func started() -> (Lifecycle, loop: Task<Void, Never>, arrivals: Task<Void, Never>) {
        var life = Lifecycle()
        let loop = task(), arrivals = task()
        let didStart = life.start { (loop, arrivals) }
        #expect(didStart)
        return (life, loop, arrivals)
    }

    @Test func startingMakesTheTasksOnceAndNotAfterClose() {
        var life = Lifecycle()
        #expect(!life.isStarted && !life.isClosed && life.tasks.isEmpty)
        var made = 0
        let first = life.start {
            made += 1; return (Self.task(), nil)
        }
        #expect(first)
        #expect(life.isStarted && life.timerDeadline == nil)
        let again = life.start {
            made += 1; return (Self.task(), nil)
        }
        #expect(!again)  // started already
        #expect(made == 1)
        _ = life.close()
        let afterClose = life.start {
            made += 1; return (Self.task(), nil)
        }
        #expect(!afterClose)  // closed for good
        #expect(made == 1 && life.isClosed && !life.isStarted)
    }

    @Test func aTimerIsArmedOnlyWhileStartedAndOnlyForAnEarlierDate() {
        var stopped = Lifecycle()
        var made: [UInt64] = []
        let whileStopped = stopped.arm(at: Self.t0) {
            made.append($0); return Self.task()
        }
        #expect(whileStopped == nil)
        #expect(made.isEmpty && stopped.timerDeadline == nil)

        var (life, _, _) = Self.started()
        let firstArmed = life.arm(at: Self.t0 + 60) {
            made.append($0); return Self.task()
        }
        #expect(firstArmed == nil)  // nothing to replace
        #expect(life.timerDeadline == Self.t0 + 60)
        let later = life.arm(at: Self.t0 + 90) {
            made.append($0); return Self.task()
        }
        #expect(later == nil)  // later: kept
        let same = life.arm(at: Self.t0 + 60) {
            made.append($0); return Self.task()
        }
        #expect(same == nil)  // the same: kept
        let replaced = life.arm(at: Self.t0 + 30) {
            made.append($0); return Self.task()
        }
        #expect(replaced != nil && life.timerDeadline == Self.t0 + 30)
        #expect(made == [1, 2])
    }

    @Test func onlyTheArmedTimerFiresAndItsPassIsOwnedUntilItEnds() {
        var (life, _, _) = Self.started()
        _ = life.arm(at: Self.t0 + 60) { _ in Self.task() }
        _ = life.arm(at: Self.t0 + 30) { _ in Self.task() }  // number 2 replaces number 1
        let replacedFired = life.timerFired(1)
        #expect(!replacedFired)  // replaced after its sleep ended: no pass
        let armedFired = life.timerFired(2)
        #expect(armedFired)
        #expect(life.timerDeadline == nil)  // idle: the pass may arm the next
        let firedTwice = life.timerFired(2)
        #expect(!firedTwice)  // fires once
        _ = life.arm(at: Self.t0 + 90) { _ in Self.task() }
        #expect(life.tasks.count == 4)  // arrivals, loop, the armed timer, the firing one
        life.firingEnded(2)
        #expect(life.tasks.count == 3)
    }

    @Test func offlineDisarmsAndATimerThatSleptThroughItRunsNoPass() {
        var (life, _, _) = Self.started()
        let nothingArmed = life.disarm()
        #expect(nothingArmed == nil)
        _ = life.arm(at: Self.t0 + 60) { _ in Self.task() }
        let disarmed = life.disarm()
        #expect(disarmed != nil && life.timerDeadline == nil)
        let sleptThrough = life.timerFired(1)
        #expect(!sleptThrough)
    }

    /// The `queue-stop-timer-pass` bug: a stopped queue's timer that ended its sleep must not run
    /// a pass; stopping hands over every task, to cancel and await in order.
    @Test func stoppingHandsOverEveryTaskAndAStoppedTimerRunsNoPass() {
        var (life, loop, arrivals) = Self.started()
        let timer = Self.task(), next = Self.task()
        _ = life.arm(at: Self.t0 + 60) { _ in timer }
        let fired = life.timerFired(1)
        #expect(fired)
        _ = life.arm(at: Self.t0 + 90) { _ in next }
        let tasks = life.stop()
        #expect(tasks == [arrivals, loop, next, timer])
        #expect(!life.isStarted && life.tasks.isEmpty)
        let afterStop = life.timerFired(2)
        #expect(!afterStop)
        let stoppedTwice = life.stop()
        #expect(stoppedTwice.isEmpty)  // twice is once
        let restarted = life.start { (Self.task(), nil) }
        #expect(restarted)  // and it may start again
        #expect(life.timerDeadline == nil)
    }

    @Test func closingStopsAndStaysClosed() {
        var (life, loop, arrivals) = Self.started()
        let closing = life.close()
        #expect(closing == [arrivals, loop])
        let closedTwice = life.close()
        let stoppedAfterClose = life.stop()
        #expect(life.isClosed && closedTwice.isEmpty && stoppedAfterClose.isEmpty)
        let armedAfterClose = life.arm(at: Self.t0) { _ in Self.task() }
        #expect(armedAfterClose == nil && life.timerDeadline == nil)
        var stopped = Lifecycle()
        let closedWhileStopped = stopped.close()
        #expect(closedWhileStopped.isEmpty && stopped.isClosed)
    }
}
