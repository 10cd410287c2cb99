import ResilienceTestSupport
import ResilienceTesting
import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

/// A latch a test opens by hand, and that tells when someone waits on it.
private final class Latch: Sendable {
    private struct State: Sendable {
        var open = false
        var arrived = 0
        var waiting: [CheckedContinuation<Void, Never>] = []
        var arrivalWatchers: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Locked(State())

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let (resumeNow, watchers) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
                state.arrived += 1
                let arrived = state.arrived
                let due = state.arrivalWatchers.filter { $0.count <= arrived }.map(\.continuation)
                state.arrivalWatchers.removeAll { $0.count <= arrived }
                if state.open { return (true, due) }
                state.waiting.append(continuation)
                return (false, due)
            }
            for watcher in watchers { watcher.resume() }
            if resumeNow { continuation.resume() }
        }
    }

    func waitForArrivals(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.arrived >= count { return true }
                state.arrivalWatchers.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    func open() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}

@Suite("AdmissionGate: places, arrival order, cancellation, no lost wakeup", .timeLimit(.minutes(1)))
struct AdmissionGateTests {
    @Test func aLeaveBetweenDecidingToWaitAndWaitingHandsThePlaceOverInsteadOfLosingIt() async throws {
        let latch = Latch()
        let gate = AdmissionGate(limit: 1, beforeWaiting: { await latch.wait() })
        try await gate.enter()  // the only place is taken
        let second = Task { try await gate.enter() }
        await latch.waitForArrivals(1)  // it decided to wait and stands just before its line
        gate.leave()  // the place comes back in that window
        latch.open()
        try await second.value  // before the fix: waits forever, with the place free
        #expect(gate.waiterCount == 0)
        gate.leave()
        try await gate.enter()  // and the place is free again afterwards
        gate.leave()
    }

    @Test func aNewcomerNeverOvertakesACallerStillOnItsWayToTheLine() async throws {
        let latch = Latch()
        let order = Locked<[String]>([])
        let gate = AdmissionGate(limit: 1, beforeWaiting: { await latch.wait() })
        try await gate.enter()
        let early = Task {
            try await gate.enter()
            order.withLock { $0.append("early") }
            gate.leave()
        }
        await latch.waitForArrivals(1)
        gate.leave()  // handed to `early`, which has not reached the line yet
        let late = Task {
            try await gate.enter()
            order.withLock { $0.append("late") }
            gate.leave()
        }
        await latch.waitForArrivals(2)
        latch.open()
        try await early.value
        try await late.value
        #expect(order.withLock { $0 } == ["early", "late"])
    }

    @Test func aCallerCancelledOnItsWayToTheLineNeverTakesAPlace() async throws {
        let latch = Latch()
        let gate = AdmissionGate(limit: 1, beforeWaiting: { await latch.wait() })
        try await gate.enter()
        let cancelled = Task { try await gate.enter() }
        await latch.waitForArrivals(1)
        cancelled.cancel()
        latch.open()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        gate.leave()
        try await gate.enter()  // the place was not given to the cancelled caller
        gate.leave()
        #expect(gate.waiterCount == 0)
    }

    @Test func tenThousandWaitersAreServedInArrivalOrderAndCancelledOnesLeave() async throws {
        let gate = AdmissionGate(limit: 1)
        try await gate.enter()
        let served = Locked<[Int]>([])
        var tasks: [Task<Void, any Error>] = []
        for index in 0..<10_000 {
            tasks.append(
                Task {
                    try await gate.enter()
                    served.withLock { $0.append(index) }
                    gate.leave()
                })
            while gate.waiterCount < index + 1 { await Task.yield() }  // each in line before the next
        }
        for index in stride(from: 1, to: 10_000, by: 2) { tasks[index].cancel() }
        gate.leave()
        var cancelled = 0
        for task in tasks {
            do { try await task.value } catch { cancelled += 1 }
        }
        #expect(cancelled == 5_000)
        #expect(served.withLock { $0 } == Array(stride(from: 0, to: 10_000, by: 2)))
        #expect(gate.waiterCount == 0)
        try await gate.enter()
        gate.leave()
    }
}

