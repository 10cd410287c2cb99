import Testing

@testable import Drainer

@Suite("DrainServiceStateMachine: the drain service's lifecycle, transition by transition")
struct DrainServiceStateMachineTests {
    typealias Machine = DrainServiceStateMachine

    private func running(_ step: Machine.Step = .subscribing, loop: UInt64 = 1, reconnect: Bool = false) -> Machine.Phase {
        .running(Machine.Running(loop: loop, step: step, reconnectPending: reconnect))
    }

    /// A machine whose first loop has reached `step`.
    private func machine(at step: Machine.Step) -> Machine {
        var machine = Machine()
        let r1 = machine.start(stopsBefore: 0)
        #expect(r1)
        guard step != .subscribing else { return machine }
        #expect(machine.subscribed())
        let r2 = machine.cycleWanted()
        #expect(r2)
        guard step != .waitingForTurn else { return machine }
        let r3 = machine.turnGranted()
        #expect(r3)
        guard step != .cycling else { return machine }
        let r4 = machine.cycleEnded(loopCancelled: false)
        #expect(r4 == .sleep)
        return machine
    }

    @Test func startRunsTheFirstLoopOnceAndIgnoresRepeats() {
        var machine = Machine()
        #expect(machine.phase == .idle && !machine.isRunning)
        let r5 = machine.start(stopsBefore: 0)
        #expect(r5)
        #expect(machine.phase == running())
        #expect(machine.isRunning)
        let r6 = machine.start(stopsBefore: 0)
        #expect(!r6, "already running")
        #expect(machine.loopsStarted == 1)
    }

    @Test func aLoopWalksSubscribingWaitingCyclingSleepingAndBack() {
        var machine = machine(at: .subscribing)
        #expect(machine.subscribed())
        let r7 = machine.cycleWanted()
        #expect(r7)
        #expect(machine.phase == running(.waitingForTurn))
        let r8 = machine.turnGranted()
        #expect(r8)
        #expect(machine.phase == running(.cycling))
        let r9 = machine.cycleEnded(loopCancelled: false)
        #expect(r9 == .sleep)
        #expect(machine.phase == running(.sleeping))
        #expect(machine.sleepEnded(elapsed: true, loopCancelled: false) == .elapsed)
        let r10 = machine.cycleWanted()
        #expect(r10)
        #expect(machine.phase == running(.waitingForTurn))
    }

    @Test func stopWhileIdleDoesNothingButCountsTheStop() {
        var machine = Machine()
        let r11 = machine.stop(interruptingCycle: false)
        #expect(r11 == Machine.StopAction())
        #expect(machine.phase == .idle)
        #expect(machine.stopsRequested == 1)
    }

    @Test func stopWhileSubscribingOrSleepingEndsListenerAndSleepAndAwaitsTheLoop() {
        for step in [Machine.Step.subscribing, .sleeping, .cycling] {
            var machine = machine(at: step)
            let action = machine.stop(interruptingCycle: false)
            #expect(action == Machine.StopAction(endListenerAndSleep: true, cancelLoop: false, awaitLoop: true), "\(step)")
            #expect(machine.phase == .stopping(loop: 1))
            #expect(!machine.isRunning)
        }
    }

    @Test func stopWhileTheLoopWaitsForItsTurnCancelsIt() {
        var machine = machine(at: .waitingForTurn)
        let r12 = machine.stop(interruptingCycle: false)
        #expect(r12.cancelLoop)
        // Handed the turn anyway: it gives it back unused.
        let r13 = machine.turnGranted()
        #expect(!r13)
    }

    @Test func stopInterruptingCancelsTheCycleAndASecondStopMayInterruptTheFirstsCycle() {
        var machine = machine(at: .cycling)
        let r14 = machine.stop(interruptingCycle: true)
        #expect(r14.cancelLoop)
        var other = self.machine(at: .cycling)
        let r15 = other.stop(interruptingCycle: false)
        #expect(!r15.cancelLoop)
        let r16 = other.stop(interruptingCycle: true)
        #expect(r16 == Machine.StopAction(endListenerAndSleep: false, cancelLoop: true, awaitLoop: true))
        #expect(other.stopsRequested == 2)
    }

