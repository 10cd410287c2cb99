import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import Synchronization

/// A statement on one claim's row that can share a statement with others of its kind.
protocol BatchedClaimChange: Sendable {
    /// The row's id.
    var id: UUID { get }
    /// The lease token of the claim the change is for.
    var token: UUID { get }
    /// Whether the change settles the claim (a completion, release or dead letter): a settled
    /// claim is no longer out, so no batch waits for it.
    static var settlesClaim: Bool { get }
    /// The batch of this kind in the batcher's state.
    static var batch: WritableKeyPath<ClaimBatcher.State, ClaimBatcher.Batch<Self>> { get }
    /// The operation a failure of the statement is reported for.
    static var operation: String { get }
    /// Runs the statement for a batch of these changes; returns the claims whose rows it changed.
    static func run(_ batch: [Self], on store: PostgresQueueStore) async throws -> Set<ClaimKey>
}

/// Changes to claims gathered into one statement (River's batch completer, graphile-worker's
/// batched completes): a change joins the batch of its kind being formed and waits for its
/// statement. There are two kinds of batch: settlements (completions, releases and dead letters,
/// one statement whatever the mix) and lease renewals.
///
/// A batch is sent at once when no claim this store has out (with a lease not yet ended) could
/// still join it: for settlements, when every claim out is in it; for renewals, when every claim
/// out has a renewal in it. Otherwise when it holds `maximumBatch` changes, or `window` after its
/// first change — whichever comes first. So a queue with 64 entries in flight settles several rows
/// per round trip, and one with a single entry in flight settles its row at once, in the caller's
/// task, as it would alone.
final class ClaimBatcher: Sendable {
    /// A change waiting for its batch's statement.
    struct Waiting<Change: BatchedClaimChange>: Sendable {
        let change: Change
        let done: CheckedContinuation<Bool, any Error>
    }

    /// What to do with a change.
    enum Step<Change: BatchedClaimChange>: Sendable {
        /// Run the statement now, in the caller's task, for this change and these waiting ones.
        case runNow(with: [Waiting<Change>])
        /// A settlement of a claim that has one in the batch being formed already (a
        /// consumer's bug): it finds the claim lost, as the second of two statements would.
        case lost
        /// Wait in the batch being formed.
        case join
    }

    /// What to do once a waiting change joined.
    enum Joined<Change: BatchedClaimChange>: Sendable {
        case send([Waiting<Change>])
        case armTimer
        case wait
    }

    struct Batch<Change: BatchedClaimChange> {
        var waiting: [Waiting<Change>] = []
        /// The claims of changes told to join that have not joined yet: the batch does not close
        /// without them (it waits a few instructions), and a second settlement of one of them
        /// finds its claim lost.
        var arriving: [UUID] = []
        var timerArmed = false
        /// Statements sent so far (tests read it).
        var sent = 0
    }

    struct State {
        /// The claims this store handed out and nobody has settled yet (by token), with when
        /// their leases end: a claim whose lease ended is not waited for (its consumer may have
        /// given it up without a word, as the engine does with a lease it could not keep).
        var outstanding: [UUID: Date] = [:]
        var settlements = Batch<Settlement>()
        var renewals = Batch<Renewal>()

        /// Whether a claim out, other than those in `excluded`, may still join a batch.
        mutating func othersOut(besides excluded: Set<UUID>) -> Bool {
            guard !outstanding.isEmpty else { return false }
            let now = Date()
            if outstanding.values.contains(where: { $0 <= now }) { outstanding = outstanding.filter { $0.value > now } }
            return outstanding.keys.contains { !excluded.contains($0) }
        }

