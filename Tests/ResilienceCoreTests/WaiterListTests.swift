import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

/// A minimal owner of a waiting line: callers wait for a value `resumeFirst` or `open` gives them.
private final class Line: Sendable {
    struct State: Sendable {
        var waiters = WaiterList<Int, Int>()
        var openValue: Int?
    }

    let state = Locked(State())

    /// Waits for a value; -1 when cancelled.
    func wait(tag: Int = 0) async -> Int {
        await state.wait(on: \.waiters, tag: tag, cancelled: -1) { $0.openValue }
    }

    func resumeFirst(with value: Int) -> Bool {
        switch state.withLock({ $0.waiters.resumeFirst(with: value) }) {
        case .resume(let waiter)?:
            waiter.resume(returning: value)
            return true
        case .handedToPending?: return true
        case nil: return false
        }
    }

    func open(_ value: Int) {
        let waiters = state.withLock { state in
            state.openValue = value
            return state.waiters.takeAll()
        }
        for waiter in waiters { waiter.resume(returning: value) }
    }

    var count: Int { state.withLock { $0.waiters.count } }

    func waitUntil(count: Int) async {
        while self.count < count { await Task.yield() }
    }
}

@Suite("WaiterList: the package's one waiting line", .timeLimit(.minutes(1)))
struct WaiterListTests {
    // MARK: The value type, step by step

    @Test func ticketsAreIssuedInArrivalOrderAndCounted() {
        var list = WaiterList<Int, String>()
        let a = list.issue("a")
        let b = list.issue("b")
        #expect(a < b)
        #expect(list.count == 2)
        #expect(list.tags == ["a", "b"])
        #expect(list.waitingCount() == 0)
    }

    @Test func resumeFirstHandsTheValueToAPendingEarliestArrivalWhichClaimsIt() {
        var list = WaiterList<Int, Void>()
        let ticket = list.issue(())
        guard case .handedToPending? = list.resumeFirst(with: 7) else {
            Issue.record("expected the value to be handed to the pending ticket")
            return
        }
        #expect(list.claim(ticket) == 7)
        #expect(list.isEmpty)
        #expect(list.resumeFirst(with: 8) == nil)
    }

    @Test func cancelBeforeSuspendingIsClaimedAsTheCancelValue() {
        var list = WaiterList<Int, Void>()
        let ticket = list.issue(())
        #expect(list.cancel(ticket, with: -1) == nil)
        #expect(list.claim(ticket) == -1)
        #expect(list.isEmpty)
    }

    /// The lost wake-up a reviewer found in `ConcurrencyLimiter`: a waiter cancelled after its
    /// ticket was issued but before it suspended still counted as in line, so a place freed then
    /// found nobody to serve, and a newcomer seeing "someone in line" queued behind a waiter that
    /// was leaving — with a free place and nobody left to wake it.
    @Test func aTicketHandedItsCancellationNoLongerCountsAsInLine() {
        var line = WaiterList<Bool, Void>()
        let departing = line.issue(())
        _ = line.cancel(departing, with: false)
        #expect(line.count == 0)
        #expect(line.isEmpty)
        #expect(line.resumeFirst(with: true) == nil)  // nobody to serve: the place stays free
        let newcomer = line.issue(())
        #expect(line.count == 1)
        #expect(line.claim(departing) == false)  // the departing waiter still gets its value
        #expect(line.count == 1)
        line.withdraw(newcomer)
        #expect(line.isEmpty)
    }

    @Test func aTicketHandedAValueBeforeSuspendingNoLongerCountsAsInLine() {
        var line = WaiterList<Int, Void>()
        let first = line.issue(())
        let second = line.issue(())
        guard case .handedToPending? = line.resumeFirst(with: 7) else {
            Issue.record("expected the value to be handed to the pending first arrival")
            return
        }
        #expect(line.count == 1)  // only the second still waits to be served
        #expect(line.claim(first) == 7)
        #expect(line.count == 1)
        _ = line.cancel(second, with: 0)
        #expect(line.count == 0)
        #expect(line.withdraw(second) == 0)
        #expect(line.isEmpty)
    }

    @Test func cancelAfterLeavingFindsNothingAndLeavesNothingBehind() {
        var list = WaiterList<Int, Void>()
        let ticket = list.issue(())
        #expect(list.withdraw(ticket) == nil)
        #expect(list.cancel(ticket, with: -1) == nil)
        #expect(list.claim(ticket) == nil)
        #expect(list.isEmpty)
        #expect(list.count == 0)
    }

    @Test func aSecondCancelOfAPendingTicketKeepsTheFirstValue() {
        var list = WaiterList<Int, Void>()
        let ticket = list.issue(())
        _ = list.resumeFirst(with: 5)
        #expect(list.cancel(ticket, with: -1) == nil)
        #expect(list.claim(ticket) == 5)
    }

