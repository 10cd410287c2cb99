import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import Synchronization

/// Completions gathered into one statement (River's batch completer, graphile-worker's batched
/// completes): a `complete` joins the batch being formed and waits for its statement, one
/// `DELETE … USING unnest(…)` for the whole batch.
///
/// A batch is sent at once when every claim this store has out (with a lease not yet ended) is in
/// it (nothing else could join: an engine that sends one entry at a time never waits), when it holds
/// `maximumBatch` completions, or `window` after its first completion — whichever comes first.
/// So a queue with 64 entries in flight deletes several rows per round trip, and one with a
/// single entry in flight deletes its row at once, as before.
final class CompletionBatcher: Sendable {
    struct Completion: Sendable {
        let id: UUID
        let token: UUID
        let notice: String
        let done: CheckedContinuation<Bool, any Error>
    }

    private struct State {
        var pending: [Completion] = []
        /// The claims this store handed out and nobody has settled yet (by token), with when
        /// their leases end: a claim whose lease ended is not waited for (its consumer may have
        /// given it up without a word, as the engine does with a lease it could not keep).
        var outstanding: [UUID: Date] = [:]
        /// Whether a timer is armed for the batch being formed.
        var timerArmed = false
        /// Batches sent so far (tests read it).
        var batches = 0

        /// Whether another claim may still join the batch being formed.
        mutating func othersOut() -> Bool {
            guard !outstanding.isEmpty else { return false }
            let now = Date()
            if outstanding.values.contains(where: { $0 <= now }) { outstanding = outstanding.filter { $0.value > now } }
            return !outstanding.isEmpty
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

    /// A claim is settled otherwise (released, dead-lettered, lost): returns the batch being
    /// formed when no other claim is left to join it.
    func settledOtherwise(_ token: UUID) -> [Completion]? {
        state.withLock { state in
            state.outstanding[token] = nil
            return !state.pending.isEmpty && !state.othersOut() ? take(&state) : nil
        }
    }

    var batchesSent: Int { state.withLock { $0.batches } }

    /// Adds a completion of one of the outstanding claims; returns the batch to send now, if this
    /// one closes it, and whether a timer must be armed for it.
    func add(_ completion: Completion) -> (send: [Completion]?, armTimer: Bool) {
        state.withLock { state in
            state.outstanding[completion.token] = nil
            state.pending.append(completion)
            if !state.othersOut() || state.pending.count >= maximumBatch {
                return (take(&state), false)
            }
            guard !state.timerArmed else { return (nil, false) }
            state.timerArmed = true
            return (nil, true)
        }
    }

    /// Whether the completion of `token`'s claim can go at once, alone: no batch is being formed
    /// and no other claim is out. If so, the claim is no longer outstanding.
    func alone(_ token: UUID) -> Bool {
        state.withLock { state in
            guard state.pending.isEmpty else { return false }
            let mine = state.outstanding.removeValue(forKey: token)
            guard !state.othersOut() else {
                if let mine { state.outstanding[token] = mine }
                return false
            }
            state.batches += 1
            return true
        }
    }

    /// The batch being formed, when its window ends.
    func windowEnded() -> [Completion]? {
        state.withLock { state in
            state.timerArmed = false
            return state.pending.isEmpty ? nil : take(&state)
        }
    }

    private func take(_ state: inout State) -> [Completion] {
        defer {
            state.pending = []
            state.batches += 1
        }
        return state.pending
    }
}

extension PostgresQueueStore {
    /// Completion statements sent so far (each deletes a batch of rows).
    package var completionStatements: Int { completions.batchesSent }

    /// Deletes the claim's row, in a batch with the completions of other claims this store has
    /// out (`CompletionBatcher`), and says whether the claim was live (the row was deleted).
    func completeInBatch(_ claim: QueueClaim, reason: QueueRemovalReason) async throws -> Bool {
        if completions.alone(claim.token) {
            // Nothing to wait for (an engine sending one entry at a time): deleted in this task,
            // with no hop to another.
            let id = claim.entry.id
            return try await perform("complete") {
                let rows = try await hotRows(
                    """
                    WITH done AS (DELETE FROM \(unescaped: names.queue) WHERE id = \(id) AND lease_token = \(claim.token) RETURNING id)
                    SELECT done.id FROM done, LATERAL (SELECT pg_notify(\(names.plain), \(noticePrefix("r")) || done.id::text || \("|" + reason.notice))) AS notified
                    """)
                return !rows.isEmpty
            }
        }
        return try await withCheckedThrowingContinuation { continuation in
            let completion = CompletionBatcher.Completion(id: claim.entry.id, token: claim.token, notice: reason.notice, done: continuation)
            let (batch, armTimer) = completions.add(completion)
            if let batch {
                Task { await self.send(batch) }
            } else if armTimer {
                let window = completions.window
                Task {
                    try? await Task.sleep(for: window)
                    if let batch = self.completions.windowEnded() { await self.send(batch) }
                }
            }
        }
    }

    /// Notes a claim settled other than by completion; sends the batch being formed if it no
    /// longer waits for anyone.
    func claimSettledOtherwise(_ claim: QueueClaim) {
        if let batch = completions.settledOtherwise(claim.token) { Task { await self.send(batch) } }
    }

    /// One statement for the whole batch: each row is deleted only while its claim is live (id and
    /// lease token match), with the notice its removal sends; each completion learns whether its
    /// row was among those deleted.
    private func send(_ batch: [CompletionBatcher.Completion]) async {
        do {
            let deleted = try await delete(ids: batch.map(\.id), tokens: batch.map(\.token), notices: batch.map(\.notice))
            for completion in batch { completion.done.resume(returning: deleted.contains(ClaimKey(id: completion.id, token: completion.token))) }
        } catch {
            for completion in batch { completion.done.resume(throwing: error) }
        }
    }

    /// A claim as the batch statement reports it deleted: the row's id and the lease token it
    /// was deleted under (two claims of one entry in a batch — a stale one and the live one — are
    /// told apart).
    private struct ClaimKey: Hashable {
        let id: UUID
        let token: UUID
    }

    /// Deletes the rows of these claims that are still live; returns which.
    private func delete(ids: [UUID], tokens: [UUID], notices: [String]) async throws -> Set<ClaimKey> {
        try await perform("complete") {
            let rows = try await hotRows(
                """
                WITH input AS (
                    SELECT * FROM unnest(\(ids)::uuid[], \(tokens)::uuid[], \(notices)::text[]) AS i(id, token, notice)
                ), done AS (
                    DELETE FROM \(unescaped: names.queue) q USING input
                    WHERE q.id = input.id AND q.lease_token = input.token
                    RETURNING q.id, input.token, input.notice)
                SELECT done.id, done.token FROM done,
                    LATERAL (SELECT pg_notify(\(names.plain), \(noticePrefix("r")) || done.id::text || '|' || done.notice)) AS notified
                """)
            var deleted: Set<ClaimKey> = []
            for row in rows {
                let (id, token) = try row.decode((UUID, UUID).self)
                deleted.insert(ClaimKey(id: id, token: token))
            }
            return deleted
        }
    }
}