        /// Whether the batch at `path`, with `token`'s change added, is closed: full, or nobody
        /// left to join it.
        mutating func closes<Change: BatchedClaimChange>(_ path: WritableKeyPath<State, Batch<Change>>, adding token: UUID, maximum: Int) -> Bool {
            if self[keyPath: path].waiting.count + 1 >= maximum { return true }
            guard self[keyPath: path].arriving.isEmpty else { return false }
            var excluded: Set<UUID> = []
            if !Change.settlesClaim {
                excluded = Set(self[keyPath: path].waiting.map(\.change.token))
                excluded.insert(token)
            }
            return !othersOut(besides: excluded)
        }

        /// Whether the batch at `path`, as it is, no longer waits for anyone: a claim it waited for
        /// was settled or found lost.
        mutating func nobodyLeftToJoin<Change: BatchedClaimChange>(_ path: WritableKeyPath<State, Batch<Change>>) -> Bool {
            let batch = self[keyPath: path]
            guard !batch.waiting.isEmpty, batch.arriving.isEmpty else { return false }
            return !othersOut(besides: Change.settlesClaim ? [] : Set(batch.waiting.map(\.change.token)))
        }

        mutating func take<Change: BatchedClaimChange>(_ path: WritableKeyPath<State, Batch<Change>>) -> [Waiting<Change>] {
            defer {
                self[keyPath: path].waiting = []
                self[keyPath: path].sent += 1
            }
            return self[keyPath: path].waiting
        }
    }

    private let state = Mutex(State())
    let window: Duration
    let maximumBatch: Int

    init(window: Duration, maximumBatch: Int) {
        self.window = window
        self.maximumBatch = max(1, maximumBatch)
    }

    /// Claims handed out.
    func claimed(_ claims: [QueueClaim]) {
        guard !claims.isEmpty else { return }
        state.withLock { state in
            for claim in claims { state.outstanding[claim.token] = claim.leaseEnds ?? .distantFuture }
        }
    }

    /// A claim's lease was renewed.
    func renewed(_ token: UUID, until end: Date) {
        state.withLock { state in
            if state.outstanding[token] != nil { state.outstanding[token] = end }
        }
    }

    /// The batches a claim that is no longer out leaves waiting for nobody: to send now.
    struct Freed: Sendable {
        var settlements: [Waiting<Settlement>]?
        var renewals: [Waiting<Renewal>]?
    }

    /// A claim was found lost (or cannot be settled): it is no longer out. Returns the batches
    /// that no longer wait for anyone.
    func lost(_ token: UUID) -> Freed {
        state.withLock { state in
            state.outstanding[token] = nil
            return Self.freed(&state)
        }
    }

    /// The batches that wait for nobody now, taken.
    private static func freed(_ state: inout State) -> Freed {
        Freed(
            settlements: state.nobodyLeftToJoin(\.settlements) ? state.take(\.settlements) : nil,
            renewals: state.nobodyLeftToJoin(\.renewals) ? state.take(\.renewals) : nil)
    }

    /// The renewals that waited for claims settled since they joined, if they wait for nobody now.
    func renewalsFreed() -> [Waiting<Renewal>]? {
        state.withLock { state in state.nobodyLeftToJoin(\.renewals) ? state.take(\.renewals) : nil }
    }

    var settlementStatements: Int { state.withLock { $0.settlements.sent } }
    var renewalStatements: Int { state.withLock { $0.renewals.sent } }

    /// Whether `change` closes its batch now (then the caller runs it, with the waiting ones).
    func step<Change: BatchedClaimChange>(_ change: Change) -> Step<Change> {
        let path = Change.batch
        return state.withLock { state in
            if Change.settlesClaim {
                let batch = state[keyPath: path]
                guard !batch.arriving.contains(change.token), !batch.waiting.contains(where: { $0.change.token == change.token }) else { return .lost }
                state.outstanding[change.token] = nil
            }
            guard state.closes(path, adding: change.token, maximum: maximumBatch) else {
                state[keyPath: path].arriving.append(change.token)
                return .join
            }
            return .runNow(with: state.take(path))
        }
    }