@Suite("AdmissionGate: a wait bounded by a timeout", .timeLimit(.minutes(1)))
struct AdmissionGateTimeoutTests {
    @Test func aWaiterWhoseTimeoutPassesLeavesWithNoPlaceAndTheNextIsAdmitted() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        defer { timer.shutdown() }
        let gate = AdmissionGate(limit: 1)
        try await gate.enter()  // the one place
        let late = Task { await thrownError { try await gate.enter(timeout: .seconds(5), on: timer) } }
        let patient = Task { try await gate.enter() }
        await clock.waitForSleepers(1)
        await yieldUntil { gate.waiterCount >= 2 }
        clock.advance(by: .seconds(5))
        #expect(await late.value is AdmissionGate.TimedOut)
        #expect(gate.waiterCount == 1)
        gate.leave()  // to the patient one: the timed-out waiter holds no place and is skipped
        try await patient.value
        gate.leave()
        try await gate.enter()  // free again: nothing leaked
        gate.leave()
        #expect(timer.pendingCount == 0)
    }

    @Test func aWaiterAdmittedBeforeItsTimeoutKeepsItsPlace() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        defer { timer.shutdown() }
        let gate = AdmissionGate(limit: 1)
        try await gate.enter()
        let waiter = Task { try await gate.enter(timeout: .seconds(5), on: timer) }
        await clock.waitForSleepers(1)
        await yieldUntil { gate.waiterCount >= 1 }
        gate.leave()
        try await waiter.value  // admitted
        #expect(timer.pendingCount == 0)  // its timeout is forgotten
        clock.advance(by: .seconds(5))
        let other = Task { await thrownError { try await gate.enter(timeout: .seconds(1), on: timer) } }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        #expect(await other.value is AdmissionGate.TimedOut)  // the place is still the waiter's
        gate.leave()
    }

    /// The timeout passes after the caller joined the line but before it suspended: it is handed
    /// `TimedOut` on its way, leaves with no place, and a later `leave()` frees the place.
    @Test func aTimeoutOnTheWayToTheLineEndsTheWaitWithNoPlace() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        defer { timer.shutdown() }
        let gateBox = Locked<AdmissionGate?>(nil)
        let gate = AdmissionGate(
            limit: 1,
            beforeWaiting: {
                await clock.waitForSleepers(1)  // the timeout's sleeper
                clock.advance(by: .seconds(5))
                await yieldUntil { gateBox.withLock { $0 }?.waiterCount == 0 }  // handed TimedOut
            })
        gateBox.withLock { $0 = gate }
        try await gate.enter()
        #expect(await thrownError { try await gate.enter(timeout: .seconds(5), on: timer) } is AdmissionGate.TimedOut)
        gate.leave()
        try await gate.enter()  // the place was freed, not handed to the timed-out caller
        gate.leave()
    }

    /// The place is handed over after the caller joined the line but before it suspended, and
    /// its timeout passes right after: the hand-over wins, the caller is admitted.
    @Test func aPlaceHandedOnTheWayToTheLineWinsOverATimeoutThatFollows() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        defer { timer.shutdown() }
        let gateBox = Locked<AdmissionGate?>(nil)
        let gate = AdmissionGate(
            limit: 1,
            beforeWaiting: {
                guard
                    let gate = gateBox.withLock({ box in
                        defer { box = nil }; return box
                    })
                else { return }  // the first caller only
                await clock.waitForSleepers(1)
                gate.leave()  // the holder leaves: the place goes to this caller
                clock.advance(by: .seconds(5))  // and then its timeout passes
                await yieldUntil { timer.pendingCount == 0 }
            })
        gateBox.withLock { $0 = gate }
        try await gate.enter()
        try await gate.enter(timeout: .seconds(5), on: timer)  // admitted
        // The place is still held: a caller that will not wait at all times out at once.
        #expect(await thrownError { try await gate.enter(timeout: .zero, on: timer) } is AdmissionGate.TimedOut)
        gate.leave()
    }

    @Test func aWaiterCancelledBeforeItsTimeoutThrowsCancellation() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        defer { timer.shutdown() }
        let gate = AdmissionGate(limit: 1)
        try await gate.enter()
        let waiter = Task { await thrownError { try await gate.enter(timeout: .seconds(5), on: timer) } }
        await yieldUntil { gate.waiterCount >= 1 }
        waiter.cancel()
        #expect(await waiter.value is CancellationError)
        #expect(gate.waiterCount == 0 && timer.pendingCount == 0)
        gate.leave()
        try await gate.enter()
        gate.leave()
    }
}