    @Test func theLoopEndsAtEveryStepOnceStopped() {
        var subscribing = machine(at: .subscribing)
        _ = subscribing.stop(interruptingCycle: false)
        #expect(!subscribing.subscribed())
        var cycling = machine(at: .cycling)
        _ = cycling.stop(interruptingCycle: false)
        let r17 = cycling.cycleEnded(loopCancelled: false)
        #expect(r17 == .exit)
        let r18 = cycling.cycleWanted()
        #expect(!r18)
        var sleeping = machine(at: .sleeping)
        _ = sleeping.stop(interruptingCycle: false)
        #expect(sleeping.sleepEnded(elapsed: true, loopCancelled: false) == .stopped)
    }

    @Test func aCancelledLoopTaskEndsEvenWhileRunning() {
        let machine = self.machine(at: .sleeping)
        #expect(machine.sleepEnded(elapsed: false, loopCancelled: true) == .stopped)
        var cycling = self.machine(at: .cycling)
        let r19 = cycling.cycleEnded(loopCancelled: true)
        #expect(r19 == .exit)
    }

    @Test func theLoopsEndReturnsToIdleOnlyForTheLoopBeingStopped() {
        var machine = machine(at: .cycling)
        _ = machine.stop(interruptingCycle: false)
        machine.loopEnded(7)
        #expect(machine.phase == .stopping(loop: 1), "another loop's end changes nothing")
        machine.loopEnded(1)
        #expect(machine.phase == .idle)
        machine.loopEnded(1)
        #expect(machine.phase == .idle)
    }

    @Test func aStartThatWaitedForAStopIsRefusedIfAnotherStopCameMeanwhile() {
        var machine = machine(at: .cycling)
        _ = machine.stop(interruptingCycle: false)
        let stopsBefore = machine.stopsRequested
        let r20 = machine.start(stopsBefore: stopsBefore)
        #expect(!r20, "the loop has not ended yet")
        _ = machine.stop(interruptingCycle: false)
        machine.loopEnded(1)
        let r21 = machine.start(stopsBefore: stopsBefore)
        #expect(!r21, "a stop came after this start began")
        let r22 = machine.start(stopsBefore: machine.stopsRequested)
        #expect(r22)
        #expect(machine.phase == running(loop: 2))
    }

    @Test func connectivityReturningWhileSleepingWakesTheLoopForAReconnectCycle() {
        var machine = machine(at: .sleeping)
        let r23 = machine.connectivityReturned()
        #expect(r23)
        #expect(machine.reconnectPending)
        #expect(machine.sleepEnded(elapsed: false, loopCancelled: false) == .reconnect)
        let r24 = machine.cycleWanted()
        #expect(r24)
        #expect(!machine.reconnectPending, "the reconnect cycle is the next one")
    }

    @Test func connectivityReturningDuringACycleRunsAnotherAtOnce() {
        var machine = machine(at: .cycling)
        let r25 = machine.connectivityReturned()
        #expect(r25)
        let r26 = machine.cycleEnded(loopCancelled: false)
        #expect(r26 == .runForReconnect)
        #expect(machine.phase == running(.cycling, reconnect: true))
    }

    @Test func connectivityReturningWhileIdleOrStoppingIsIgnored() {
        var idle = Machine()
        let r27 = idle.connectivityReturned()
        #expect(!r27)
        var stopping = machine(at: .sleeping)
        _ = stopping.stop(interruptingCycle: false)
        let r28 = stopping.connectivityReturned()
        #expect(!r28)
        #expect(!stopping.reconnectPending)
    }

    @Test func aSleepCutShortWithoutAReconnectIsAStop() {
        let machine = machine(at: .sleeping)
        #expect(machine.sleepEnded(elapsed: false, loopCancelled: false) == .stopped)
    }
}
