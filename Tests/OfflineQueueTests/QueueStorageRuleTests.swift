import Foundation
import ResilienceTestSupport
import Testing

@testable import OfflineQueue

/// The rules `QueueStorage` states, checked on `DiskQueueStore` (its conformance: claims in memory,
/// no lease) and on `InMemoryQueueStorage` (the leases the shared-storage engine tests rely on).
/// `PostgresQueueStore` has its own checks against a real PostgreSQL in the Integrations package.
@Suite("QueueStorage rules: claim order, one in flight per key, newest edit, stale claims")
struct QueueStorageRuleTests {
    enum Kind: String, CaseIterable, CustomTestStringConvertible {
        case disk, memory
        var testDescription: String { rawValue }
    }

    /// The storage, and what keeps its folder alive.
    private static func make(_ kind: Kind) throws -> (any QueueStorage, TemporaryDirectory?) {
        switch kind {
        case .disk:
            let directory = TemporaryDirectory()
            return (try DiskQueueStore(directory: directory.url), directory)
        case .memory:
            return (InMemoryQueueStorage(), nil)
        }
    }

    private static let now = Date(timeIntervalSince1970: 1_000_000)

    private static func entry(
        _ path: String, priority: QueuePriority = .normal, orderingKey: String? = nil, coalescingKey: String? = nil, ttl: TimeInterval = 86_400
    ) -> QueueEntry {
        var request = Mutation(path, priority: priority)
        request.orderingKey = orderingKey
        request.coalescingKey = coalescingKey
        request.ttl = ttl
        return QueueEntry(request, enqueuedAt: now)
    }

    private static func paths(_ claims: [QueueClaim]) -> [String] { claims.map(\.entry.url.path) }

