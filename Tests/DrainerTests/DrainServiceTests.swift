import Foundation
import OfflineQueue
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import Drainer

@Suite("DrainService on a manual clock", .timeLimit(.minutes(1)))
struct DrainServiceTests {
    @Test func startRunsACycleAtOnceThenOneEveryInterval() async throws {
        let h = try await DrainHarness([.ok()], interval: .seconds(60))
        try await h.enqueue(3)
        await h.service.start()

        let first = try #require(await h.report(1))
        #expect(first.trigger == .start)
        #expect(first.delivered == 3)
        #expect(first.remaining == 0)
        #expect(!first.budgetExhausted && !first.interrupted && !first.isFailure)
        #expect(await h.sleeperDelay() == .seconds(60))

        try await h.enqueue(1)
        h.clock.advance(by: .seconds(59))
        #expect(h.reports.items.count == 1, "no cycle before the interval")
        h.clock.advance(by: .seconds(1))
        let second = try #require(await h.report(2))
        #expect(second.trigger == .interval)
        #expect(second.delivered == 1)
        #expect(abs(second.startedAt.timeIntervalSince(first.startedAt) - 60) < 0.001)
        #expect(await h.sleeperDelay() == .seconds(60))
        #expect(h.session.callCount == 4)
        await h.service.stop()
    }

    @Test func jitterStaysWithinItsBoundsAndSpreadsTheWaits() async throws {
        // The extremes of the random source give exactly 1 − jitter and 1 + jitter.
        for (unit, expected) in [(0.0, Duration.seconds(90)), (0.5, .seconds(100)), (0.999_999_999, .seconds(110))] {
            let h = try await DrainHarness([.ok()], interval: .seconds(100), jitter: 0.1, randomUnit: { unit })
            await h.service.start()
            _ = await h.report(1)
            let delay = try #require(await h.sleeperDelay())
            #expect(abs((delay - expected).seconds) < 0.001, "unit \(unit): \(delay)")
            await h.service.stop()
        }

        // With the system's random source, 40 waits in a row all lie in 90…110 s and differ.
        let h = try await DrainHarness([.ok()], interval: .seconds(100), jitter: 0.1)
        await h.service.start()
        var delays: [Double] = []
        for n in 1...40 {
            _ = await h.report(n)
            let delay = try #require(await h.sleeperDelay())
            delays.append(delay.seconds)
            h.clock.advanceToNextDeadline()
        }
        _ = await h.report(41)
        await h.service.stop()
        #expect(delays.allSatisfy { (90...110).contains($0) }, "\(delays)")
        #expect(Set(delays).count > 30, "jitter spreads the waits: \(delays)")
        #expect(h.reports.items.dropFirst().allSatisfy { $0.trigger == .interval })
    }

    @Test func outOfRangeSettingsAreClamped() async throws {
        let h = try await DrainHarness([.ok()])
        let wild = DrainService(queue: h.queue, interval: .seconds(-5), cycleBudget: .zero, jitter: .nan)
        #expect(wild.interval == .milliseconds(1))
        #expect(wild.cycleBudget == .milliseconds(1))
        #expect(wild.jitter == 0.1)
        #expect(DrainService(queue: h.queue, interval: .seconds(1), cycleBudget: .seconds(1), jitter: 7).jitter == 1)
        #expect(DrainService.Backoff(multiplier: 0.5).multiplier == 1)
        #expect(DrainService.Backoff(multiplier: .infinity).multiplier == 2)
    }

    @Test func reconnectRunsACycleAtOnceWithoutWaitingForTheInterval() async throws {
        let h = try await DrainHarness([.ok()], connected: false, interval: .seconds(3600))
        try await h.enqueue(2)
        await h.service.start()
        let offline = try #require(await h.report(1))
        #expect(offline.endedOffline && offline.isFailure)
        #expect(offline.delivered == 0 && offline.remaining == 2)
        #expect(h.session.callCount == 0, "nothing is sent while the monitor says offline")
        _ = await h.sleeperDelay()

        await h.monitor.setConnected(true)  // no clock movement at all
        let back = try #require(await h.report(2))
        #expect(back.trigger == .reconnect)
        #expect(back.delivered == 2 && back.remaining == 0)
        #expect(await h.service.consecutiveFailures == 0)
        #expect(await h.sleeperDelay() == .seconds(3600), "after a reconnect cycle the plain interval applies")
        await h.service.stop()
    }

