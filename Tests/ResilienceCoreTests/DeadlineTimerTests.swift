@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@Suite("DeadlineTimer: many deadlines, one sleeper", .timeLimit(.minutes(1)))
struct DeadlineTimerTests {
    @Test func deadlinesFireInOrderCancelledOnesNeverAndOneTaskSleepsForAll() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        let fired = Log<Int>()
        for index in 0..<100 { _ = timer.schedule(after: .seconds(30)) { fired.append(index) } }
        let cancelled = timer.schedule(after: .seconds(30)) { fired.append(-1) }
        timer.cancel(cancelled)
        await clock.waitForSleepers(1)
        #expect(clock.sleeperCount == 1 && timer.pendingCount == 100)  // one sleeper for a hundred deadlines
        let early = timer.schedule(after: .seconds(10)) { fired.append(1_000) }  // earlier: the sleeper is re-armed
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(10))
        while fired.count < 1 { await Task.yield() }
        #expect(fired.values == [1_000])
        timer.cancel(early)  // already ran: a no-op
        clock.advance(by: .seconds(20))
        while fired.count < 101 { await Task.yield() }
        #expect(fired.values == [1_000] + Array(0..<100))
        #expect(timer.pendingCount == 0)
    }

    @Test func cancellingEveryDeadlineLeavesNothingPendingAndShutdownStopsTheSleeper() async throws {
        let clock = ManualClock()
        let timer = DeadlineTimer(time: TimeSource(clock))
        let fired = Log<Int>()
        let tokens = (0..<1_000).map { index in timer.schedule(after: .seconds(30)) { fired.append(index) } }
        for token in tokens { timer.cancel(token) }
        #expect(timer.pendingCount == 0)
        await clock.waitForSleepers(1)
        timer.shutdown()
        while clock.sleeperCount > 0 { await Task.yield() }
        _ = timer.schedule(after: .zero) { fired.append(-1) }
        clock.advance(by: .seconds(60))
        #expect(fired.values.isEmpty && timer.pendingCount == 0)
    }
}
