import Foundation
import Testing
import Retry
import ResilienceTesting
@testable import RequestEngine
import ResilienceCore

/// The watchdog's registrations on their own: each call is its own registration and knows its
/// heap slot, so these pin the slot bookkeeping and the rule that a late cancellation of an
/// earlier attempt leaves the current one alone.
@Suite("DeadlineWatchdog: one heap of calls, slots kept in the calls", .timeLimit(.minutes(1)))
struct DeadlineWatchdogTests {
    @Test func aLateCancellationOfAnEarlierAttemptLeavesTheCurrentRegistration() {
        let watchdog = DeadlineWatchdog(time: TimeSource(ManualClock()))
        defer { watchdog.shutdown() }
        let call = SharedCall.unstarted()
        // Attempt 0 timed out (its entry is gone); the successor registered attempt 1. The
        // superseded task's transport then answers and cancels attempt 0.
        watchdog.schedule(call, attempt: 1, after: .seconds(5))
        watchdog.cancel(call, attempt: 0)
        #expect(watchdog.pendingCount == 1)
        #expect(watchdog.slot(of: call) == 0)
        watchdog.cancel(call, attempt: 1)
        #expect(watchdog.pendingCount == 0)
        #expect(watchdog.slot(of: call) == -1)
    }

    @Test func cancellingFromAnywhereKeepsTheHeapOrderedAndEverySlotTrue() {
        let watchdog = DeadlineWatchdog(time: TimeSource(ManualClock()))
        defer { watchdog.shutdown() }
        var generator = SplitMix64(seed: 42)
        var live: [(call: SharedCall, attempt: Int)] = []
        for round in 0..<2_000 {
            if live.isEmpty || generator.next() % 3 != 0 {
                let call = SharedCall.unstarted()
                // Never zero: a deadline due at once would be fired by the sleeper meanwhile.
                watchdog.schedule(call, attempt: round, after: .milliseconds(1 + Int64(generator.next() % 10_000)))
                live.append((call, round))
            } else {
                let (call, attempt) = live.remove(at: Int(generator.next() % UInt64(live.count)))
                watchdog.cancel(call, attempt: attempt)
                #expect(watchdog.slot(of: call) == -1)
            }
            if round % 50 == 0 { #expect(watchdog.isConsistent) }
        }
        #expect(watchdog.pendingCount == live.count)
        #expect(watchdog.isConsistent)
    }

    @Test func deadlinesFireInDeadlineOrderWhateverTheRegistrationOrder() async {
        let clock = ManualClock()
        let watchdog = DeadlineWatchdog(time: TimeSource(clock))
        defer { watchdog.shutdown() }
        let delays: [Int64] = [30, 5, 60, 5, 10, 45, 1]
        // Each call's attempt is open, as during a request, so a fired deadline shows: the
        // timeout claims the attempt and the call's own claim then fails.
        let calls = delays.map { _ in SharedCall.unstarted() }
        // As the engine does: a passed deadline claims the attempt for its timeout.
        let firedOrder = Locked<[ObjectIdentifier]>([])
        watchdog.onExpiry { call, attempt in
            firedOrder.withLock { $0.append(ObjectIdentifier(call)) }
            call.timeOut(attempt: attempt, priority: nil) { _ in }
        }
        for (index, seconds) in delays.enumerated() {
            calls[index].open(attempt: 0)
            watchdog.schedule(calls[index], attempt: 0, after: .seconds(seconds))
        }
        // A far deadline keeps the sleeper re-arming, so each step can wait for it.
        watchdog.schedule(SharedCall.unstarted(), attempt: 0, after: .seconds(1_000))
        // One sleeper, always waiting for the earliest live deadline; at each distinct deadline
        // exactly the registrations due by then have fired.
        var fired: Set<Int> = []
        for deadline in Set(delays).sorted() {
            await clock.waitForSleepers(1)
            #expect(clock.sleeperCount == 1)
            #expect(clock.nextDeadline == .init(offset: .seconds(deadline)))
            clock.advance(to: .init(offset: .seconds(deadline)))
            await clock.waitForSleepers(1)  // the sleeper has handled the due ones and re-armed
            fired.formUnion(delays.indices.filter { delays[$0] == deadline })
            #expect(watchdog.pendingCount == delays.count - fired.count + 1)
            #expect(watchdog.isConsistent)
            for index in calls.indices where !fired.contains(index) {
                #expect(watchdog.slot(of: calls[index]) >= 0)  // not fired yet: still registered
            }
        }
        // Every timeout claimed its attempt: the calls' own (late) claims all fail.
        for call in calls { #expect(!call.claim(attempt: 0)) }
        // Fired in deadline order (ties in any order).
        let position = Dictionary(uniqueKeysWithValues: firedOrder.withLock { $0 }.enumerated().map { ($1, $0) })
        let byDeadline = calls.indices.sorted { delays[$0] < delays[$1] }
        for (earlier, later) in zip(byDeadline, byDeadline.dropFirst()) where delays[earlier] < delays[later] {
            #expect(position[ObjectIdentifier(calls[earlier])]! < position[ObjectIdentifier(calls[later])]!)
        }
        #expect(clock.nextDeadline == .init(offset: .seconds(1_000)))
    }
}
