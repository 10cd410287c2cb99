import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import Testing

extension Trait where Self == ConditionTrait {
    /// Skips a suite, saying why, when no PostgreSQL answers (`Scripts/postgres.sh start` runs one)
    /// and nothing says one should. When `CI` or `RESILIENCE_POSTGRES_URL` is set (`.ci/run` sets
    /// both, having started a server), a server that does not answer fails every test instead:
    /// a suite that CI meant to run never passes by being skipped.
    static var postgresReachable: Self {
        .enabled("needs PostgreSQL: run `bash Scripts/postgres.sh start` or set RESILIENCE_POSTGRES_URL") {
            if await PostgresTestDatabase.isReachable() { return true }
            if let required = PostgresTestDatabase.requiredBy { throw PostgresTestDatabase.Unreachable(requiredBy: required) }
            return false
        }
    }
}

/// The queue's rules on one table: each test has a table of its own, and passes every time (`now`)
/// explicitly, so nothing waits on the wall clock.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresQueueStoreTests {
    // MARK: Schema

    @Test func migrateTwiceAndFromFourTasksAtOnceIsSafe() async throws {
        try await PostgresTestDatabase.withClient { client in
            let tableName = PostgresTestDatabase.uniqueTableName()
            let store = try PostgresQueueStore(client: client, tableName: tableName)
            try await store.migrate()
            try await store.migrate()

            let concurrent = PostgresTestDatabase.uniqueTableName()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask { try await PostgresQueueStore(client: client, tableName: concurrent).migrate() }
                }
                try await group.waitForAll()
            }
            let versions = try await client.strings(PostgresQuery(unsafeSQL: "SELECT version::text FROM \"\(concurrent)_schema\""))
            #expect(versions == ["\(PostgresQueueStore.schemaVersion)"])
            let replica = try PostgresQueueStore(client: client, tableName: concurrent)
            let added = try await replica.add(entry(request()), limit: nil)
            #expect(try await replica.claim(upTo: 1, now: at(1), lease: .seconds(30)).map(\.entry.id) == [added.id])
            try await PostgresTestDatabase.drop(concurrent, on: client)
            try await PostgresTestDatabase.drop(tableName, on: client)
        }
    }

    @Test func aSchemaNewerThanTheCodeThrowsSchemaTooNewAndChangesNothing() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let schema = "\"\(store.tableName)_schema\""
            try await client.query(PostgresQuery(unsafeSQL: "UPDATE \(schema) SET version = 7"))
            await #expect(throws: PostgresQueueStoreError.schemaTooNew(found: 7, supported: PostgresQueueStore.schemaVersion)) {
                try await store.migrate()
            }
            #expect(try await client.strings(PostgresQuery(unsafeSQL: "SELECT version::text FROM \(schema)")) == ["7"])
        }
    }

    @Test(arguments: ["bad-name", "1queue", "", "queue\"; DROP TABLE x; --", "naïve", String(repeating: "q", count: 52)])
    func aTableNameThatIsNotAPlainIdentifierIsRefused(_ name: String) async throws {
        try await PostgresTestDatabase.withClient { client in
            #expect(throws: PostgresQueueStoreError.invalidTableName(name)) { try PostgresQueueStore(client: client, tableName: name) }
        }
    }

    // MARK: Order

    @Test func claimsGoByPriorityThenFIFO() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let a = try await store.add(entry(request("/a")), limit: nil)
            let b = try await store.add(entry(request("/b", priority: .high)), limit: nil)
            let c = try await store.add(entry(request("/c")), limit: nil)
            let d = try await store.add(entry(request("/d", priority: .critical)), limit: nil)
            let e = try await store.add(entry(request("/e", priority: .high)), limit: nil)
            #expect([a, b, c, d, e].map(\.sequence) == [a, b, c, d, e].map(\.sequence).sorted())
            let expected = [d, b, e, a, c].map(\.id)
            #expect(try await store.queuedEntries().map(\.id) == expected)
            let claimed = try await store.claim(upTo: 10, now: at(1), lease: .seconds(30))
            #expect(claimed.map(\.entry.id) == expected)
            #expect(claimed.map(\.entry.sequence) == [d, b, e, a, c].map(\.sequence))
            #expect(claimed.allSatisfy { $0.leaseEnds == at(31) })
            #expect(Set(claimed.map(\.token)).count == 5)
            #expect(try await store.claim(upTo: 10, now: at(2), lease: .seconds(30)).isEmpty)  // all leased
        }
    }

    @Test func claimTakesAtMostLimit() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            for index in 0..<5 { _ = try await store.add(entry(request("/\(index)")), limit: nil) }
            #expect(try await store.claim(upTo: 2, now: at(1), lease: .seconds(30)).count == 2)
            #expect(try await store.claim(upTo: 0, now: at(1), lease: .seconds(30)).isEmpty)
            #expect(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).count == 3)
        }
    }

    // MARK: Ordering keys

    @Test func oneEntryOfAnOrderingKeyIsInFlightAtATimeInOrder() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let first = try await store.add(entry(request("/1", orderingKey: "account-7")), limit: nil)
            let second = try await store.add(entry(request("/2", priority: .critical, orderingKey: "account-7")), limit: nil)
            let other = try await store.add(entry(request("/other")), limit: nil)

            let batch = try await store.claim(upTo: 10, now: at(1), lease: .seconds(30))
            #expect(batch.map(\.entry.id) == [first.id, other.id])  // the key's second waits, whatever its priority
            #expect(try await store.claim(upTo: 10, now: at(2), lease: .seconds(30)).isEmpty)

            try await store.complete(batch[0], reason: .delivered(statusCode: 200))
            #expect(try await store.claim(upTo: 10, now: at(3), lease: .seconds(30)).map(\.entry.id) == [second.id])
        }
    }

    @Test func aReleasedHeadWithBackoffKeepsTheRestOfItsKeyWaiting() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let first = try await store.add(entry(request("/1", orderingKey: "k")), limit: nil)
            let second = try await store.add(entry(request("/2", orderingKey: "k")), limit: nil)
            let claim = try #require(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).first)
            #expect(claim.entry.id == first.id)

            let failed = try claim.entry.afterFailedAttempt(nextAttemptAt: at(60))
            try await store.release(claim, keeping: failed)
            #expect(try await store.claim(upTo: 10, now: at(2), lease: .seconds(30)).isEmpty)  // neither is due
            #expect(try await store.earliestNextAttempt() == at(60))
            let stored = try #require(try await store.queuedEntry(id: first.id))
            #expect(stored.attempts == failed.attempts && stored.nextAttemptAt == at(60) && stored.lastError == "HTTP 503")
            #expect(stored.sequence == first.sequence)  // kept its place

            let retry = try await store.claim(upTo: 10, now: at(60), lease: .seconds(30))
            #expect(retry.map(\.entry.id) == [first.id])
            #expect(retry.first?.entry.attempts == failed.attempts)
            try await store.complete(try #require(retry.first), reason: .delivered(statusCode: 201))
            #expect(try await store.claim(upTo: 10, now: at(61), lease: .seconds(30)).map(\.entry.id) == [second.id])
        }
    }

    // MARK: Coalescing keys

    @Test func theNewestEditReplacesAnUnclaimedHolderInItsPlace() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let holder = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v1")), limit: nil)
            let other = try await store.add(entry(request("/other")), limit: nil)
            let edit = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v2")), limit: nil)

            #expect(edit.sequence == holder.sequence)
            #expect(try await store.queuedEntries().map(\.id) == [edit.id, other.id])
            #expect(try await store.queuedEntry(id: holder.id) == nil)
            #expect(try await store.queuedEntry(id: edit.id)?.body == Data("v2".utf8))
            #expect(try await store.hasQueuedEntries(orderingKey: nil, coalescingKey: "profile"))
        }
    }

    /// The change feed: once followed, it reads the table once (an entry another store added
    /// shows), then publishes this store's own changes — a coalesced edit replacing its holder in
    /// one step, a completion with its reason, a cancel.
    @Test func theChangeFeedStartsFromTheTableAndFollowsThisStoresChanges() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let before = try await PostgresQueueStore(client: client, tableName: store.tableName).add(entry(request("/before")), limit: nil)
            #expect(store.changeFeed.count == 0)  // nothing kept until followed: this read starts it
            while store.changeFeed.count < 1 { await Task.yield() }
            #expect(store.changeFeed.entries().map(\.id) == [before.id])

            var changes = store.changeFeed.changes.makeAsyncIterator()
            let holder = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v1")), limit: nil)
            let edit = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v2")), limit: nil)
            #expect(await changes.next() == .stored(holder, replacing: nil))
            #expect(await changes.next() == .stored(edit, replacing: holder.id))
            #expect(store.changeFeed.entries().map(\.id) == [before.id, edit.id])

            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            try await store.complete(claim, reason: .delivered(statusCode: 201))
            #expect(await changes.next() == .removed(claim.entry, reason: .delivered(statusCode: 201)))
            #expect(try await store.cancel(id: edit.id))
            #expect(await changes.next()?.entryID == edit.id)
            #expect(store.changeFeed.count == 0 && store.changeFeed.entries().isEmpty)
        }
    }

    @Test func anEntryQueuedAlreadyIsUpdatedInItsRowNeverMovedIntoAnotherHolders() async throws {
        // The newest row of the key (another entry, replaceable by the rules) must not take the id
        // of an entry that has a row of its own: `add` updates that row instead.
        try await PostgresTestDatabase.withStore { store, _ in
            let queued = try await store.add(entry(request("/profile", orderingKey: "a", coalescingKey: "profile", body: "v1")), limit: nil)
            let newest = try await store.add(entry(request("/profile", orderingKey: "b", coalescingKey: "profile", body: "v2")), limit: nil)
            #expect(newest.sequence > queued.sequence)  // another ordering key: behind, not in place

            let again = QueueEntry(request("/profile", orderingKey: "b", coalescingKey: "profile", body: "v3"), id: queued.id, enqueuedAt: t0)
            let stored = try await store.add(again, limit: nil)
            #expect(stored.sequence == queued.sequence)
            #expect(try await store.queuedEntries().map(\.id) == [queued.id, newest.id])
            #expect(try await store.queuedEntry(id: queued.id)?.body == Data("v3".utf8))
            #expect(try await store.queuedEntry(id: newest.id)?.body == Data("v2".utf8))
        }
    }

    @Test func anEditBesideAClaimedHolderWaitsUntilTheHolderIsGone() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let holder = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v1")), limit: nil)
            let claim = try #require(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).first)
            #expect(claim.entry.id == holder.id)

            let edit = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v2")), limit: nil)
            #expect(edit.sequence > holder.sequence)
            let newer = try await store.add(entry(request("/profile", coalescingKey: "profile", body: "v3")), limit: nil)
            #expect(newer.sequence == edit.sequence)  // the unclaimed edit is replaced; the holder stays
            #expect(try await store.queuedEntries().map(\.id) == [holder.id, newer.id])
            #expect(try await store.claim(upTo: 10, now: at(2), lease: .seconds(30)).isEmpty)

            try await store.complete(claim, reason: .delivered(statusCode: 200))
            let next = try await store.claim(upTo: 10, now: at(3), lease: .seconds(30))
            #expect(next.map(\.entry.id) == [newer.id])
            #expect(next.first?.entry.body == Data("v3".utf8))
        }
    }

    @Test func anEditOfAnotherOrderingKeyIsAddedBehindTheHolderNotInItsPlace() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let holder = try await store.add(entry(request("/a", orderingKey: "a", coalescingKey: "c", body: "v1")), limit: nil)
            let earlierOfB = try await store.add(entry(request("/b", orderingKey: "b")), limit: nil)
            // Taking the holder's place would put the edit ahead of key b's earlier entry.
            let edit = try await store.add(entry(request("/a", orderingKey: "b", coalescingKey: "c", body: "v2")), limit: nil)
            #expect(edit.sequence > earlierOfB.sequence)
            #expect(try await store.queuedEntries().map(\.id) == [holder.id, earlierOfB.id, edit.id])
            #expect(try await store.queuedEntry(id: holder.id)?.body == Data("v1".utf8))
            #expect(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).map(\.entry.id) == [holder.id, earlierOfB.id])

            // No ordering key beside a newest row with one: behind it too; the same (none): in place.
            let unordered = try await store.add(entry(request("/a", coalescingKey: "c", body: "v3")), limit: nil)
            #expect(unordered.sequence > edit.sequence)
            let newest = try await store.add(entry(request("/a", coalescingKey: "c", body: "v4")), limit: nil)
            #expect(newest.sequence == unordered.sequence)
            #expect(try await store.queuedEntries().map(\.id) == [holder.id, earlierOfB.id, edit.id, newest.id])
        }
    }

    @Test func anAddWithoutALimitTakesNoTableWideLock() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            // Another transaction holds the lock an add with a limit takes to count the table.
            let countLock = "\(store.tableName):count"
            let counting = try await OpenTransaction.begin(on: client) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\(countLock), 0))", logger: testLogger)
            }
            let unbounded = try await within(.seconds(10)) {
                try await store.add(entry(request("/nil")), limit: nil).id
            }
            let atIntMax = try await within(.seconds(10)) {
                try await store.add(entry(request("/max")), limit: .max).id
            }
            #expect(unbounded != nil, "add(limit: nil) waited for the count lock")
            #expect(atIntMax != nil, "add(limit: .max) waited for the count lock")

            // An add with a limit waits for it: it counts the whole table, every replica's rows.
            let bounded = Task { try await store.add(entry(request("/bounded")), limit: 10) }
            try await client.untilSomeoneWaits(forAdvisoryLock: countLock)
            try await counting.commit()
            _ = try await bounded.value
            #expect(try await store.queuedCount() == 3)
        }
    }

    @Test func addIsRefusedAtTheLimitButAReplacementIsNot() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            _ = try await store.add(entry(request("/1", coalescingKey: "c")), limit: 2)
            _ = try await store.add(entry(request("/2")), limit: 2)
            await #expect(throws: OfflineQueueError.full) { _ = try await store.add(entry(request("/3")), limit: 2) }
            let replacement = try await store.add(entry(request("/1", coalescingKey: "c")), limit: 2)
            #expect(try await store.queuedCount() == 2)
            #expect(try await store.queuedEntry(id: replacement.id) != nil)
        }
    }

    // MARK: Time to live

    @Test func anExpiredEntryIsNotClaimedAndRemoveExpiredSweepsIt() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let shortLived = try await store.add(entry(request("/short", ttl: 10)), limit: nil)
            let longLived = try await store.add(entry(request("/long", ttl: 1000)), limit: nil)
            #expect(try await store.claim(upTo: 10, now: at(11), lease: .seconds(5)).map(\.entry.id) == [longLived.id])

            let swept = try await store.removeExpired(now: at(11))
            #expect(swept.map(\.id) == [shortLived.id])
            #expect(try await store.queuedCount() == 1)
        }
    }

    @Test func aClaimedEntryIsSweptOnlyOnceItsLeaseRanOut() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let added = try await store.add(entry(request("/x", ttl: 10)), limit: nil)
            _ = try await store.claim(upTo: 1, now: at(1), lease: .seconds(30))  // leased until 31
            #expect(try await store.removeExpired(now: at(20)).isEmpty)
            #expect(try await store.removeExpired(now: at(31)).map(\.id) == [added.id])
            #expect(try await store.queuedCount() == 0)
        }
    }

    // MARK: Settling claims

    @Test func completeLeavesNoRowBehind() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            _ = try await store.add(entry(request()), limit: nil)
            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            try await store.complete(claim, reason: .delivered(statusCode: 204))
            #expect(try await client.integer(PostgresQuery(unsafeSQL: "SELECT count(*) FROM \"\(store.tableName)\"")) == 0)
            #expect(try await store.deadLetters().isEmpty)
        }
    }

    @Test func deadLetterMovesTheRow() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let added = try await store.add(entry(request("/doomed", body: "payload")), limit: nil)
            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            let final = try claim.entry.afterFailedAttempt(nextAttemptAt: nil, lastError: "HTTP 500")
            try await store.deadLetter(claim, entry: final)

            #expect(try await store.queuedCount() == 0)
            let dead = try await store.deadLetters()
            #expect(dead.map(\.id) == [added.id])
            #expect(dead.first?.attempts == final.attempts && dead.first?.lastError == "HTTP 500")
            #expect(dead.first?.sequence == added.sequence)
            #expect(try await client.integer(PostgresQuery(unsafeSQL: "SELECT count(*) FROM \"\(store.tableName)_dead_letter\"")) == 1)
        }
    }

    @Test func aStaleClaimChangesNothingAndThrowsClaimLost() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                let added = try await store.add(entry(request("/x", orderingKey: "k")), limit: nil)
                let stale = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(10)).first)
                #expect(try await replica.claim(upTo: 1, now: at(5), lease: .seconds(10)).isEmpty)  // the lease runs

                // The lease ran out: another replica claims the entry again.
                let live = try #require(try await replica.claim(upTo: 1, now: at(11), lease: .seconds(10)).first)
                #expect(live.entry.id == added.id && live.token != stale.token)
                let before = try await store.queuedEntries()

                await expectClaimLost(added.id) { try await store.complete(stale, reason: .delivered(statusCode: 200)) }
                await expectClaimLost(added.id) { try await store.release(stale, keeping: try stale.entry.afterFailedAttempt(nextAttemptAt: at(99))) }
                await expectClaimLost(added.id) { try await store.deadLetter(stale, entry: stale.entry) }
                await expectClaimLost(added.id) { _ = try await store.renew(stale, now: at(12), lease: .seconds(60)) }
                #expect(try await store.queuedEntries() == before)
                #expect(try await store.deadLetters().isEmpty)
                // The live claim still holds: its lease was not renewed by the stale one.
                #expect(try await store.claim(upTo: 1, now: at(22), lease: .seconds(10)).map(\.entry.id) == [added.id])

                // A cancelled entry's claim is lost too.
                let cancelled = try await store.add(entry(request("/y")), limit: nil)
                let claim = try #require(try await store.claim(upTo: 1, now: at(23), lease: .seconds(10)).first)
                #expect(claim.entry.id == cancelled.id)
                #expect(try await store.cancel(id: cancelled.id))
                #expect(try await !store.cancel(id: cancelled.id))
                await expectClaimLost(cancelled.id) { try await store.complete(claim, reason: .delivered(statusCode: 200)) }
            }
        }
    }

    @Test func renewExtendsTheLease() async throws {
        try await PostgresTestDatabase.withClient { otherClient in
            try await PostgresTestDatabase.withStore { store, _ in
                let replica = try PostgresQueueStore(client: otherClient, tableName: store.tableName)
                let added = try await store.add(entry(request()), limit: nil)
                let claim = try #require(try await store.claim(upTo: 1, now: at(0), lease: .seconds(10)).first)
                let renewed = try await store.renew(claim, now: at(5), lease: .seconds(10))
                #expect(renewed.leaseEnds == at(15) && renewed.token == claim.token)
                #expect(try await replica.claim(upTo: 1, now: at(12), lease: .seconds(10)).isEmpty)
                let reclaimed = try await replica.claim(upTo: 1, now: at(15), lease: .seconds(10))
                #expect(reclaimed.map(\.entry.id) == [added.id])
                await expectClaimLost(added.id) { _ = try await store.renew(renewed, now: at(16), lease: .seconds(10)) }
            }
        }
    }

    // MARK: The rest of the protocol

    @Test func cancelRemoveAllEarliestNextAttemptAndKeyLookups() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            #expect(try await store.earliestNextAttempt() == nil)
            #expect(try await !store.hasQueuedEntries(orderingKey: "o", coalescingKey: "c"))
            #expect(try await !store.hasQueuedEntries(orderingKey: nil, coalescingKey: nil))
            let ordered = try await store.add(entry(request("/o", orderingKey: "o")), limit: nil)
            _ = try await store.add(entry(request("/c", coalescingKey: "c")), limit: nil)
            #expect(try await store.hasQueuedEntries(orderingKey: "o", coalescingKey: nil))
            #expect(try await store.hasQueuedEntries(orderingKey: nil, coalescingKey: "c"))
            #expect(try await !store.hasQueuedEntries(orderingKey: "c", coalescingKey: "o"))

            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            #expect(claim.entry.id == ordered.id)
            try await store.release(claim, keeping: try claim.entry.afterFailedAttempt(nextAttemptAt: at(40)))
            #expect(try await store.earliestNextAttempt() == at(40))
            #expect(try await store.queuedCount() == 2)
            #expect(try await store.cancel(id: ordered.id))
            #expect(try await store.earliestNextAttempt() == nil)
            try await store.removeAll()
            #expect(try await store.queuedCount() == 0)
            #expect(try await store.queuedEntries().isEmpty)
        }
    }

    @Test func earliestNextAttemptCountsLeaseEndsAndLeavesFollowersOut() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            _ = try await store.add(entry(request("/head", orderingKey: "k")), limit: nil)
            // A follower of the key that was due long ago: it cannot go before its head.
            _ = try await store.add(try entry(request("/follower", orderingKey: "k")).afterFailedAttempt(nextAttemptAt: at(5)), limit: nil)
            #expect(try await store.earliestNextAttempt() == nil)  // the head is due now

            let claim = try #require(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).first)
            #expect(try await store.earliestNextAttempt() == at(31))  // when a dead holder's lease ends
            try await store.release(claim, keeping: try claim.entry.afterFailedAttempt(nextAttemptAt: at(60)))
            #expect(try await store.earliestNextAttempt() == at(60))
        }
    }

    @Test func theIdempotencyKeySurvivesEveryRoundTrip() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let added = try await store.add(entry(request(idempotencyKey: "order-42-charge")), limit: nil)
            #expect(try await store.queuedEntry(id: added.id)?.idempotencyKey == "order-42-charge")
            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            #expect(claim.entry.idempotencyKey == "order-42-charge")
            try await store.release(claim, keeping: try claim.entry.afterFailedAttempt(nextAttemptAt: nil))
            let again = try #require(try await store.claim(upTo: 1, now: at(2), lease: .seconds(30)).first)
            #expect(again.entry.idempotencyKey == "order-42-charge")
            #expect(again.entry.asURLRequest().value(forHTTPHeaderField: "Idempotency-Key") == "order-42-charge")
        }
    }

    @Test func anEntryRoundTripsWithInfiniteTimeoutAndTTL() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            var forever = request("/forever", ttl: .infinity)
            forever.timeout = .infinity
            let added = try await store.add(entry(forever), limit: nil)
            let stored = try #require(try await store.queuedEntry(id: added.id))
            #expect(stored == added)
            #expect(stored.timeout == .infinity && stored.ttl == .infinity)
            #expect(try await store.claim(upTo: 1, now: at(86_400 * 365), lease: .seconds(30)).map(\.entry.id) == [added.id])
        }
    }

    @Test func removeExpiredReturnsTheReadableRowsWhenOneIsUnreadable() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let broken = try await store.add(entry(request("/broken", ttl: 10)), limit: nil)
            let readable = try await store.add(entry(request("/readable", ttl: 10)), limit: nil)
            let alive = try await store.add(entry(request("/alive", ttl: 1000)), limit: nil)
            try await client.query(PostgresQuery(unsafeSQL: "UPDATE \"\(store.tableName)\" SET entry = '{\"id\": \"\(broken.id)\"}' WHERE id = '\(broken.id)'"))

            #expect(try await store.removeExpired(now: at(11)).map(\.id) == [readable.id])
            #expect(try await store.queuedEntries().map(\.id) == [alive.id])  // the unreadable one is gone too
        }
    }

    // MARK: Errors

    @Test func anUnreadableRowIsLeftOutOfClaimsWithoutStoppingTheOthers() async throws {
        try await PostgresTestDatabase.withStore { store, client in
            let broken = try await store.add(entry(request("/broken", priority: .critical)), limit: nil)
            let fine = try await store.add(entry(request("/fine")), limit: nil)
            try await client.query(PostgresQuery(unsafeSQL: "UPDATE \"\(store.tableName)\" SET entry = '{\"id\": \"\(broken.id)\"}' WHERE id = '\(broken.id)'"))

            #expect(try await store.claim(upTo: 10, now: at(1), lease: .seconds(30)).map(\.entry.id) == [fine.id])
            await #expect(throws: PostgresQueueStoreError.unreadableEntry(id: broken.id, reason: "its JSON is not a queue entry (DecodingError)")) {
                _ = try await store.queuedEntry(id: broken.id)
            }
        }
    }

    @Test func databaseErrorsAreTypedAndHoldNoValues() async throws {
        try await PostgresTestDatabase.withClient { client in
            let store = try PostgresQueueStore(client: client, tableName: PostgresTestDatabase.uniqueTableName("never_migrated"))
            let secret = "card-4111-1111-1111-1111"
            do {
                _ = try await store.add(entry(request("/charge", headers: ["X-Card": secret], body: secret, idempotencyKey: secret)), limit: nil)
                Issue.record("add to a table that does not exist succeeded")
            } catch let error as PostgresQueueStoreError {
                guard case .database(let operation, let sqlState, _) = error else {
                    Issue.record("unexpected error \(error)")
                    return
                }
                #expect(operation == "add" && sqlState == "42P01")  // undefined_table
                #expect(!String(describing: error).contains(secret))
                #expect(!String(reflecting: error).contains(secret))
            }
            await #expect(throws: PostgresQueueStoreError.self) { _ = try await store.claim(upTo: 1, now: at(1), lease: .seconds(1)) }
        }
    }
}
