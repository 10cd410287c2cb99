import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

/// The watchdog's registrations on their own: each registration's handle indexes the watchdog's
/// own table of heap positions, so these pin that bookkeeping (handles reused, never confused)
/// and the rule that a late cancellation of an earlier attempt leaves the current one alone.
@Suite("DeadlineWatchdog: one heap of calls, positions kept by handle", .timeLimit(.minutes(1)))
struct DeadlineWatchdogTests {
    @Test func aLateCancellationOfAnEarlierAttemptLeavesTheCurrentRegistration() {
        let watchdog = DeadlineWatchdog(time: TimeSource(ManualClock()))
        defer { watchdog.shutdown() }
        let call = SharedCall.unstarted()
        // Attempt 0 timed out (its entry is gone); the successor registered attempt 1. The
        // superseded task's transport then answers and cancels attempt 0.
        // Attempt 0's registration had handle 0, freed when it fired; attempt 1 reuses it.
        let current = watchdog.schedule(call, attempt: 1, after: .seconds(5))
        #expect(current.handle == 0)
        watchdog.cancel(.init(handle: 0, call: ObjectIdentifier(call), attempt: 0))
        #expect(watchdog.pendingCount == 1)
        #expect(watchdog.position(of: current) == 0)
        watchdog.cancel(current)
        #expect(watchdog.pendingCount == 0)
        #expect(watchdog.position(of: current) == -1)
        #expect(watchdog.isConsistent)
    }

    @Test func aStaleRegistrationNeverCancelsTheOneThatReusedItsHandle() {
        let watchdog = DeadlineWatchdog(time: TimeSource(ManualClock()))
        defer { watchdog.shutdown() }
        let first = SharedCall.unstarted()
        let stale = watchdog.schedule(first, attempt: 0, after: .seconds(5))
        watchdog.cancel(stale)
        // Another call's registration takes the freed handle, and so does a later attempt of the same call.
        let other = watchdog.schedule(SharedCall.unstarted(), attempt: 0, after: .seconds(5))
        #expect(other.handle == stale.handle)
        watchdog.cancel(stale)
        #expect(watchdog.position(of: other) == 0)
        watchdog.cancel(other)
        let later = watchdog.schedule(first, attempt: 1, after: .seconds(5))
        #expect(later.handle == stale.handle)
        watchdog.cancel(stale)
        #expect(watchdog.position(of: later) == 0)
        #expect(watchdog.isConsistent)
    }

    @Test func cancellingFromAnywhereKeepsTheHeapOrderedAndEveryPositionTrue() {
        let watchdog = DeadlineWatchdog(time: TimeSource(ManualClock()))
        defer { watchdog.shutdown() }
        var generator = SplitMix64(seed: 42)
        var live: [(call: SharedCall, registration: DeadlineWatchdog.Registration)] = []
        for round in 0..<2_000 {
            if live.isEmpty || generator.next() % 3 != 0 {
                let call = SharedCall.unstarted()
                // Never zero: a deadline due at once would be fired by the sleeper meanwhile.
                let registration = watchdog.schedule(call, attempt: round, after: .milliseconds(1 + Int64(generator.next() % 10_000)))
                live.append((call, registration))
            } else {
                let (_, registration) = live.remove(at: Int(generator.next() % UInt64(live.count)))
                watchdog.cancel(registration)
                #expect(watchdog.position(of: registration) == -1)
                watchdog.cancel(registration)  // a second cancel finds nothing
                #expect(watchdog.pendingCount == live.count)
            }
            if round % 50 == 0 { #expect(watchdog.isConsistent) }
        }
        #expect(watchdog.pendingCount == live.count)
        #expect(watchdog.isConsistent)
        for (_, registration) in live { #expect(watchdog.position(of: registration) >= 0) }
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
        var registrations: [DeadlineWatchdog.Registration] = []
        for (index, seconds) in delays.enumerated() {
            calls[index].open(attempt: 0)
            registrations.append(watchdog.schedule(calls[index], attempt: 0, after: .seconds(seconds)))
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
                #expect(watchdog.position(of: registrations[index]) >= 0)  // not fired yet: still registered
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