    /// Adds a waiting change: the batch to send now if others went meanwhile and it closes it,
    /// or whether a timer must be armed for it.
    func join<Change: BatchedClaimChange>(_ waiting: Waiting<Change>) -> Joined<Change> {
        let path = Change.batch
        return state.withLock { state in
            if let index = state[keyPath: path].arriving.firstIndex(of: waiting.change.token) { state[keyPath: path].arriving.remove(at: index) }
            let closes = state.closes(path, adding: waiting.change.token, maximum: maximumBatch)
            state[keyPath: path].waiting.append(waiting)
            if closes { return .send(state.take(path)) }
            guard !state[keyPath: path].timerArmed else { return .wait }
            state[keyPath: path].timerArmed = true
            return .armTimer
        }
    }

    /// The batch of `Change`s being formed, when its window ends.
    func windowEnded<Change: BatchedClaimChange>(_: Change.Type) -> [Waiting<Change>]? {
        let path = Change.batch
        return state.withLock { state in
            state[keyPath: path].timerArmed = false
            return state[keyPath: path].waiting.isEmpty ? nil : state.take(path)
        }
    }
}

/// A completion, release or dead letter of a claim, as the settlement statement binds it.
struct Settlement: BatchedClaimChange {
    enum Kind: String, Sendable {
        /// The row is deleted (a completion).
        case delete = "d"
        /// The row is rewritten as `entry` and its lease cleared (a release).
        case release = "u"
        /// The row moves to the dead letters as `entry`.
        case deadLetter = "l"
    }

    static let settlesClaim = true
    static var batch: WritableKeyPath<ClaimBatcher.State, ClaimBatcher.Batch<Settlement>> { \.settlements }
    static let operation = "settle"
    static func run(_ batch: [Settlement], on store: PostgresQueueStore) async throws -> Set<ClaimKey> { try await store.settle(batch) }

    let id: UUID
    let token: UUID
    let kind: Kind
    /// The entry's JSON for a release or dead letter; JSON `null` for a completion.
    var entryJSON = "null"
    var priority: Int32 = 0
    var nextAttemptAt: Date?
    var expiresAt = Date.distantFuture
    /// The whole `NOTIFY` payload the change sends.
    let notice: String
}

/// A lease renewal, as the renewal statement binds it.
struct Renewal: BatchedClaimChange {
    static let settlesClaim = false
    static var batch: WritableKeyPath<ClaimBatcher.State, ClaimBatcher.Batch<Renewal>> { \.renewals }
    static let operation = "renew"
    static func run(_ batch: [Renewal], on store: PostgresQueueStore) async throws -> Set<ClaimKey> { try await store.renew(batch) }

    let id: UUID
    let token: UUID
    let until: Date
}

extension PostgresQueueStore {
    /// Settlement statements sent so far (each settles a batch of rows).
    package var settlementStatements: Int { batcher.settlementStatements }
    /// Renewal statements sent so far (each renews a batch of leases).
    package var renewalStatements: Int { batcher.renewalStatements }

    /// Makes `change` in a batch with the changes of its kind to other claims this store has out
    /// (`ClaimBatcher`), and says whether the claim was live (its row was changed).
    func changeInBatch<Change: BatchedClaimChange>(_ change: Change) async throws -> Bool {
        let step = batcher.step(change)
        if Change.settlesClaim, let renewals = batcher.renewalsFreed() { Task { await self.send(renewals) } }
        switch step {
        case .lost:
            return false
        case .runNow(let waiting) where waiting.isEmpty:
            // Alone: in the caller's task, with no hop.
            return try await perform(Change.operation) { try await Change.run([change], on: self) }.contains(ClaimKey(change))
        case .runNow(let waiting):
            // With others' changes: in a task of its own, so that this caller's cancellation
            // (a renewal stopped, a drain's budget spent) cannot fail theirs.
            return try await withCheckedThrowingContinuation { continuation in
                let batch = waiting + [ClaimBatcher.Waiting(change: change, done: continuation)]
                Task { await self.send(batch) }
            }
        case .join:
            return try await withCheckedThrowingContinuation { continuation in
                switch batcher.join(ClaimBatcher.Waiting(change: change, done: continuation)) {
                case .send(let batch): Task { await self.send(batch) }
                case .armTimer:
                    let window = batcher.window
                    Task {
                        try? await Task.sleep(for: window)
                        if let batch = self.batcher.windowEnded(Change.self) { await self.send(batch) }
                    }
                case .wait: break
                }
            }
        }
    }

