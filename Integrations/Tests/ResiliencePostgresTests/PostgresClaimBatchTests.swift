import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import Testing

/// Settlements (completions, releases, dead letters) of claims in flight at once share one
/// statement, and so do their renewals (`ClaimBatcher`). The window is set to a minute here, so a
/// batch closes only when no claim of the store is left out to join it (or it is full): whatever
/// the tests see happened without a timer.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresClaimBatchTests {
    static let patient = PostgresQueueStore.Configuration(completionWindow: .seconds(60))

    static func withStore<Result: Sendable>(
        _ configuration: PostgresQueueStore.Configuration = patient, _ body: (PostgresQueueStore, PostgresClient) async throws -> Result
    ) async throws -> Result {
        try await PostgresTestDatabase.withClient { client in
            try await PostgresTestDatabase.withStore(on: client, label: "batch", configuration: configuration) { store in
                try await body(store, client)
            }
        }
    }

    @Test func completionsOfClaimsInFlightTogetherAreOneStatement() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<8 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 8, now: at(1), lease: .seconds(30))
            #expect(claims.count == 8)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for claim in claims { group.addTask { try await store.complete(claim, reason: .delivered(statusCode: 201)) } }
                try await group.waitForAll()
            }
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aLoneClaimIsCompletedAtOnceWithoutWaitingForTheWindow() async throws {
        try await Self.withStore { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            _ = try await store.add(entry(request("/b")), limit: nil)
            for expected in [1, 2] {
                let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
                try await store.complete(claim, reason: .delivered(statusCode: 201))  // a minute's window would fail the time limit
                #expect(store.settlementStatements == expected)
            }
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aLostClaimInABatchThrowsClaimLostAndTheOthersAreCompleted() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<3 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 3, now: at(1), lease: .seconds(30))
            #expect(try await store.cancel(id: claims[1].entry.id))  // its claim is lost
            let outcomes = try await Self.outcomes(of: claims) { try await store.complete($0, reason: .delivered(statusCode: 201)) }
            #expect(outcomes == [claims[0].entry.id: true, claims[1].entry.id: false, claims[2].entry.id: true])
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aCompletionDoesNotWaitForAClaimThatIsReleased() async throws {
        try await Self.withStore { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            _ = try await store.add(entry(request("/b")), limit: nil)
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            // Whichever comes first, the completion does not wait out the minute's window for a
            // claim that was handed back.
            async let completing: Void = store.complete(claims[0], reason: .delivered(statusCode: 201))
            try await store.release(claims[1], keeping: claims[1].entry)
            try await completing
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedEntries().map(\.id) == [claims[1].entry.id])
        }
    }

    @Test func aClaimWhoseLeaseEndedIsNotWaitedFor() async throws {
        try await Self.withStore { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            _ = try await store.add(entry(request("/b")), limit: nil)
            // Leases that ended half a minute ago by the wall clock: their consumer may have let
            // them go without a word (an engine does, with a lease it could not keep).
            let claims = try await store.claim(upTo: 2, now: Date().addingTimeInterval(-60), lease: .seconds(30))
            #expect(claims.count == 2)
            try await store.complete(claims[0], reason: .delivered(statusCode: 201))  // not the minute's window
            #expect(store.settlementStatements == 1)
        }
    }

    @Test func theWindowClosesABatchWhenOtherClaimsStayOut() async throws {
        try await Self.withStore(.init(completionWindow: .milliseconds(1))) { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            _ = try await store.add(entry(request("/b")), limit: nil)
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            // The other claim is never settled: the completion goes when its window ends.
            try await store.complete(claims[0], reason: .delivered(statusCode: 201))
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedEntries().map(\.id) == [claims[1].entry.id])
        }
    }

    // MARK: Releases and dead letters

    @Test func releasesAndDeadLettersShareOneStatementWithTheCompletions() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<6 { _ = try await store.add(entry(request("/n\(index)", body: "payload \(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 6, now: at(1), lease: .seconds(30))
            #expect(claims.count == 6)
            let released = try claims[2...3].map { try $0.entry.afterFailedAttempt(nextAttemptAt: at(100), lastError: "HTTP 503") }
            let buried = try claims[4...5].map { try $0.entry.afterFailedAttempt(nextAttemptAt: nil, lastError: "HTTP 500") }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for claim in claims[0...1] { group.addTask { try await store.complete(claim, reason: .delivered(statusCode: 201)) } }
                for (claim, kept) in zip(claims[2...3], released) { group.addTask { try await store.release(claim, keeping: kept) } }
                for (claim, final) in zip(claims[4...5], buried) { group.addTask { try await store.deadLetter(claim, entry: final) } }
                try await group.waitForAll()
            }
            #expect(store.settlementStatements == 1)

            let queued = try await store.queuedEntries()
            #expect(queued.map(\.id) == released.map(\.id))
            #expect(queued.map(\.attempts) == [1, 1] && queued.allSatisfy { $0.lastError == "HTTP 503" && $0.nextAttemptAt == at(100) })
            #expect(queued.map(\.sequence) == claims[2...3].map(\.entry.sequence))  // released in place
            let dead = try await store.deadLetters()
            #expect(Set(dead.map(\.id)) == Set(buried.map(\.id)))
            #expect(dead.allSatisfy { $0.attempts == 1 && $0.lastError == "HTTP 500" })
            #expect(Set(dead.map(\.sequence)) == Set(claims[4...5].map(\.entry.sequence)))

            // Released rows are unleased, and due when their entries say.
            #expect(try await store.claim(upTo: 6, now: at(50), lease: .seconds(30)).isEmpty)
            #expect(try await store.claim(upTo: 6, now: at(101), lease: .seconds(30)).map(\.entry.id) == released.map(\.id))
        }
    }

    @Test func aBatchedReleaseWithoutANextAttemptIsDueAtOnce() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<2 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            async let first: Void = store.release(claims[0], keeping: try claims[0].entry.afterFailedAttempt(nextAttemptAt: nil))
            try await store.release(claims[1], keeping: try claims[1].entry.afterFailedAttempt(nextAttemptAt: at(100)))
            try await first
            #expect(store.settlementStatements == 1)
            #expect(try await store.claim(upTo: 2, now: at(2), lease: .seconds(30)).map(\.entry.id) == [claims[0].entry.id])
        }
    }

    @Test func aSecondSettlementOfOneClaimInABatchFindsItLost() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<2 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            // Two settlements of the first claim: whichever joins the batch first is made, the other
            // finds the claim lost (at once when it is in the batch being formed, else from the
            // row), as the second of two statements would.
            async let completed = Self.succeeds { try await store.complete(claims[0], reason: .delivered(statusCode: 201)) }
            async let released = Self.succeeds { try await store.release(claims[0], keeping: claims[0].entry) }
            try await store.complete(claims[1], reason: .delivered(statusCode: 201))
            let outcomes = [try await completed, try await released]
            #expect(outcomes.filter { $0 }.count == 1)
            #expect(store.settlementStatements <= 2)
            #expect(try await store.queuedEntries().map(\.id) == (outcomes[1] ? [claims[0].entry.id] : []))
        }
    }

    /// Runs `body` on every claim at once: whether each succeeded (by entry id), a lost claim
    /// being `false` (and lost under its own id); anything else is thrown.
    static func outcomes(of claims: [QueueClaim], _ body: @escaping @Sendable (QueueClaim) async throws -> Void) async throws -> [UUID: Bool] {
        try await withThrowingTaskGroup(of: (UUID, Bool).self) { group in
            for claim in claims {
                group.addTask {
                    do {
                        try await body(claim)
                        return (claim.entry.id, true)
                    } catch OfflineQueueError.claimLost(let id) {
                        #expect(id == claim.entry.id)
                        return (claim.entry.id, false)
                    }
                }
            }
            return try await group.reduce(into: [UUID: Bool]()) { $0[$1.0] = $1.1 }
        }
    }

    /// Whether `body` succeeded; a lost claim is `false`, anything else is thrown.
    static func succeeds(_ body: () async throws -> Void) async throws -> Bool {
        do {
            try await body()
            return true
        } catch OfflineQueueError.claimLost {
            return false
        }
    }

    // MARK: Renewals

    @Test func renewalsOfClaimsTakenTogetherAreOneStatement() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<4 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 4, now: at(1), lease: .seconds(30))  // leases end at 31
            let renewed = try await withThrowingTaskGroup(of: QueueClaim.self) { group in
                for claim in claims { group.addTask { try await store.renew(claim, now: at(20), lease: .seconds(30)) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(store.renewalStatements == 1)
            #expect(renewed.allSatisfy { $0.leaseEnds == at(50) })
            #expect(try await store.claim(upTo: 4, now: at(40), lease: .seconds(30)).isEmpty)  // still leased
            #expect(try await store.claim(upTo: 4, now: at(51), lease: .seconds(30)).count == 4)
        }
    }

    @Test func aLostClaimInABatchOfRenewalsThrowsClaimLostAndTheOthersAreRenewed() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<3 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 3, now: at(1), lease: .seconds(30))
            #expect(try await store.cancel(id: claims[1].entry.id))  // its claim is lost
            let outcomes = try await Self.outcomes(of: claims) { _ = try await store.renew($0, now: at(20), lease: .seconds(30)) }
            #expect(outcomes == [claims[0].entry.id: true, claims[1].entry.id: false, claims[2].entry.id: true])
            #expect(store.renewalStatements == 1)
            // The lost claim is no longer waited for: the others' completions close their batch.
            async let first: Void = store.complete(claims[0], reason: .delivered(statusCode: 201))
            try await store.complete(claims[2], reason: .delivered(statusCode: 201))
            try await first
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aRenewalOfTheOnlyClaimOutGoesAtOnce() async throws {
        try await Self.withStore { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
            _ = try await store.renew(claim, now: at(20), lease: .seconds(30))  // a minute's window would fail the time limit
            #expect(store.renewalStatements == 1)
        }
    }

    @Test func aRenewalDoesNotWaitForAClaimThatIsSettledMeanwhile() async throws {
        // A window longer than the suite's time limit: waiting it out fails the test.
        try await Self.withStore(.init(completionWindow: .seconds(600))) { store, _ in
            for index in 0..<2 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            // The renewal waits for the other claim (it might renew too) until that one is
            // settled; the release waits for the renewed claim's settlement.
            async let renewed = store.renew(claims[0], now: at(20), lease: .seconds(30))
            async let released: Void = store.release(claims[1], keeping: claims[1].entry)
            #expect(try await renewed.leaseEnds == at(50))
            try await store.complete(claims[0], reason: .delivered(statusCode: 201))
            try await released
            #expect(store.renewalStatements == 1)
            #expect(store.settlementStatements == 1)
            #expect(try await store.queuedEntries().map(\.id) == [claims[1].entry.id])
        }
    }

    @Test func aRenewalGoesWhenItsWindowEndsWhileOtherClaimsAreNotRenewing() async throws {
        try await Self.withStore(.init(completionWindow: .milliseconds(1))) { store, _ in
            for index in 0..<2 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            let renewed = try await store.renew(claims[0], now: at(20), lease: .seconds(30))
            #expect(renewed.leaseEnds == at(50))
            #expect(store.renewalStatements == 1)
        }
    }
}
