import Foundation
import ResilienceTesting
import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

@Suite("TimeSource: a type-erased clock", .timeLimit(.minutes(1)))
struct TimeSourceTests {
    @Test func continuousClockReadsElapsedTimeFromCreationAndNeverGoesBack() {
        let time = TimeSource(ContinuousClock())
        let first = time.now()
        #expect(first >= .zero && first < .seconds(1))
        var previous = first
        for _ in 0..<1_000 {
            let next = time.now()
            #expect(next >= previous)
            previous = next
        }
    }

    @Test func continuousClockReadsTheSameTimeAsContinuousClock() {
        // On Linux the source reads CLOCK_BOOTTIME itself; it must be ContinuousClock's time:
        // an interval it brackets is at least as long as the one ContinuousClock measured inside.
        let time = TimeSource(ContinuousClock())
        for _ in 0..<100 {
            let outerStart = time.now()
            let innerStart = ContinuousClock.now
            var spins = 0
            for value in 0..<10_000 { spins &+= value }
            let innerEnd = ContinuousClock.now
            let outerEnd = time.now()
            #expect(outerEnd - outerStart >= innerStart.duration(to: innerEnd), "\(spins)")
        }
    }

    @Test func continuousClockSleepNeverWaitsWhenDueOrCancelled() async throws {
        // Nothing here waits on the wall clock: a sleep that is already due returns at once, and a
        // sleep in a task cancelled before it starts throws at once.
        let time = TimeSource(ContinuousClock())
        try await time.sleep(.zero)
        try await time.sleep(.seconds(-1))
        let sleeper = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await time.sleep(.seconds(3600))
        }
        await #expect(throws: CancellationError.self) { try await sleeper.value }
    }

    @Test func anInjectedClockIsReadAndSleptOnAsIs() async throws {
        let clock = ManualClock()
        let time = TimeSource(clock)
        #expect(time.now() == .zero)
        clock.advance(by: .seconds(5))
        #expect(time.now() == .seconds(5))
        let sleeper = Task { try await time.sleep(.seconds(10)) }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(10))
        try await sleeper.value
        #expect(time.now() == .seconds(15))
    }
}
