@_spi(ResilienceCore) import ResilienceCore
import Testing

@Suite("ClosingGate: close() refuses new operations and waits for the admitted ones", .timeLimit(.minutes(1)))
struct ClosingGateTests {
    @Test func operationsAreAdmittedUntilCloseAndRefusedAfter() async {
        let gate = ClosingGate()
        #expect(gate.enter())
        gate.leave()
        #expect(!gate.isClosed)
        await gate.close()  // nothing admitted: returns at once
        #expect(gate.isClosed && !gate.enter())
        await gate.close()  // twice is once
    }

    @Test func closeReturnsOnlyOnceEveryAdmittedOperationHasLeft() async {
        let gate = ClosingGate()
        #expect(gate.enter() && gate.enter())
        let closed = Locked(false)
        let closing = Task {
            await gate.close()
            closed.withLock { $0 = true }
        }
        while !gate.isClosed { await Task.yield() }
        #expect(!gate.enter())  // refused while the others still run
        gate.leave()
        for _ in 0..<100 { await Task.yield() }
        #expect(!closed.withLock { $0 })  // one is still in
        gate.leave()
        await closing.value
        #expect(closed.withLock { $0 })
    }

    @Test func aCancelledCloserStillWaitsForTheAdmittedOperation() async {
        let gate = ClosingGate()
        #expect(gate.enter())
        let left = Locked(false)
        let closing = Task {
            await gate.close()
            return left.withLock { $0 }
        }
        while !gate.isClosed { await Task.yield() }
        closing.cancel()
        for _ in 0..<100 { await Task.yield() }
        left.withLock { $0 = true }
        gate.leave()
        #expect(await closing.value)  // it returned only after the leave
    }
}
