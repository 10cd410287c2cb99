import Foundation
import RequestEngine

/// The engine on a `QueueStorage` other than `DiskQueueStore` — storage that several engines (a
/// service's replicas) may consume at once, such as `PostgresQueueStore`. A pass takes one entry at
/// a time with `claim`, sends it while renewing the claim's lease, and settles the claim with the
/// outcome: `complete` (delivered, rejected), `release` (kept for a later attempt, or untouched when
/// the attempt did not count) or `deadLetter`. The queue's rules across consumers (order, one entry
/// in flight per ordering key, the newest edit winning, due and alive entries only) are the
/// storage's, as `QueueStorage` states them; the outcome table is the disk queue's
/// (`attempt(_:previousAttempts:)`, `QueueEntryLifecycle.replayEnded`).
extension OfflineQueueEngine {
    /// How a claimed entry's send ended.
    private enum ClaimedSend {
        case outcome(QueueAttemptOutcome)
        /// The lease could not be renewed: the send was cancelled, and the entry is someone else's
        /// (or will be, once the lease runs out).
        case lost
    }

    func persistShared(
        _ request: some QueueableRequest,
        id: UUID,
        key: String,
        attempts: Int,
        nextAttemptAt: Date?,
        lastError: String?
    ) async throws -> QueueEntry {
        let entry = QueueEntry(
            id: id,
            request: request,
            idempotencyKey: key,
            enqueuedAt: now,
            sequence: QueueEntry.unplacedSequence,
            attempts: attempts,
            nextAttemptAt: nextAttemptAt,
            lastError: lastError
        )
        let stored = try await storage.add(entry, limit: maxQueueSize)
        await publishSharedCount()
        return stored
    }

    func cancelShared(id: UUID) async -> Bool {
        let cancelled = (try? await storage.cancel(id: id)) ?? false
        if cancelled { await publishSharedCount() }
        return cancelled
    }

    nonisolated func sharedCounts() -> AsyncStream<Int> {
        let stream = sharedCountSubscribers.stream(bufferingPolicy: .bufferingNewest(1))
        Task { [weak self] in await self?.publishSharedCount() }
        return stream
    }

    func publishSharedCount() async {
        guard let count = try? await storage.queuedCount() else { return }
        sharedCountSubscribers.yield(count)
    }

    /// One pass over shared storage: sweep the expired, then claim and send one entry at a time
    /// until nothing is claimable, the network is gone, or the pass is cancelled. An entry the pass
    /// already sent (kept with no wait) ends it rather than going twice.
    func runSharedPass(_ report: inout FlushReport, connected: Bool) async {
        do {
            for expired in try await storage.removeExpired(now: now) {
                record(.expired(id: expired.id), in: &report)
            }
            if connected { try await claimAndSend(&report) }
        } catch {
            report.storageError = error
        }
        report.remaining = await pendingCount()
        await publishSharedCount()
        guard isStarted, connected else { return }
        if learnedOffline {
            scheduleTimerIfNeeded(for: offlineRecheckDate())
        } else {
            await scheduleSharedTimer()
        }
    }

    private func claimAndSend(_ report: inout FlushReport) async throws {
        var handled: Set<UUID> = []
        while !Task.isCancelled {
            guard let claim = try await storage.claim(upTo: 1, now: now, lease: configuration.claimLease).first else { return }
            guard handled.insert(claim.entry.id).inserted else {
                try await storage.release(claim, keeping: claim.entry)
                return
            }
            switch try await replay(claim, report: &report) {
            case .outcome(.offline):
                report.endedOffline = true
                return
            case .outcome(.stop):
                report.wasCancelled = true
                return
            case .outcome, .lost:
                continue
            }
        }
        report.wasCancelled = true
    }

