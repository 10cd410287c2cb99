import Foundation
import Testing
import ResilienceTesting
@testable import Retry

@Suite("TimeSource: a type-erased clock")
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

    @Test func continuousClockSleepEndsWithCancellationError() async {
        let time = TimeSource(ContinuousClock())
        let sleeper = Task { try await time.sleep(.seconds(3600)) }
        sleeper.cancel()
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
