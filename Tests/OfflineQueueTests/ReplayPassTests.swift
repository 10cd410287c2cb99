import Foundation
import Testing

@testable import OfflineQueue

@Suite("ReplayPass: one pass's decisions — ordering keys, expiry, backoff, rescans")
struct ReplayPassTests {
    private let now = Date(timeIntervalSince1970: 1_000_000)

    /// An entry at `sequence`, with an optional ordering key, TTL and backoff.
    private func entry(_ sequence: UInt64, key: String? = nil, ttl: TimeInterval = 3600, dueIn: TimeInterval? = nil) -> QueueEntry {
        var request = Mutation("/\(sequence)")
        request.orderingKey = key
        request.ttl = ttl
        var entry = QueueEntry(request, enqueuedAt: now.addingTimeInterval(-1)).placed(at: sequence)
        entry.nextAttemptAt = dueIn.map { now.addingTimeInterval($0) }
        return entry
    }

    @Test func theFirstScanAlwaysRunsAndAnotherOnlyAfterSomethingLeftTheQueue() {
        var pass = ReplayPass(connected: true)
        var reads = 0
        let r1 = pass.nextScan {
            reads += 1; return []
        }
        #expect(r1 != nil)
        let r2 = pass.nextScan {
            reads += 1; return []
        }
        #expect(r2 == nil, "nothing removed: the pass is over")
        #expect(reads == 1, "the queue is not read for a scan that does not happen")

        var again = ReplayPass(connected: true)
        let a = entry(1)
        _ = again.nextScan { [a] }
        let r3 = again.decide(a, now: now, beingReplaced: false)
        #expect(r3 == .replay)
        let r4 = again.sent(a, .removed)
        #expect(r4)
        let r5 = again.nextScan { [] }
        #expect(r5 != nil, "a removal may have unblocked a successor")
    }

    @Test func onlyTheHeadOfAnOrderingKeyIsSentAndItsSuccessorFollowsInTheNextScan() {
        var pass = ReplayPass(connected: true)
        let first = entry(1, key: "doc")
        let second = entry(2, key: "doc")
        let other = entry(3)
        _ = pass.nextScan { [first, second, other] }
        let r6 = pass.decide(first, now: now, beingReplaced: false)
        #expect(r6 == .replay)
        let r7 = pass.sent(first, .removed)
        #expect(r7)
        let r8 = pass.decide(second, now: now, beingReplaced: false)
        #expect(r8 == .skip, "its predecessor was queued when the scan began")
        let r9 = pass.decide(other, now: now, beingReplaced: false)
        #expect(r9 == .replay)
        let r10 = pass.sent(other, .removed)
        #expect(r10)
        _ = pass.nextScan { [second] }
        let r11 = pass.decide(second, now: now, beingReplaced: false)
        #expect(r11 == .replay)
        let r12 = pass.decide(other, now: now, beingReplaced: false)
        #expect(r12 == .skip, "handled already this pass")
    }

    @Test func aKeptEntryHoldsBackTheRestOfItsKeyForTheWholePass() {
        var pass = ReplayPass(connected: true)
        let first = entry(1, key: "doc")
        let second = entry(2, key: "doc")
        _ = pass.nextScan { [first, second] }
        let r13 = pass.decide(first, now: now, beingReplaced: false)
        #expect(r13 == .replay)
        let r14 = pass.sent(first, .kept)
        #expect(r14)
        #expect(pass.blockedKeys == ["doc"])
        // Even once the head is gone (say, cancelled), nothing more of the key goes this pass.
        _ = pass.sent(entry(9), .removed)
        _ = pass.nextScan { [second] }
        let r15 = pass.decide(second, now: now, beingReplaced: false)
        #expect(r15 == .skip)
    }

    @Test func anEntryNotYetDueOrBeingReplacedIsHeldBackWithItsKey() {
        var pass = ReplayPass(connected: true)
        let waiting = entry(1, key: "a", dueIn: 30)
        let replaced = entry(2, key: "b")
        let plain = entry(3, dueIn: 30)
        _ = pass.nextScan { [waiting, replaced, plain] }
        let r16 = pass.decide(waiting, now: now, beingReplaced: false)
        #expect(r16 == .holdBack)
        let r17 = pass.decide(replaced, now: now, beingReplaced: true)
        #expect(r17 == .holdBack)
        let r18 = pass.decide(plain, now: now, beingReplaced: false)
        #expect(r18 == .holdBack)
        #expect(pass.blockedKeys == ["a", "b"])
        let r19 = pass.decide(entry(4, dueIn: -1), now: now, beingReplaced: false)
        #expect(r19 == .replay, "due: sent")
    }

    @Test func expiredEntriesAreSweptEvenOfflineAndNothingIsSentOffline() {
        var pass = ReplayPass(connected: false)
        let expired = entry(1, ttl: 0.5)
        let live = entry(2)
        _ = pass.nextScan { [expired, live] }
        let r20 = pass.decide(expired, now: now, beingReplaced: false)
        #expect(r20 == .expire)
        let r21 = pass.decide(live, now: now, beingReplaced: false)
        #expect(r21 == .skip)
        let r22 = pass.decide(expired, now: now, beingReplaced: false)
        #expect(r22 == .skip, "expired once")
    }

    @Test func aStoppedSendEndsThePass() {
        var pass = ReplayPass(connected: true)
        let a = entry(1)
        _ = pass.nextScan { [a] }
        _ = pass.decide(a, now: now, beingReplaced: false)
        let r23 = pass.sent(a, .stopped)
        #expect(!r23)
        let r24 = pass.nextScan { [a] }
        #expect(r24 == nil)
    }
}