    private func replay(_ claim: QueueClaim, report: inout FlushReport) async throws -> ClaimedSend {
        let entry = claim.entry
        guard let request = entry.replayRequest else {
            try await storage.complete(claim, reason: .rejected(statusCode: nil))
            record(.failedPermanently(id: entry.id, statusCode: nil), in: &report)
            return .outcome(.permanent(.invalidRequest(reason: "unknown method \(entry.method)")))
        }
        let prepared = await request.addingReplayHeaders(for: entry, from: configuration.replayHeaders)
        let send = await sendHolding(claim, prepared)
        guard case .outcome(let outcome) = send else {
            // Cut because the lease could not be renewed: handed back if it is still ours (a failed
            // renewal), else it is already another consumer's.
            try? await storage.release(claim, keeping: entry)
            return send
        }
        let end = lifecycle.replayEnded(entry, outcome, stillQueued: true, supersededBy: nil, maxAttempts: configuration.maxAttempts, now: now)
        do {
            switch end {
            case .remove(let reason, let result):
                try await storage.complete(claim, reason: reason)
                if let result { record(result, in: &report) }
            case .keep(let updated, let error, let next):
                try await storage.release(claim, keeping: updated)
                record(.keptForRetry(id: entry.id, error: error, attempts: updated.attempts, nextAttemptAt: next), in: &report)
            case .deadLetter(var updated):
                do {
                    try await storage.deadLetter(claim, entry: updated)
                    record(.deadLettered(id: entry.id, attempts: updated.attempts), in: &report)
                } catch OfflineQueueError.claimLost(let id) {
                    throw OfflineQueueError.claimLost(id: id)
                } catch {
                    // Cannot write the dead letter: keep the entry rather than lose it.
                    updated.nextAttemptAt = now.addingTimeInterval(backoff(afterAttempts: updated.attempts).seconds)
                    try await storage.release(claim, keeping: updated)
                }
            case .supersede, .leave:
                try await storage.release(claim, keeping: entry)
            }
        } catch OfflineQueueError.claimLost {
            // Cancelled, or its lease ran out and another consumer has it: its outcome is not ours
            // to record (a delivery stands at the server all the same).
            return .lost
        }
        return send
    }

    /// Sends `request` while renewing `claim` every third of the lease; a renewal that fails cuts
    /// the send (`lost`). A claim without a lease is sent as it is.
    private func sendHolding(_ claim: QueueClaim, _ request: PreparedRequest) async -> ClaimedSend {
        guard claim.leaseEnds != nil else { return .outcome(await attempt(request, previousAttempts: claim.entry.attempts)) }
        let lease = configuration.claimLease
        let storage = self.storage
        let time = self.time
        return await withTaskGroup(of: ClaimedSend?.self) { group in
            group.addTask { .outcome(await self.attempt(request, previousAttempts: claim.entry.attempts)) }
            group.addTask {
                var current = claim
                while true {
                    do { try await time.sleep(lease / 3) } catch { return nil }  // the send ended first
                    do {
                        current = try await storage.renew(current, now: self.now, lease: lease)
                    } catch {
                        return .lost
                    }
                }
            }
            // The first answer decides: the send's outcome, or a renewal that failed (the group
            // then waits for the cancelled send, whose own outcome is not the entry's).
            var first: ClaimedSend = .lost
            while let next = await group.next() {
                guard let next else { continue }  // the renewals ended because the send did
                first = next
                break
            }
            group.cancelAll()
            return first
        }
    }

    /// While started: a pass when the earliest backoff ends, and at the poll interval at the latest.
    func scheduleSharedTimer() async {
        let poll = now.addingTimeInterval(configuration.storagePollInterval.seconds)
        let earliest = (try? await storage.earliestNextAttempt()) ?? nil
        scheduleTimerIfNeeded(for: min(earliest ?? poll, poll))
    }

    /// Runs a pass whenever the storage says another consumer added work.
    func followArrivals() -> Task<Void, Never> {
        let arrivals = storage.arrivals()
        return Task { [weak self] in
            for await _ in arrivals {
                guard let self, !Task.isCancelled else { return }
                guard await self.reachabilityMonitor.isConnected else { continue }
                _ = await self.runPass(.timer)
            }
        }
    }
}
