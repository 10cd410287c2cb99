import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore

/// A `QueueStorage` in memory with real leases, standing in for storage many consumers share
/// (`PostgresQueueStore`): the engine's shared-storage path is tested against it with a manual
/// clock, and the same rule checks run against `DiskQueueStore` (`QueueStorageRuleTests`). Like
/// postgres-nio, which will not lease a connection to a cancelled task, it refuses every call
/// from a cancelled task with `CancellationError`. Its `changeFeed` follows every change, as
/// `QueueStorage` asks (OfflineFirst runs over it in `OfflineFirstStorageTests`).
package final class InMemoryQueueStorage: QueueStorage, Sendable {
    private struct Row: Sendable {
        var entry: QueueEntry
        var token: UUID?
        var leaseEnds: Date?
    }

    private struct State: Sendable {
        var rows: [UUID: Row] = [:]
        var nextSequence: UInt64 = 1
        var deadLetters: [QueueEntry] = []
        var renewals = 0
        var failRenewals = false
        var hangRenewals = false
        var renewalsToFail = 0
        var claimsToFail = 0
        var claimCalls = 0
    }

    private let state = Locked(State())
    private let arrivalSubscribers = StreamSubscribers<Void>()
    package let changeFeed = QueueChangeFeed()

    /// Whether engines also poll it (`QueueStorage.othersAddWork`): false makes it behave as a
    /// folder one engine owns, whose engine runs a pass only when an entry is due.
    package let othersAddWork: Bool

    package init(othersAddWork: Bool = true) {
        self.othersAddWork = othersAddWork
    }

    package var deadLetters: [QueueEntry] { state.withLock { $0.deadLetters } }
    package var renewals: Int { state.withLock { $0.renewals } }
    /// Makes every later renewal fail, as a database that went away would.
    package func failRenewals() { state.withLock { $0.failRenewals = true } }
    /// Makes the next `count` renewals fail.
    package func failNextRenewals(_ count: Int) { state.withLock { $0.renewalsToFail = count } }
    /// Makes the next `count` claims fail, as a disk that refuses would.
    package func failNextClaims(_ count: Int) { state.withLock { $0.claimsToFail = count } }
    /// Claims asked for so far, failed ones included.
    package var claimCalls: Int { state.withLock { $0.claimCalls } }
    /// Makes every later renewal hang until its task is cancelled, as a network gone silent would.
    package func hangRenewals() { state.withLock { $0.hangRenewals = true } }
    /// When `id`'s lease ends, if it is claimed.
    package func leaseEnds(of id: UUID) -> Date? { state.withLock { $0.rows[id]?.leaseEnds } }
    /// Tells engines following `arrivals()` that work was added (as a NOTIFY would).
    package func announceArrival() { arrivalSubscribers.yield(()) }

    nonisolated(nonsending) package func queuedEntries() async throws -> [QueueEntry] {
        try Task.checkCancellation()
        return state.withLock { Self.ordered($0.rows.values.map(\.entry)) }
    }

    nonisolated(nonsending) package func queuedCount() async throws -> Int {
        try Task.checkCancellation()
        return state.withLock { $0.rows.count }
    }

    nonisolated(nonsending) package func queuedEntry(id: UUID) async throws -> QueueEntry? {
        try Task.checkCancellation()
        return state.withLock { $0.rows[id]?.entry }
    }

    nonisolated(nonsending) package func hasQueuedEntries(orderingKey: String?, coalescingKey: String?) async throws -> Bool {
        state.withLock { state in
            state.rows.values.contains { row in
                (orderingKey != nil && row.entry.orderingKey == orderingKey)
                    || (coalescingKey != nil && row.entry.coalescingKey == coalescingKey)
            }
        }
    }

    nonisolated(nonsending) package func add(_ entry: QueueEntry, limit: Int?) async throws -> QueueEntry {
        try Task.checkCancellation()
        return try state.withLock { state in
            let holder = entry.coalescingKey.flatMap { key in
                state.rows.values.filter { $0.entry.coalescingKey == key }.max { $0.entry.sequence < $1.entry.sequence }
                    .flatMap { $0.token == nil && $0.entry.orderingKey == entry.orderingKey ? $0.entry : nil }
            }
            if holder == nil, let limit, state.rows.count >= limit { throw OfflineQueueError.full }
            let sequence: UInt64
            if let holder {
                state.rows[holder.id] = nil
                sequence = holder.sequence
            } else {
                sequence = state.nextSequence
                state.nextSequence += 1
            }
            let stored = (holder.map { entry.replacing($0) } ?? entry).withStorableHeaders().placed(at: sequence)
            let wasQueued = state.rows[stored.id] != nil
            state.rows[stored.id] = Row(entry: stored)
            changeFeed.publish(wasQueued ? .updated(stored) : .stored(stored, replacing: holder?.id))
            return stored
        }
    }

    nonisolated(nonsending) package func claim(upTo limit: Int, now: Date, lease: Duration) async throws -> [QueueClaim] {
        try Task.checkCancellation()
        let fails = state.withLock { state -> Bool in
            state.claimCalls += 1
            guard state.claimsToFail > 0 else { return false }
            state.claimsToFail -= 1
            return true
        }
        if fails { throw OfflineQueueError.storage(operation: "claim", path: "memory", errno: EIO) }
        return state.withLock { state in
            let all = Self.ordered(state.rows.values.map(\.entry))
            var claimed: [QueueClaim] = []
            for entry in all where claimed.count < limit {
                let row = state.rows[entry.id]!
                if row.token != nil, let ends = row.leaseEnds, ends > now { continue }
                guard !entry.isExpired(at: now), (entry.nextAttemptAt ?? now) <= now else { continue }
                let earlier = all.contains { other in
                    other.sequence < entry.sequence
                        && ((entry.orderingKey != nil && other.orderingKey == entry.orderingKey)
                            || (entry.coalescingKey != nil && other.coalescingKey == entry.coalescingKey))
                }
                if earlier { continue }
                let token = UUID()
                let ends = now.addingTimeInterval(lease.seconds)
                state.rows[entry.id] = Row(entry: entry, token: token, leaseEnds: ends)
                claimed.append(QueueClaim(entry: entry, token: token, leaseEnds: ends))
            }
            return claimed
        }
    }

    nonisolated(nonsending) package func renew(_ claim: QueueClaim, now: Date, lease: Duration) async throws -> QueueClaim {
        try Task.checkCancellation()
        if state.withLock({ $0.hangRenewals }) {
            state.withLock { $0.renewals += 1 }
            let (never, continuation) = AsyncStream<Void>.makeStream()
            for await _ in never {}  // ends only when the renewal's task is cancelled
            withExtendedLifetime(continuation) {}
            throw CancellationError()
        }
        return try state.withLock { state in
            state.renewals += 1
            let fails = state.failRenewals || state.renewalsToFail > 0
            state.renewalsToFail = max(0, state.renewalsToFail - 1)
            guard !fails else { throw OfflineQueueError.storage(operation: "renew", path: "memory", errno: EIO) }
            try Self.checkLive(claim, in: state)
            let ends = now.addingTimeInterval(lease.seconds)
            state.rows[claim.entry.id]?.leaseEnds = ends
            return QueueClaim(entry: claim.entry, token: claim.token, leaseEnds: ends)
        }
    }

    nonisolated(nonsending) package func complete(_ claim: QueueClaim, reason: QueueRemovalReason) async throws {
        try Task.checkCancellation()
        try state.withLock { state in
            try Self.checkLive(claim, in: state)
            state.rows[claim.entry.id] = nil
            changeFeed.publish(.removed(claim.entry, reason: reason))
        }
    }

    nonisolated(nonsending) package func release(_ claim: QueueClaim, keeping entry: QueueEntry) async throws {
        try Task.checkCancellation()
        try state.withLock { state in
            try Self.checkLive(claim, in: state)
            let kept = entry.placed(at: claim.entry.sequence)
            state.rows[claim.entry.id] = Row(entry: kept)
            if kept != claim.entry { changeFeed.publish(.updated(kept)) }
        }
    }

    nonisolated(nonsending) package func deadLetter(_ claim: QueueClaim, entry: QueueEntry) async throws {
        try Task.checkCancellation()
        try state.withLock { state in
            try Self.checkLive(claim, in: state)
            state.rows[claim.entry.id] = nil
            state.deadLetters.append(entry)
            changeFeed.publish(.removed(entry, reason: .deadLettered(attempts: entry.attempts)))
        }
    }

    nonisolated(nonsending) package func cancel(id: UUID) async throws -> Bool {
        state.withLock { state in
            guard let removed = state.rows.removeValue(forKey: id) else { return false }
            changeFeed.publish(.removed(removed.entry, reason: .cancelled))
            return true
        }
    }

    nonisolated(nonsending) package func removeAll() async throws {
        state.withLock { state in
            for entry in Self.ordered(state.rows.values.map(\.entry)) { changeFeed.publish(.removed(entry, reason: .cancelled)) }
            state.rows = [:]
        }
    }

    nonisolated(nonsending) package func removeExpired(now: Date) async throws -> [QueueEntry] {
        try Task.checkCancellation()
        return state.withLock { state in
            let expired = state.rows.values.filter { $0.entry.isExpired(at: now) && ($0.token == nil || ($0.leaseEnds ?? now) <= now) }.map(\.entry)
            for entry in Self.ordered(expired) {
                state.rows[entry.id] = nil
                changeFeed.publish(.removed(entry, reason: .expired))
            }
            return Self.ordered(expired)
        }
    }

    /// The earliest backoff's end among the entries `claim` may offer: the first of each ordering
    /// and coalescing key (as `PostgresQueueStore` answers).
    nonisolated(nonsending) package func earliestNextAttempt() async throws -> Date? {
        state.withLock { state in
            let entries = state.rows.values.map(\.entry)
            return entries.filter { entry in
                !entries.contains { other in
                    other.sequence < entry.sequence
                        && ((entry.orderingKey != nil && other.orderingKey == entry.orderingKey)
                            || (entry.coalescingKey != nil && other.coalescingKey == entry.coalescingKey))
                }
            }.compactMap(\.nextAttemptAt).min()
        }
    }

    package func arrivals() -> AsyncStream<Void> { arrivalSubscribers.stream() }

    private static func ordered(_ entries: [QueueEntry]) -> [QueueEntry] {
        entries.sorted { ($0.priority, UInt64.max - $0.sequence) > ($1.priority, UInt64.max - $1.sequence) }
    }

    private static func checkLive(_ claim: QueueClaim, in state: State) throws {
        guard let row = state.rows[claim.entry.id], row.token == claim.token else {
            throw OfflineQueueError.claimLost(id: claim.entry.id)
        }
    }
}