    @Test func aReconnectDuringACycleRunsAnotherRightAfterIt() async throws {
        // The first send is held; meanwhile the link flaps down and up.
        let h = try await DrainHarness([.held(.ok()), .ok()], interval: .seconds(3600))
        try await h.enqueue(2)
        await h.service.start()
        await h.session.waitForCalls(1)
        await h.monitor.setConnected(false)
        await h.monitor.setConnected(true)
        await waitUntil { await h.service.reconnectIsPending }
        h.session.releaseHeld()
        let first = try #require(await h.report(1))
        #expect(first.trigger == .start)
        let second = try #require(await h.report(2))
        #expect(second.trigger == .reconnect)
        #expect(first.delivered + second.delivered == 2)
        await h.service.stop()
    }

    @Test func theBudgetCancelsACycleMidEntryAndTheEntryStaysQueuedWithItsKey() async throws {
        // The first send never answers; the budget ends the cycle; the next cycle sends it again.
        let h = try await DrainHarness([.hang, .ok()], interval: .seconds(60), cycleBudget: .seconds(5))
        let ids = try await h.enqueue(2)
        await h.service.start()
        await h.session.waitForCalls(1)
        await h.clock.waitForSleepers(1)  // the budget timer
        #expect(h.clock.sleeperCount == 1, "only the budget timer sleeps during the cycle")
        h.clock.advance(by: .seconds(5))

        let cut = try #require(await h.report(1))
        #expect(cut.budgetExhausted)
        #expect(!cut.interrupted && !cut.isFailure)
        #expect(cut.delivered == 0 && cut.keptForRetry == 0)
        #expect(cut.remaining == 2)
        #expect(abs(cut.duration - 5) < 0.001)
        let interrupted = try #require(await h.queue.items.first { $0.id == ids[0] })
        #expect(interrupted.attempts == 0, "a cancelled send is not a counted attempt")
        #expect(interrupted.nextAttemptAt == nil)

        #expect(await h.sleeperDelay() == .seconds(60), "a cycle cut by its budget is not a failure")
        h.clock.advance(by: .seconds(60))
        let next = try #require(await h.report(2))
        #expect(next.delivered == 2 && next.remaining == 0 && !next.budgetExhausted)
        let keys = h.sentKeys
        #expect(keys.count == 3)
        #expect(keys[0] != nil && keys[0] == keys[1], "the interrupted entry is resent with the same Idempotency-Key")
        await h.service.stop()
    }

    @Test func aCycleThatEndsByItselfAtTheBudgetIsNotMarkedExhausted() async throws {
        let h = try await DrainHarness([.ok()], cycleBudget: .seconds(5))
        try await h.enqueue(1)
        await h.service.start()
        let report = try #require(await h.report(1))
        #expect(!report.budgetExhausted && report.delivered == 1)
        await h.service.stop()
    }