    @Test(arguments: Kind.allCases)
    func claimsComeByPriorityThenFirstInFirstOut(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        for (path, priority) in [("/high", QueuePriority.high), ("/n1", .normal), ("/critical", .critical), ("/n2", .normal)] {
            _ = try await storage.add(Self.entry(path, priority: priority), limit: nil)
        }
        let claims = try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30))
        #expect(Self.paths(claims) == ["/critical", "/high", "/n1", "/n2"])
        #expect(try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30)).isEmpty)  // all held
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func anOrderingKeysNextEntryWaitsUntilTheOneBeforeItIsGone(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        for path in ["/k1", "/k2"] { _ = try await storage.add(Self.entry(path, orderingKey: "k"), limit: nil) }
        _ = try await storage.add(Self.entry("/free"), limit: nil)
        let first = try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30))
        #expect(Self.paths(first) == ["/k1", "/free"])
        try await storage.complete(first[1], reason: .delivered(statusCode: 201))
        // Kept for a later attempt: the rest of its key still waits.
        var kept = first[0].entry
        kept.nextAttemptAt = Self.now.addingTimeInterval(60)
        try await storage.release(first[0], keeping: kept)
        #expect(try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30)).isEmpty)
        // Its backoff over, it goes first again; delivered, its successor may go.
        let again = try await storage.claim(upTo: 10, now: Self.now.addingTimeInterval(60), lease: .seconds(30))
        #expect(Self.paths(again) == ["/k1"])
        try await storage.complete(again[0], reason: .delivered(statusCode: 201))
        let next = try await storage.claim(upTo: 10, now: Self.now.addingTimeInterval(60), lease: .seconds(30))
        #expect(Self.paths(next) == ["/k2"])
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func aNewEditReplacesAnUnclaimedHolderInPlaceAndWaitsBehindAClaimedOne(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        let holder = try await storage.add(Self.entry("/v1", coalescingKey: "doc"), limit: nil)
        _ = try await storage.add(Self.entry("/other"), limit: nil)
        let v2 = try await storage.add(Self.entry("/v2", coalescingKey: "doc"), limit: nil)
        #expect(v2.sequence == holder.sequence)  // in the holder's place
        #expect(try await storage.queuedEntries().map(\.url.path) == ["/v2", "/other"])

        let claimed = try await storage.claim(upTo: 1, now: Self.now, lease: .seconds(30))
        #expect(Self.paths(claimed) == ["/v2"])
        _ = try await storage.add(Self.entry("/v3", coalescingKey: "doc"), limit: nil)  // beside the claimed edit
        #expect(try await storage.queuedCount() == 3)
        let meanwhile = try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30))
        #expect(Self.paths(meanwhile) == ["/other"])
        try await storage.complete(claimed[0], reason: .delivered(statusCode: 200))
        #expect(Self.paths(try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(30))) == ["/v3"])
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func anEditOfAnotherOrderingKeyIsQueuedBehindTheHolderRatherThanJumpingItsNewKeysLine(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        _ = try await storage.add(Self.entry("/b1", orderingKey: "b"), limit: nil)
        _ = try await storage.add(Self.entry("/v1", orderingKey: "a", coalescingKey: "doc"), limit: nil)
        let v2 = try await storage.add(Self.entry("/v2", orderingKey: "b", coalescingKey: "doc"), limit: nil)
        #expect(try await storage.queuedCount() == 3)  // stored behind, not in /v1's place
        let first = try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(3600))
        #expect(Self.paths(first) == ["/b1", "/v1"])  // /v2 waits behind /b1 (its key) and /v1 (its edit)
        for claim in first { try await storage.complete(claim, reason: .delivered(statusCode: 200)) }
        #expect(try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(3600)).map(\.entry.id) == [v2.id])
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func aClaimOnACancelledEntryIsLostAndItsSettlementChangesNothing(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        let stored = try await storage.add(Self.entry("/a"), limit: nil)
        let claim = try #require(try await storage.claim(upTo: 1, now: Self.now, lease: .seconds(30)).first)
        #expect(try await storage.cancel(id: stored.id))
        await #expect(throws: OfflineQueueError.claimLost(id: stored.id)) {
            try await storage.release(claim, keeping: claim.entry)
        }
        await #expect(throws: OfflineQueueError.claimLost(id: stored.id)) {
            try await storage.complete(claim, reason: .delivered(statusCode: 200))
        }
        #expect(try await storage.queuedCount() == 0)
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func expiredAndNotYetDueEntriesAreNotClaimedAndTheSweepLeavesClaimedOnes(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        let short = try await storage.add(Self.entry("/short", ttl: 10), limit: nil)
        let held = try await storage.add(Self.entry("/held", ttl: 10), limit: nil)
        let claims = try await storage.claim(upTo: 10, now: Self.now, lease: .seconds(3600))
        #expect(claims.map(\.entry.id) == [short.id, held.id])
        try await storage.release(claims[0], keeping: claims[0].entry)  // /held stays claimed
        let claim = claims[1]
        let later = Self.now.addingTimeInterval(11)
        #expect(try await storage.claim(upTo: 10, now: later, lease: .seconds(30)).isEmpty)
        #expect(try await storage.removeExpired(now: later).map(\.id) == [short.id])
        try await storage.complete(claim, reason: .expired)
        #expect(try await storage.queuedCount() == 0)
        withExtendedLifetime(folder) {}
    }

    /// The engine's timer on shared storage runs a pass at `earliestNextAttempt`: an edit waiting
    /// behind an earlier one of its coalescing key cannot be claimed before it, so its own date
    /// must not count (counted, it fired passes that could claim nothing).
    ///
    /// `DiskQueueStore` does not keep the older edit at all: released while a newer edit waits
    /// behind it, it is removed as superseded (the release throws `claimLost`), and the newer edit
    /// is the key's head, due at its own time.
    @Test(arguments: Kind.allCases)
    func theNextAttemptLeavesOutEditsWaitingBehindAnEarlierOneOfTheirKey(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        _ = try await storage.add(Self.entry("/v1", coalescingKey: "doc"), limit: nil)
        let held = try #require(try await storage.claim(upTo: 1, now: Self.now, lease: .seconds(30)).first)
        // A newer edit while v1 is in flight: stored beside it, with a backoff of its own.
        var newer = Self.entry("/v2", coalescingKey: "doc")
        newer.nextAttemptAt = Self.now.addingTimeInterval(10)
        _ = try await storage.add(newer, limit: nil)
        var kept = held.entry
        kept.nextAttemptAt = Self.now.addingTimeInterval(60)
        if kind == .disk {
            await #expect(throws: OfflineQueueError.claimLost(id: held.entry.id)) { try await storage.release(held, keeping: kept) }
            #expect(try await storage.queuedEntries().map(\.url.path) == ["/v2"])
            #expect(try await storage.earliestNextAttempt() == Self.now.addingTimeInterval(10))
        } else {
            try await storage.release(held, keeping: kept)
            #expect(try await storage.queuedEntries().count == 2)
            #expect(try await storage.claim(upTo: 10, now: Self.now.addingTimeInterval(10), lease: .seconds(30)).isEmpty)
            #expect(try await storage.earliestNextAttempt() == Self.now.addingTimeInterval(60))
        }
        withExtendedLifetime(folder) {}
    }

    @Test(arguments: Kind.allCases)
    func theLimitCountsQueuedEntriesButNotAReplacement(kind: Kind) async throws {
        let (storage, folder) = try Self.make(kind)
        _ = try await storage.add(Self.entry("/a", coalescingKey: "doc"), limit: 1)
        await #expect(throws: OfflineQueueError.full) { try await storage.add(Self.entry("/b"), limit: 1) }
        _ = try await storage.add(Self.entry("/a2", coalescingKey: "doc"), limit: 1)
        #expect(try await storage.queuedEntries().map(\.url.path) == ["/a2"])
        withExtendedLifetime(folder) {}
    }
}
