import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting
import Retry
import Testing

@Suite("ManualClock", .timeLimit(.minutes(1)))
struct ManualClockTests {
    final class Order: Sendable {
        private let names = Locked<[String]>([])
        func append(_ name: String) { names.withLock { $0.append(name) } }
        var all: [String] { names.withLock { $0 } }
    }

    @Test func timeMovesOnlyWhenAdvanced() {
        let clock = ManualClock()
        let start = clock.now
        #expect(clock.now == start)
        clock.advance(by: .seconds(5))
        #expect(start.duration(to: clock.now) == .seconds(5))
        clock.advance(to: start)  // never backwards
        #expect(start.duration(to: clock.now) == .seconds(5))
    }

    @Test func aSleeperWakesOnlyWhenItsDeadlineIsReached() async throws {
        let clock = ManualClock()
        let woke = Order()
        let task = Task {
            try await clock.sleep(for: .seconds(10))
            woke.append("sleeper")
        }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(9))
        #expect(clock.sleeperCount == 1)
        #expect(woke.all.isEmpty)
        clock.advance(by: .seconds(1))
        try await task.value
        #expect(woke.all == ["sleeper"])
        #expect(clock.sleeperCount == 0)
    }

    @Test func sleepersWakeInDeadlineOrder() async throws {
        let clock = ManualClock()
        let woke = Order()
        let tasks = [("c", 3), ("a", 1), ("b", 2)].map { name, seconds in
            Task {
                try await clock.sleep(for: .seconds(seconds))
                woke.append(name)
            }
        }
        await clock.waitForSleepers(3)
        #expect(clock.nextDeadline == .init(offset: .seconds(1)))
        // Step deadline by deadline: each advance wakes exactly the sleeper that became due.
        for (expected, index) in [("a", 1), ("b", 2), ("c", 0)] {
            #expect(clock.advanceToNextDeadline())
            try await tasks[index].value
            #expect(woke.all.last == expected)
        }
        #expect(woke.all == ["a", "b", "c"])
        #expect(!clock.advanceToNextDeadline())
    }

    @Test func oneLargeAdvanceWakesEveryDueSleeperButNotLaterOnes() async throws {
        let clock = ManualClock()
        let early = (1...5).map { seconds in Task { try await clock.sleep(for: .seconds(seconds)) } }
        let late = Task { try await clock.sleep(for: .seconds(100)) }
        await clock.waitForSleepers(6)
        clock.advance(by: .seconds(5))
        for task in early { try await task.value }
        #expect(clock.sleeperCount == 1)
        late.cancel()
        await #expect(throws: CancellationError.self) { try await late.value }
    }

    @Test func cancellationWakesASleeperWithCancellationError() async {
        let clock = ManualClock()
        let task = Task { try await clock.sleep(for: .seconds(60)) }
        await clock.waitForSleepers(1)
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(clock.sleeperCount == 0)
        #expect(clock.now == .init(offset: .zero))
    }

    @Test func sleepingInACancelledTaskThrowsAtOnce() async {
        let clock = ManualClock()
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await clock.sleep(for: .seconds(1))
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(clock.sleeperCount == 0)
    }

    @Test func aDeadlineNotInTheFutureReturnsAtOnce() async throws {
        let clock = ManualClock()
        try await clock.sleep(for: .zero)
        try await clock.sleep(until: clock.now.advanced(by: .seconds(-1)), tolerance: nil)
        #expect(clock.sleeperCount == 0)
    }
}