    @Test func failedCyclesBackOffExponentiallyUpToTheMaximumAndASuccessResets() async throws {
        let h = try await DrainHarness(
            [.status(503), .status(503), .status(503), .status(503), .ok()],
            interval: .seconds(60),
            backoff: .init(multiplier: 2, maximum: .seconds(400))
        )
        try await h.enqueue(1)
        await h.service.start()
        var waits: [Duration] = []
        for n in 1...5 {
            let report = try #require(await h.report(n))
            #expect(report.isFailure == (n < 5), "cycle \(n)")
            waits.append(try #require(await h.sleeperDelay()))
            if n < 5 { h.clock.advanceToNextDeadline() }
        }
        #expect(waits == [.seconds(120), .seconds(240), .seconds(400), .seconds(400), .seconds(60)])
        #expect(h.reports.items.dropFirst().allSatisfy { $0.trigger == .retry })
        #expect(h.reports.items[0].keptForRetry == 1)
        #expect(await h.service.consecutiveFailures == 0)
        await h.service.stop()
    }

    @Test func stopWaitsForTheCycleInFlightToEnd() async throws {
        let h = try await DrainHarness([.held(.ok())])
        try await h.enqueue(1)
        await h.service.start()
        await h.session.waitForCalls(1)
        let stopping = Task { await h.service.stop() }
        // stop() has begun: the loop is winding down, its cycle still held.
        await waitUntil { await h.service.phase == .stopping(loop: 1) }
        h.session.releaseHeld()
        await stopping.value
        // stop() ends the report streams that existed when it was called once it returns, so a
        // stop() that returned before the cycle ended would have ended `h.reports` without the
        // cycle's report (a report yielded into a finished stream is dropped): this holds only if
        // stop() waited.
        await h.reports.wait(for: .max)
        #expect(h.reports.items.map(\.delivered) == [1])
        let last = try #require(await h.service.lastReport)
        #expect(last.delivered == 1 && !last.interrupted)
        #expect(await h.service.phase == .idle)
        #expect(await h.queue.pendingCount() == 0)
        #expect(h.clock.sleeperCount == 0, "no timer is left behind")
        h.clock.advance(by: .seconds(3600))
        #expect(await h.service.cyclesRun == 1, "no cycle after stop()")
    }

    @Test func stopInterruptingCancelsTheCycleAndKeepsTheEntry() async throws {
        let h = try await DrainHarness([.hang])
        let ids = try await h.enqueue(1)
        await h.service.start()
        await h.session.waitForCalls(1)
        await h.service.stop(.interruptingCycle)
        let last = try #require(await h.service.lastReport)
        #expect(last.interrupted && !last.budgetExhausted)
        #expect(last.remaining == 1)
        #expect(await h.queue.items.map(\.id) == ids)
        #expect(await h.queue.items.first?.attempts == 0)
        #expect(h.clock.sleeperCount == 0)
    }

    @Test func aSecondStopMayInterruptTheCycleTheFirstStopWaitsFor() async throws {
        let h = try await DrainHarness([.hang])
        try await h.enqueue(1)
        await h.service.start()
        await h.session.waitForCalls(1)
        let patient = Task { await h.service.stop() }
        await waitUntil { await !h.service.isRunning }
        await h.service.stop(.interruptingCycle)
        await patient.value
        let last = try #require(await h.service.lastReport)
        #expect(last.interrupted)
        #expect(await h.queue.pendingCount() == 1)
        #expect(h.clock.sleeperCount == 0)
    }

    @Test func startAfterStopWorksAndStartTwiceRunsOneLoop() async throws {
        let h = try await DrainHarness([.ok()], interval: .seconds(60))
        await h.service.start()
        await h.service.start()
        _ = await h.report(1)
        #expect(await h.sleeperDelay() == .seconds(60))
        #expect(h.clock.sleeperCount == 1, "one loop, one timer")
        await h.service.stop()
        #expect(await !h.service.isRunning)
        #expect(h.clock.sleeperCount == 0)
        await h.reports.wait(for: 2)  // returns at once: stop() ended the stream
        #expect(h.reports.items.count == 1)

        try await h.enqueue(2)
        let again = StreamCollector(await h.service.reports)  // a new stream for the new run
        await h.service.start()
        await again.wait(for: 1)
        let restarted = try #require(again.items.first)
        #expect(restarted.trigger == .start && restarted.delivered == 2)
        #expect(await h.service.isRunning)
        #expect(await h.sleeperDelay() == .seconds(60))
        h.clock.advance(by: .seconds(60))
        await again.wait(for: 2)
        #expect(again.items.last?.trigger == .interval)
        await h.service.stop()
        await h.service.stop()  // stopping twice is harmless
        #expect(await h.service.cyclesRun == 3)
    }

    @Test func concurrentStartsAndStopsNeverLeaveALoopBehindAStop() async throws {
        let h = try await DrainHarness([.ok()], interval: .seconds(60))
        for _ in 0..<50 {
            async let started: Void = h.service.start()
            async let stopped: Void = h.service.stop()
            _ = await (started, stopped)
            // Either order is fine, but if stop() came last, nothing may still run.
            if await !h.service.isRunning {
                #expect(h.clock.sleeperCount == 0)
                let cycles = await h.service.cyclesRun
                h.clock.advance(by: .seconds(600))
                #expect(await h.service.cyclesRun == cycles, "no cycle after stop() returned")
            }
            await h.service.stop()
        }
    }

    @Test func stopDropsALoopCycleWaitingBehindDrainNowAtOnce() async throws {
        // A budget longer than the interval: advancing to the loop's wake-up leaves drainNow's cycle running.
        let h = try await DrainHarness([.held(.ok()), .ok()], interval: .seconds(60), cycleBudget: .seconds(120))
        await h.service.start()
        _ = await h.report(1)
        _ = await h.sleeperDelay()
        try await h.enqueue(1)
        let manual = Task { await h.service.drainNow() }
        await h.session.waitForCalls(1)  // drainNow's cycle is in flight, held
        h.clock.advance(by: .seconds(60))  // the loop wakes and queues behind it
        await waitUntil { await h.service.cycleWaiterCount == 1 }
        // stop() drops the loop's waiting cycle and returns without waiting for drainNow's.
        await h.service.stop()
        #expect(await !h.service.isRunning)
        h.session.releaseHeld()
        #expect(await manual.value.delivered == 1)
        #expect(await h.service.cyclesRun == 2, "start's cycle and drainNow's; the loop's was skipped")
        #expect(h.session.callCount == 1)
    }

    @Test func aCancelledDrainNowLeavesTheLineAtOnce() async throws {
        let h = try await DrainHarness([.hang], interval: .seconds(60), cycleBudget: .seconds(30))
        try await h.enqueue(1)
        await h.service.start()
        await h.session.waitForCalls(1)  // the loop's cycle hangs in its send
        let manual = Task { await h.service.drainNow() }
        await waitUntil { await h.service.cycleWaiterCount == 1 }
        manual.cancel()
        let report = await manual.value  // would wait up to the 30 s budget if the wait ignored cancellation
        #expect(report.interrupted && report.trigger == .manual)
        #expect(report.delivered == 0 && report.remaining == 1)
        #expect(h.session.callCount == 1)
        await h.service.stop(.interruptingCycle)
    }

    @Test func jitterAlsoAppliesToBackoffWaits() async throws {
        let h = try await DrainHarness([.status(503)], interval: .seconds(100), jitter: 0.1, randomUnit: { 0 })
        try await h.enqueue(1)
        await h.service.start()
        _ = await h.report(1)
        let delay = try #require(await h.sleeperDelay())
        #expect(abs((delay - .seconds(180)).seconds) < 0.001, "200 s backoff × 0.9: \(delay)")
        await h.service.stop()
    }

    @Test func aCycleWaitsForTheQueuesOwnPassAndNeverSendsAnEntryTwice() async throws {
        let h = try await DrainHarness([.held(.ok())], interval: .seconds(60), cycleBudget: .seconds(30))
        try await h.enqueue(1)
        let flush = await h.startBehindAHeldFlush()
        h.session.releaseHeld()
        let flushed = await flush.value
        #expect(flushed.delivered.count == 1)
        let cycle = try #require(await h.report(1))
        #expect(cycle.delivered == 0 && cycle.remaining == 0)
        #expect(h.session.callCount == 1, "the entry was sent once")
        await h.service.stop()
    }

    @Test func theBudgetAlsoRunsOutWhileWaitingForTheQueuesPass() async throws {
        let h = try await DrainHarness([.held(.ok())], interval: .seconds(60), cycleBudget: .seconds(5))
        try await h.enqueue(1)
        let flush = await h.startBehindAHeldFlush()
        h.clock.advance(by: .seconds(5))
        let cycle = try #require(await h.report(1))
        #expect(cycle.budgetExhausted && cycle.delivered == 0)
        #expect(h.session.callCount == 1)
        h.session.releaseHeld()
        #expect(await flush.value.delivered.count == 1)
        await h.service.stop()
    }

    @Test func drainNowRunsOneBoundedCycleWithoutStarting() async throws {
        let h = try await DrainHarness([.ok()])
        try await h.enqueue(2)
        let report = await h.service.drainNow()
        #expect(report.trigger == .manual && report.delivered == 2)
        #expect(await !h.service.isRunning)
        #expect(h.clock.sleeperCount == 0)
    }

    @Test func expiredEntriesAreReportedAndNeverSent() async throws {
        let h = try await DrainHarness([.ok()], connected: true, interval: .seconds(60))
        var shortLived = QueuedRequest(method: .post, url: URL(string: "https://api.example.test/short")!, body: nil)
        shortLived.ttl = 30
        _ = try await h.queue.enqueue(shortLived, sending: .onNextDrain)
        h.clock.advance(by: .seconds(31))
        await h.service.start()
        let report = try #require(await h.report(1))
        #expect(report.expired == 1 && report.delivered == 0 && report.remaining == 0)
        #expect(h.session.callCount == 0)
        await h.service.stop()
    }
}

/// Polls `condition` between yields, for state a test cannot be told about directly.
func waitUntil(_ condition: @Sendable () async -> Bool) async {
    while await !condition() {
        if Task.isCancelled { return }
        await Task.yield()
    }
}
