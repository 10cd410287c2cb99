@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("ConcurrencyLimiter", .timeLimit(.minutes(1)))
struct ConcurrencyLimiterTests {
    /// Starts a task that runs through `limiter` and holds its place until `gate` opens, logging
    /// `name` when it starts running.
    private func holder(
        _ limiter: ConcurrencyLimiter,
        _ name: String,
        log: Log<String>,
        gate: Gate
    ) -> Task<Void, any Error> {
        Task {
            try await limiter.withPermit {
                log.append(name)
                await gate.wait()
            }
        }
    }

    @Test func clampsHostileLimits() {
        let limiter = ConcurrencyLimiter(maxConcurrent: -3, maxWaiting: -1)
        #expect(limiter.maxConcurrent == 1)
        #expect(limiter.maxWaiting == 0)
        let zero = ConcurrencyLimiter(maxConcurrent: 0, maxWaiting: .max)
        #expect(zero.maxConcurrent == 1)
        #expect(zero.maxWaiting == .max)
    }

    @Test func runsAtOnceWhileAPlaceIsFreeAndReturnsTheValue() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 2, maxWaiting: 0)
        let value = try await limiter.withPermit {
            #expect(limiter.inFlight == 1)
            return 42
        }
        #expect(value == 42)
        #expect(limiter.inFlight == 0)
        #expect(limiter.waiting == 0)
    }

    @Test func aThrowingOperationFreesItsPlace() async {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 0)
        await #expect(throws: TestError.permanent) {
            try await limiter.withPermit { throw TestError.permanent }
        }
        #expect(limiter.inFlight == 0)
        let value = try? await limiter.withPermit { 1 }
        #expect(value == 1)
    }

    @Test func waitersAreServedInArrivalOrder() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 10)
        let log = Log<String>()
        let gates = (0..<5).map { _ in Gate() }
        var tasks: [Task<Void, any Error>] = []
        for index in 0..<5 {
            tasks.append(holder(limiter, "\(index)", log: log, gate: gates[index]))
            // The first takes the place; each later one must be in line before the next starts.
            await yieldUntil { index == 0 ? log.count == 1 : limiter.waiting == index }
        }
        #expect(limiter.inFlight == 1)
        #expect(limiter.waiting == 4)
        for index in 0..<5 {
            gates[index].open()
            try await tasks[index].value
        }
        #expect(log.values == ["0", "1", "2", "3", "4"])
        #expect(limiter.inFlight == 0)
        #expect(limiter.waiting == 0)
    }

    @Test func aNewcomerDoesNotOvertakeTheLineWhenAPlaceFrees() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 10)
        let log = Log<String>()
        let first = Gate(), second = Gate(), third = Gate()
        let a = holder(limiter, "a", log: log, gate: first)
        await yieldUntil { log.count == 1 }
        let b = holder(limiter, "b", log: log, gate: second)
        await yieldUntil { limiter.waiting == 1 }
        first.open()
        try await a.value  // its place went straight to b
        let c = holder(limiter, "c", log: log, gate: third)
        await yieldUntil { log.count == 2 && limiter.waiting == 1 }
        #expect(log.values == ["a", "b"])
        second.open()
        third.open()
        try await b.value
        try await c.value
        #expect(log.values == ["a", "b", "c"])
    }

    @Test func aFullLineRejectsAtOnceWithATypedError() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 2)
        let log = Log<String>()
        let gate = Gate()
        let running = holder(limiter, "running", log: log, gate: gate)
        await yieldUntil { log.count == 1 }
        let w1 = holder(limiter, "w1", log: log, gate: gate)
        await yieldUntil { limiter.waiting == 1 }
        let w2 = holder(limiter, "w2", log: log, gate: gate)
        await yieldUntil { limiter.waiting == 2 }

        var ran = false
        let error = await thrownError { try await limiter.withPermit { ran = true } }
        #expect(error as? LimiterRejection == LimiterRejection(reason: .concurrencyLimit(maxConcurrent: 1, maxWaiting: 2)))
        #expect((error as? LimiterRejection)?.retryAfter == nil)
        #expect(!ran)
        #expect(limiter.waiting == 2)  // the rejected caller took no place in line

        gate.open()
        for task in [running, w1, w2] { try await task.value }
        #expect(log.values == ["running", "w1", "w2"])
    }

    @Test func zeroWaitingRejectsAsSoonAsEveryPlaceIsTaken() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 2, maxWaiting: 0)
        let log = Log<String>()
        let gate = Gate()
        let tasks = [holder(limiter, "a", log: log, gate: gate), holder(limiter, "b", log: log, gate: gate)]
        await yieldUntil { log.count == 2 }
        await #expect(throws: LimiterRejection.self) { try await limiter.withPermit {} }
        gate.open()
        for task in tasks { try await task.value }
        #expect(limiter.inFlight == 0)
    }

    @Test func anAlreadyCancelledCallerThrowsWithoutRunningOrQueueing() async {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 1)
        let ran = Log<Bool>()
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await limiter.withPermit { ran.append(true) }
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(ran.count == 0)
        #expect(limiter.inFlight == 0)
        #expect(limiter.waiting == 0)
    }

    @Test func aWaiterCancelledInLineLeavesItWithoutTakingAPlace() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 5)
        let log = Log<String>()
        let gate = Gate()
        let running = holder(limiter, "running", log: log, gate: gate)
        await yieldUntil { log.count == 1 }
        let cancelled = holder(limiter, "cancelled", log: log, gate: gate)
        await yieldUntil { limiter.waiting == 1 }
        let next = holder(limiter, "next", log: log, gate: gate)
        await yieldUntil { limiter.waiting == 2 }

        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(limiter.waiting == 1)
        #expect(limiter.inFlight == 1)

        gate.open()
        try await running.value
        try await next.value
        #expect(log.values == ["running", "next"])  // the place skipped the cancelled waiter
        #expect(limiter.inFlight == 0)
        #expect(limiter.waiting == 0)
    }

    @Test func cancellingEveryWaiterLeavesTheLimiterEmpty() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 100)
        let log = Log<String>()
        let gate = Gate()
        let running = holder(limiter, "running", log: log, gate: gate)
        await yieldUntil { log.count == 1 }
        let waiters = (0..<50).map { holder(limiter, "w\($0)", log: log, gate: gate) }
        await yieldUntil { limiter.waiting == 50 }
        for waiter in waiters { waiter.cancel() }
        for waiter in waiters { _ = await waiter.result }
        #expect(limiter.waiting == 0)
        gate.open()
        try await running.value
        #expect(limiter.inFlight == 0)
        #expect(log.values == ["running"])
    }

    @Test func aStormOfAThousandTasksNeverExceedsTheLimitNorLeaksAPlace() async throws {
        let limiter = ConcurrencyLimiter(maxConcurrent: 4, maxWaiting: 200)
        let running = Locked((now: 0, peak: 0))
        var generator = SplitMix64(seed: 0x5707)
        var tasks: [Task<String, Never>] = []
        var toCancel: [Task<String, Never>] = []
        for _ in 0..<1_000 {
            let yields = Int(generator.next() % 4)
            let task = Task { () -> String in
                do {
                    try await limiter.withPermit {
                        running.withLock { state in
                            state.now += 1
                            state.peak = max(state.peak, state.now)
                        }
                        for _ in 0..<yields { await Task.yield() }
                        running.withLock { $0.now -= 1 }
                    }
                    return "ran"
                } catch is LimiterRejection {
                    return "rejected"
                } catch is CancellationError {
                    return "cancelled"
                } catch {
                    return "other"
                }
            }
            tasks.append(task)
            if generator.next() % 5 == 0 { toCancel.append(task) }
        }
        for task in toCancel { task.cancel() }
        var outcomes: [String: Int] = [:]
        for task in tasks { outcomes[await task.value, default: 0] += 1 }

        #expect(outcomes.values.reduce(0, +) == 1_000)
        #expect(outcomes["other"] == nil)
        #expect(outcomes["ran", default: 0] > 0)
        #expect(running.withLock { $0.peak } <= 4)
        #expect(limiter.inFlight == 0)
        #expect(limiter.waiting == 0)
        // Every place is free again: four holders run side by side.
        let log = Log<String>()
        let gate = Gate()
        let holders = (0..<4).map { holder(limiter, "h\($0)", log: log, gate: gate) }
        await yieldUntil { log.count == 4 }
        #expect(limiter.inFlight == 4)
        gate.open()
        for holder in holders { try await holder.value }
    }

    @Test func runsInTheCallersIsolation() async throws {
        let counter = try await MainActorCounter.run(through: ConcurrencyLimiter(maxConcurrent: 1, maxWaiting: 0))
        #expect(counter == 1)
    }
}

@MainActor
private enum MainActorCounter {
    static var value = 0

    static func run(through limiter: ConcurrencyLimiter) async throws -> Int {
        try await limiter.withPermit { value += 1 }  // touches main-actor state: compiles only if isolated
        return value
    }
}
