import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import Testing

/// Completions of claims in flight at once share one statement (`CompletionBatcher`). The window is
/// set to a minute here, so a batch closes only when no claim of the store is left out (or it is
/// full): whatever the tests see happened without a timer.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresCompletionBatchTests {
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
            #expect(store.completionStatements == 1)
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
                #expect(store.completionStatements == expected)
            }
            #expect(try await store.queuedCount() == 0)
        }
    }

    @Test func aLostClaimInABatchThrowsClaimLostAndTheOthersAreCompleted() async throws {
        try await Self.withStore { store, _ in
            for index in 0..<3 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
            let claims = try await store.claim(upTo: 3, now: at(1), lease: .seconds(30))
            #expect(try await store.cancel(id: claims[1].entry.id))  // its claim is lost
            let outcomes = try await withThrowingTaskGroup(of: (UUID, Bool).self) { group in
                for claim in claims {
                    group.addTask {
                        do {
                            try await store.complete(claim, reason: .delivered(statusCode: 201))
                            return (claim.entry.id, true)
                        } catch OfflineQueueError.claimLost(let id) {
                            #expect(id == claim.entry.id)
                            return (claim.entry.id, false)
                        }
                    }
                }
                return try await group.reduce(into: [UUID: Bool]()) { $0[$1.0] = $1.1 }
            }
            #expect(outcomes == [claims[0].entry.id: true, claims[1].entry.id: false, claims[2].entry.id: true])
            #expect(store.completionStatements == 1)
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
            #expect(store.completionStatements == 1)
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
            #expect(store.completionStatements == 1)
        }
    }

    @Test func theWindowClosesABatchWhenOtherClaimsStayOut() async throws {
        try await Self.withStore(.init(completionWindow: .milliseconds(1))) { store, _ in
            _ = try await store.add(entry(request("/a")), limit: nil)
            _ = try await store.add(entry(request("/b")), limit: nil)
            let claims = try await store.claim(upTo: 2, now: at(1), lease: .seconds(30))
            // The other claim is never settled: the completion goes when its window ends.
            try await store.complete(claims[0], reason: .delivered(statusCode: 201))
            #expect(store.completionStatements == 1)
            #expect(try await store.queuedEntries().map(\.id) == [claims[1].entry.id])
        }
    }
}