    @Test func resumeFirstSkipsWaitersThatAlreadyHoldAValue() {
        var list = WaiterList<Int, Int>()
        let first = list.issue(1)
        let second = list.issue(2)
        _ = list.resumeFirst(with: 10)
        guard case .handedToPending? = list.resumeFirst(with: 20) else {
            Issue.record("expected the second value to go to the second ticket")
            return
        }
        #expect(list.claim(first) == 10)
        #expect(list.claim(second) == 20)
    }

    @Test func takeAllLeavesPendingWaitersToLookAgainAsTheySuspend() {
        var list = WaiterList<Int, Int>()
        let pending = list.issue(1)
        #expect(list.takeAll().isEmpty)
        #expect(list.count == 1)
        #expect(list.claim(pending) == nil)
    }

    @Test func holesAreCompactedSoCountAndLookupStayRight() {
        var list = WaiterList<Int, Int>()
        let tickets = (0..<1_000).map { list.issue($0) }
        // Leave every other one, then every one but the last.
        for ticket in tickets.enumerated() where ticket.offset % 2 == 0 { list.withdraw(ticket.element) }
        #expect(list.count == 500)
        for ticket in tickets.dropLast() { list.withdraw(ticket) }
        #expect(list.count == 1)
        #expect(list.tags == [999])
        _ = list.resumeFirst(with: 42)
        #expect(list.claim(tickets[999]) == 42)
        #expect(list.isEmpty)
    }

    // MARK: Suspended callers through Locked.wait

    @Test func aWaiterIsAnsweredAtOnceWhenAlreadyReady() async {
        let line = Line()
        line.open(3)
        #expect(await line.wait() == 3)
        #expect(line.count == 0)
    }

    @Test func waitersAreServedInArrivalOrder() async {
        let line = Line()
        let first = Task { await line.wait(tag: 1) }
        await line.waitUntil(count: 1)
        let second = Task { await line.wait(tag: 2) }
        await line.waitUntil(count: 2)
        #expect(line.state.withLock { $0.waiters.tags } == [1, 2])
        #expect(line.resumeFirst(with: 100))
        #expect(line.resumeFirst(with: 200))
        #expect(await first.value == 100)
        #expect(await second.value == 200)
    }

    @Test func cancelBeforeWaitingAnswersTheCancelValueWithoutSuspending() async {
        let line = Line()
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await line.wait()
        }
        #expect(await task.value == -1)
        #expect(line.count == 0)
    }

    @Test func cancelWhileWaitingAnswersAtOnceAndTheOthersKeepWaiting() async {
        let line = Line()
        let cancelled = Task { await line.wait(tag: 1) }
        await line.waitUntil(count: 1)
        let kept = Task { await line.wait(tag: 2) }
        await line.waitUntil(count: 2)
        cancelled.cancel()
        #expect(await cancelled.value == -1)
        #expect(line.count == 1)
        #expect(line.resumeFirst(with: 9))
        #expect(await kept.value == 9)
    }

    @Test func cancelAfterBeingResumedChangesNothing() async {
        let line = Line()
        let task = Task { await line.wait() }
        await line.waitUntil(count: 1)
        #expect(line.resumeFirst(with: 4))
        task.cancel()
        #expect(await task.value == 4)
        #expect(line.count == 0)
        #expect(line.state.withLock { $0.waiters.tags.isEmpty })
    }

    @Test func tenThousandWaitersAreEachAnsweredExactlyOnceWhetherCancelledOrServed() async {
        let line = Line()
        let count = 10_000
        let tasks = (0..<count).map { index in Task { await line.wait(tag: index) } }
        await line.waitUntil(count: count)
        // Cancel every third while serving in order, so cancellations race the resumes.
        let canceller = Task {
            for index in stride(from: 0, to: count, by: 3) { tasks[index].cancel() }
        }
        var served = 0
        while line.resumeFirst(with: served) { served += 1 }
        await canceller.value
        while line.resumeFirst(with: served) { served += 1 }
        var results: [Int: Int] = [:]
        for (index, task) in tasks.enumerated() { results[index] = await task.value }
        #expect(results.count == count)
        let servedValues = results.values.filter { $0 >= 0 }.sorted()
        // Every value handed out reached exactly one waiter, and none twice.
        #expect(servedValues == Array(0..<served))
        // Whoever got -1 had been cancelled; the rest were served.
        for (index, value) in results where value == -1 { #expect(index % 3 == 0) }
        #expect(line.count == 0)
    }

    @Test func cancellationRacingResumeNeverLosesOrDuplicatesAnAnswer() async {
        for round in 0..<200 {
            let line = Line()
            let task = Task { await line.wait() }
            if round % 2 == 0 { await line.waitUntil(count: 1) }
            async let cancel: Void = task.cancel()
            async let served = line.resumeFirst(with: round)
            _ = await cancel
            let wasServed = await served
            let value = await task.value
            if value == -1 {
                // Cancelled first: no value was handed out (there is nobody else to take it).
                #expect(!wasServed)
            } else {
                #expect(value == round)
                #expect(wasServed)
            }
            #expect(line.count == 0)
        }
    }
}
