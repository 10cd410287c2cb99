import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import Testing

/// Two stores on two clients (two replicas) draining one table at once.
@Suite(.postgresReachable, .timeLimit(.minutes(3)))
struct PostgresReplicaTests {
    /// What the replicas delivered, checked as each claim arrives.
    actor Ledger {
        private var inFlight: Set<UUID> = []
        private var keysInFlight: Set<String> = []
        private var delivered: [UUID: Int] = [:]
        private var deliveredPerKey: [String: Int] = [:]
        private(set) var violations: [String] = []

        /// Records a claim of `entry`, the `index`-th of its ordering key.
        func claimed(_ entry: QueueEntry, index: Int) {
            if !inFlight.insert(entry.id).inserted { violations.append("\(entry.id) claimed twice at once") }
            if delivered[entry.id] != nil { violations.append("\(entry.id) claimed after it was delivered") }
            if let key = entry.orderingKey {
                if !keysInFlight.insert(key).inserted { violations.append("two entries of \(key) in flight") }
                let expected = deliveredPerKey[key, default: 0]
                if index != expected { violations.append("\(key): entry \(index) claimed when \(expected) was next") }
            }
        }

        /// Records the delivery, before the claim is completed (so the key's next entry, claimable
        /// once the completion commits, is never mistaken for an overlap).
        func delivering(_ entry: QueueEntry) {
            inFlight.remove(entry.id)
            delivered[entry.id, default: 0] += 1
            if let key = entry.orderingKey {
                keysInFlight.remove(key)
                deliveredPerKey[key, default: 0] += 1
            }
        }

        var deliveredCount: Int { delivered.count }
        var deliveredTwice: Int { delivered.values.filter { $0 > 1 }.count }
    }

    actor Flag {
        private(set) var isSet = false
        func set() { isSet = true }
    }

    @Test func twoReplicasNeverClaimOneEntryTwiceNorTwoOfAKeyAtOnce() async throws {
        let total = 500
        let keys = 25
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                // Every second entry has one of 25 ordering keys; its index within the key is in its path.
                var perKey: [String: Int] = [:]
                for number in 0..<total {
                    let key = number.isMultiple(of: 2) ? "key-\(number / 2 % keys)" : nil
                    let index = key.map { key in perKey[key, default: 0] } ?? 0
                    if let key { perKey[key, default: 0] += 1 }
                    let priority: QueuePriority = number % 7 == 0 ? .high : .normal
                    _ = try await store.add(entry(request("/\(number)/\(index)", priority: priority, orderingKey: key)), limit: nil)
                }

                let ledger = Ledger()
                let stores = [store, replica, store, replica]  // two consumers per replica
                try await withThrowingTaskGroup(of: Int.self) { group in
                    for consumer in stores {
                        group.addTask {
                            var rounds = 0
                            while true {
                                rounds += 1
                                let claims = try await consumer.claim(upTo: 8, now: at(1), lease: .seconds(600))
                                if claims.isEmpty {
                                    if try await consumer.queuedCount() == 0 { return rounds }
                                    await Task.yield()
                                    continue
                                }
                                for claim in claims {
                                    let index = Int(claim.entry.url.lastPathComponent) ?? -1
                                    await ledger.claimed(claim.entry, index: index)
                                }
                                for claim in claims {
                                    await ledger.delivering(claim.entry)
                                    try await consumer.complete(claim, reason: .delivered(statusCode: 200))
                                }
                            }
                        }
                    }
                    for try await _ in group {}
                }
                #expect(await ledger.violations == [])
                #expect(await ledger.deliveredCount == total)
                #expect(await ledger.deliveredTwice == 0)
                #expect(try await store.queuedCount() == 0)
            }
        }
    }

    @Test func anExpiredLeaseIsReclaimedByAnotherReplica() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                let first = try await store.add(entry(request("/1", orderingKey: "k")), limit: nil)
                let second = try await store.add(entry(request("/2", orderingKey: "k")), limit: nil)
                // This replica claims and then "dies": its claim is never settled.
                _ = try await store.claim(upTo: 10, now: at(0), lease: .seconds(30))  // the engine's default `claimLease`
                #expect(try await replica.claim(upTo: 10, now: at(29), lease: .seconds(30)).isEmpty)

                let taken = try await replica.claim(upTo: 10, now: at(30), lease: .seconds(30))
                #expect(taken.map(\.entry.id) == [first.id])  // and the key's second still waits behind it
                try await replica.complete(try #require(taken.first), reason: .delivered(statusCode: 200))
                #expect(try await replica.claim(upTo: 10, now: at(31), lease: .seconds(30)).map(\.entry.id) == [second.id])
            }
        }
    }

    @Test func editsOfACoalescingKeyAddedWhileAnotherReplicaDrainsGoOutNewestLast() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                let edits = 60
                let written = Flag()
                let writer = Task {
                    for version in 0..<edits {
                        _ = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "\(version)")), limit: nil)
                    }
                    await written.set()
                }
                // The replica sends whatever edit is queued, one at a time, until the writer is done
                // and nothing is left.
                var sent: [Int] = []
                var inFlight = 0
                while true {
                    let claims = try await replica.claim(upTo: 10, now: at(1), lease: .seconds(600))
                    inFlight = max(inFlight, claims.count)
                    for claim in claims {
                        sent.append(Int(String(decoding: claim.entry.body ?? Data(), as: UTF8.self)) ?? -1)
                        try await replica.complete(claim, reason: .delivered(statusCode: 200))
                    }
                    if claims.isEmpty {
                        if await written.isSet, try await replica.queuedCount() == 0 { break }
                        await Task.yield()
                    }
                }
                try await writer.value
                #expect(inFlight == 1)
                #expect(sent == sent.sorted() && Set(sent).count == sent.count, "an older edit went out after a newer one: \(sent)")
                #expect(sent.last == edits - 1)
            }
        }
    }

    @Test func addsOfOneKeyFromManyTasksAreClaimedInTheOrderTheyWereStored() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                let added = try await withThrowingTaskGroup(of: QueueEntry.self) { group in
                    for number in 0..<40 {
                        let writer = number.isMultiple(of: 2) ? store : replica
                        group.addTask { try await writer.add(entry(request("/\(number)", orderingKey: "shared")), limit: nil) }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(Set(added.map(\.sequence)).count == 40)
                var claimedOrder: [UUID] = []
                while let claim = try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).first {
                    claimedOrder.append(claim.entry.id)
                    try await store.complete(claim, reason: .delivered(statusCode: 200))
                }
                #expect(claimedOrder == added.sorted { $0.sequence < $1.sequence }.map(\.id))
            }
        }
    }
}
