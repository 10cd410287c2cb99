import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

@Suite("SingleFlightTable: one shared call per identity, replaced once it ends", .timeLimit(.minutes(1)))
struct SingleFlightTableTests {
    private func key(_ path: String, bodyLimit: Int? = nil) -> SingleFlightTable.Key {
        let url = URL(string: "https://api.example.test\(path)")!
        return SingleFlightTable.Key(RequestIdentity(method: .get, url: url, headers: [:], body: nil), maximumBodySize: bodyLimit)
    }

    @Test func aNewIdentityRegistersTheCallItMakesAndItsFirstWaiter() {
        let table = SingleFlightTable()
        let key = key("/a")
        var made: [SharedCall] = []
        let entry = table.joinOrStart(key) {
            let call = SharedCall.unstarted(key: key)
            made.append(call)
            return call
        }
        #expect(!entry.joined)
        #expect(made.count == 1 && made[0] === entry.call)
        #expect(entry.waiter == entry.call.firstTicket)
        #expect(table.count == 1)
    }

    @Test func theSameIdentityJoinsTheCallInFlightWithATicketOfItsOwn() {
        let table = SingleFlightTable()
        let key = key("/a")
        let first = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        let second = table.joinOrStart(key) {
            Issue.record("a second call was made for an identity in flight")
            return SharedCall.unstarted(key: key)
        }
        #expect(second.joined)
        #expect(second.call === first.call)
        #expect(second.waiter != first.waiter)
        #expect(table.count == 1)
    }

    @Test func differentBodyLimitsOrIdentitiesNeverShareACall() {
        let table = SingleFlightTable()
        let plain = table.joinOrStart(key("/a")) { SharedCall.unstarted(key: key("/a")) }
        let limited = table.joinOrStart(key("/a", bodyLimit: 10)) { SharedCall.unstarted(key: key("/a", bodyLimit: 10)) }
        let other = table.joinOrStart(key("/b")) { SharedCall.unstarted(key: key("/b")) }
        #expect(plain.call !== limited.call && plain.call !== other.call && limited.call !== other.call)
        #expect(!limited.joined && !other.joined)
        #expect(table.count == 3)
    }

    @Test func aCompletedCallRefusesTheJoinAndIsReplaced() {
        let table = SingleFlightTable()
        let key = key("/a")
        let first = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        first.call.complete(.failure(.timedOut))
        let next = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        #expect(!next.joined)
        #expect(next.call !== first.call)
        #expect(table.count == 1)
    }

    @Test func anAbandonedCallRefusesTheJoinAndIsReplaced() async {
        let table = SingleFlightTable()
        let key = key("/a")
        let first = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        let waiter = Task { await first.call.wait(first.waiter) }
        waiter.cancel()
        #expect(await waiter.value.failure?.caseName == "cancelled")
        let next = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        #expect(!next.joined)
        #expect(next.call !== first.call)
    }

    @Test func removingAReplacedCallLeavesItsSuccessorRegistered() {
        let table = SingleFlightTable()
        let key = key("/a")
        let first = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        first.call.complete(.failure(.timedOut))
        let second = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        table.remove(first.call)
        #expect(table.count == 1)
        let third = table.joinOrStart(key) { SharedCall.unstarted(key: key) }
        #expect(third.joined && third.call === second.call)
        table.remove(second.call)
        #expect(table.count == 0)
    }

    @Test func manyIdentitiesAcrossStripesAreCountedAndRemovedExactly() {
        let table = SingleFlightTable()
        let calls = (0..<500).map { index in
            let key = key("/\(index)")
            return table.joinOrStart(key) { SharedCall.unstarted(key: key) }.call
        }
        #expect(table.count == 500)
        for call in calls { table.remove(call) }
        #expect(table.count == 0)
    }

    @Test func concurrentSendsOfOneIdentityMakeExactlyOneCall() async {
        let table = SingleFlightTable()
        let key = key("/hot")
        let made = Locked(0)
        let results = await withTaskGroup(of: (ObjectIdentifier, Bool).self) { group in
            for _ in 0..<1_000 {
                group.addTask {
                    let entry = table.joinOrStart(key) {
                        made.withLock { $0 += 1 }
                        return SharedCall.unstarted(key: key)
                    }
                    return (ObjectIdentifier(entry.call), entry.joined)
                }
            }
            var results: [(ObjectIdentifier, Bool)] = []
            for await result in group { results.append(result) }
            return results
        }
        #expect(made.withLock { $0 } == 1)
        #expect(Set(results.map(\.0)).count == 1)
        #expect(results.filter { !$0.1 }.count == 1)
    }
}