    /// Notes a claim found lost, or one that cannot be settled: sends the batches that no longer
    /// wait for it.
    func claimFoundLost(_ claim: QueueClaim) {
        let freed = batcher.lost(claim.token)
        if let settlements = freed.settlements { Task { await self.send(settlements) } }
        if let renewals = freed.renewals { Task { await self.send(renewals) } }
    }

    /// Runs the statement for a batch of waiting changes and tells each its outcome.
    private func send<Change: BatchedClaimChange>(_ batch: [ClaimBatcher.Waiting<Change>]) async {
        do {
            let changed = try await perform(Change.operation) { try await Change.run(batch.map(\.change), on: self) }
            for waiting in batch { waiting.done.resume(returning: changed.contains(ClaimKey(waiting.change))) }
        } catch {
            for waiting in batch { waiting.done.resume(throwing: error) }
        }
    }

    /// One statement for a batch of settlements: each row is changed only while its claim is live
    /// (id and lease token match), with the notice its change sends. Returns the claims whose rows
    /// were changed.
    ///
    /// Three shapes, by what the batch holds. PostgreSQL plans a statement over `unnest` arrays
    /// afresh at each run (a plan for "some array" costs more, by its estimate, than one for the
    /// array at hand), and planning the mixed statement takes longer than running it: so a lone
    /// completion — an engine sending one entry at a time — runs a one-row `DELETE` whose plan is
    /// kept, completions only run a `DELETE` over arrays, and only a batch with a release or a
    /// dead letter in it runs the statement for every kind.
    fileprivate func settle(_ batch: [Settlement]) async throws -> Set<ClaimKey> {
        if batch.allSatisfy({ $0.kind == .delete }) { return try await delete(batch) }
        let ids = batch.map(\.id), tokens = batch.map(\.token), kinds = batch.map(\.kind.rawValue)
        let entries = batch.map(\.entryJSON), priorities = batch.map(\.priority), notices = batch.map(\.notice)
        // postgres-nio's arrays hold no NULLs: an absent next attempt is a flag beside a placeholder.
        let nextAttempts = batch.map { $0.nextAttemptAt ?? .distantPast }, hasNextAttempt = batch.map { $0.nextAttemptAt != nil }
        let expiries = batch.map(\.expiresAt)
        return try await Self.claimKeys(
            hotRows(
                """
                WITH input AS (
                    SELECT * FROM unnest(\(ids)::uuid[], \(tokens)::uuid[], \(kinds)::text[], \(entries)::text[], \(priorities)::int4[],
                        \(nextAttempts)::timestamptz[], \(hasNextAttempt)::bool[], \(expiries)::timestamptz[],
                        \(notices)::text[])
                    AS i(id, token, kind, entry, priority, next_attempt_at, has_next_attempt, expires_at, notice)
                ), removed AS (
                    DELETE FROM \(unescaped: names.queue) q USING input
                    WHERE q.id = input.id AND q.lease_token = input.token AND input.kind <> 'u'
                    RETURNING q.id, q.seq, input.token, input.kind, input.entry, input.notice
                ), kept AS (
                    UPDATE \(unescaped: names.queue) q
                    SET entry = input.entry::jsonb, priority = input.priority,
                        next_attempt_at = CASE WHEN input.has_next_attempt THEN input.next_attempt_at END,
                        expires_at = input.expires_at,
                        lease_token = NULL, lease_until = NULL
                    FROM input
                    WHERE q.id = input.id AND q.lease_token = input.token AND input.kind = 'u'
                    RETURNING q.id, input.token, input.notice
                ), buried AS (
                    INSERT INTO \(unescaped: names.deadLetter) (id, seq, entry)
                    SELECT id, seq, entry::jsonb FROM removed WHERE kind = 'l'
                    ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, entry = EXCLUDED.entry, dead_lettered_at = now()
                ), settled AS (
                    SELECT id, token, notice FROM removed UNION ALL SELECT id, token, notice FROM kept
                )
                SELECT settled.id, settled.token FROM settled, LATERAL (SELECT pg_notify(\(names.plain), settled.notice)) AS notified
                """))
    }

    /// Deletes the rows of completed claims that are still live.
    private func delete(_ batch: [Settlement]) async throws -> Set<ClaimKey> {
        if batch.count == 1, let only = batch.first {
            return try await Self.claimKeys(
                hotRows(
                    """
                    WITH done AS (DELETE FROM \(unescaped: names.queue) WHERE id = \(only.id) AND lease_token = \(only.token) RETURNING id, lease_token)
                    SELECT done.id, done.lease_token FROM done, LATERAL (SELECT pg_notify(\(names.plain), \(only.notice))) AS notified
                    """))
        }
        let ids = batch.map(\.id), tokens = batch.map(\.token), notices = batch.map(\.notice)
        return try await Self.claimKeys(
            hotRows(
                """
                WITH input AS (
                    SELECT * FROM unnest(\(ids)::uuid[], \(tokens)::uuid[], \(notices)::text[]) AS i(id, token, notice)
                ), done AS (
                    DELETE FROM \(unescaped: names.queue) q USING input
                    WHERE q.id = input.id AND q.lease_token = input.token
                    RETURNING q.id, input.token, input.notice)
                SELECT done.id, done.token FROM done, LATERAL (SELECT pg_notify(\(names.plain), done.notice)) AS notified
                """))
    }

    /// One statement for a batch of renewals: each lease is extended only while its claim is live.
    /// Returns the claims whose leases were extended. A lone renewal (the engine sending one
    /// entry at a time) runs a one-row statement, whose plan PostgreSQL keeps.
    fileprivate func renew(_ batch: [Renewal]) async throws -> Set<ClaimKey> {
        if batch.count == 1, let only = batch.first {
            return try await Self.claimKeys(
                hotRows(
                    """
                    UPDATE \(unescaped: names.queue) SET lease_until = \(only.until)
                    WHERE id = \(only.id) AND lease_token = \(only.token)
                    RETURNING id, lease_token
                    """))
        }
        let ids = batch.map(\.id), tokens = batch.map(\.token), ends = batch.map(\.until)
        return try await Self.claimKeys(
            hotRows(
                """
                UPDATE \(unescaped: names.queue) q SET lease_until = input.lease_until
                FROM unnest(\(ids)::uuid[], \(tokens)::uuid[], \(ends)::timestamptz[]) AS input(id, token, lease_until)
                WHERE q.id = input.id AND q.lease_token = input.token
                RETURNING q.id, input.token
                """))
    }

    private static func claimKeys(_ rows: [PostgresRow]) throws -> Set<ClaimKey> {
        var keys: Set<ClaimKey> = []
        for row in rows {
            let (id, token) = try row.decode((UUID, UUID).self)
            keys.insert(ClaimKey(id: id, token: token))
        }
        return keys
    }
}

/// A claim as a batch statement reports it changed: the row's id and the lease token it was
/// changed under (two claims of one entry in a batch — a stale one and the live one — are told
/// apart).
struct ClaimKey: Hashable {
    let id: UUID
    let token: UUID

    init(id: UUID, token: UUID) {
        self.id = id
        self.token = token
    }

    init(_ change: some BatchedClaimChange) {
        self.init(id: change.id, token: change.token)
    }
}
