import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Enqueue: a request sent at once when the network is up and nothing it must not overtake is
/// queued (`QueueStorage.maySendAtOnce`), else stored durably; enqueues that share an ordering or
/// coalescing key take turns in arrival order.
extension OfflineQueueEngine {
    /// Sends `request` now if the network is up, else queues it durably.
    ///
    /// - Returns: `.sent` when a 2xx came back at once, `.queued(id:)` when it was stored.
    /// - Throws: `NetworkError` for a failure that retrying cannot fix (4xx other than 408/429,
    ///   501, an invalid request…) — nothing is queued then; `OfflineQueueError.full`,
    ///   `.storage` (disk full, unwritable folder); `.credentialsInURL`,
    ///   `.sensitiveQueryParameter`, `.sensitivePathParameter` (see `QueueSecretPolicy`; nothing is
    ///   sent then).
    @discardableResult
    public func enqueue(_ request: some QueueableRequest) async throws -> EnqueueResult {
        try await enqueue(request, sending: .atOnce)
    }

    /// When `enqueue(_:sending:)` sends its request.
    public enum SendTiming: Sendable, Hashable {
        /// At once when the network is up; stored when that fails (what `enqueue(_:)` does).
        case atOnce
        /// Never now: the request is stored, and the next drain sends it (e.g. raw data from
        /// `QueuedRequest(method:url:body:)`, or a batch written while a drain is planned anyway).
        case onNextDrain
    }

    /// Like `enqueue(_:)`, sending the request at once or leaving it to the next drain.
    @discardableResult
    public func enqueue(_ request: some QueueableRequest, sending: SendTiming) async throws -> EnqueueResult {
        guard !life.isClosed else { throw OfflineQueueError.closed }
        let attemptFirst = sending == .atOnce
        // Refuses invalid requests and URLs with credentials; strips the fragment, and secret
        // headers from what is stored.
        let request = try configuration.secretPolicy.checkedStorable(request)
        let key = request.idempotencyKey  // read once: first attempt and every replay share it

        // Enqueues that share an ordering or coalescing key go one at a time, in arrival order:
        // otherwise a later edit could be sent, or stored, before an earlier one finished.
        let lines = Self.lineKeys(orderingKey: request.orderingKey, coalescingKey: request.coalescingKey)
        if !lines.isEmpty {
            do {
                try await enterLines(lines)
            } catch {
                throw NetworkError.cancelled
            }
        }
        defer { if !lines.isEmpty { leaveLines(lines) } }

        var attempts = 0
        var nextAttemptAt: Date?
        var lastError: String?
        var conflict: QueueConflict?
        // The entry's identity from the start: the request offered to the network at once and
        // the entry stored after it are the same write on `changes`.
        let id = SimulationPoints.uuid()  // UUID(), but drawn from the seed under a simulation
        var offered: QueueEntry?
        // As for a replay: no older edit of its key may come back after a crash (else the edit
        // is stored and a later pass sends it).
        if attemptFirst, await mayTrySending(request) {
            let entry = QueueEntry(id: id, request: request, idempotencyKey: key, enqueuedAt: now, sequence: QueueEntry.unplacedSequence)
            var keyed = entry.replayRequest
            keyed?.keepSecretHeaders(from: request)
            keyed?.requestPriority = request.requestPriority  // the caller's own: someone waits for it
            if let keyed {
                offered = entry
                storage.changeFeed.publish(.offered(entry))
                let observer = observer(of: entry)
                _ = await observer?.sendBegins(entry, waits: false)
                let outcome = await firstAttempt(keyed, timeout: request.timeout, deadline: request.deadline)
                let conflictStatus = conflictStatus(of: entry, after: outcome)
                let end = conflictStatus.map { QueueEntryLifecycle.FirstAttemptEnd.storeInConflict(status: $0) } ?? QueueEntryLifecycle.firstAttemptEnded(outcome)
                switch end {
                case .sent(let status):
                    await observer?.delivered(entry)
                    storage.changeFeed.publish(.removed(entry, reason: .delivered(statusCode: status)))
                    observer?.deliveryFinished(entry)
                    return .sent(statusCode: status)
                case .rejected(let error):
                    storage.changeFeed.publish(.removed(entry, reason: .rejected(statusCode: error.statusCode)))
                    observer?.sendEnded(entry, mayHaveReachedServer: false)
                    throw error
                case .cancelled:
                    storage.changeFeed.publish(.removed(entry, reason: .cancelled))
                    observer?.sendEnded(entry, mayHaveReachedServer: true)
                    throw NetworkError.cancelled
                case .storeInConflict(let status):
                    // Stored in conflict; the next pass resolves it (`ConflictResolver`).
                    observer?.sendEnded(entry, mayHaveReachedServer: false)
                    conflict = QueueConflict(statusCode: status)
                    attempts = 1
                    lastError = NetworkError.httpError(statusCode: status, data: nil).description
                case .store(let counted, let retryAfter, let error):
                    // A timed-out first attempt may still be on the wire: its fate is unknown.
                    observer?.sendEnded(entry, mayHaveReachedServer: outcome.mayHaveReachedServer)
                    attempts = counted
                    nextAttemptAt = retryAfter.map { now.addingTimeInterval($0.seconds) }
                    lastError = error
                }
            }
        }
        let entry: QueueEntry
        do {
            entry = try await persist(request, id: id, key: key, attempts: attempts, nextAttemptAt: nextAttemptAt, lastError: lastError, conflict: conflict)
        } catch {
            if let offered { storage.changeFeed.publish(.removed(offered, reason: .notStored)) }
            throw error
        }
        // While started, a stored entry is replayed without waiting for the next reconnect: when
        // its backoff ends, right away if it has none, or at the offline re-check if a send just
        // found the network unreachable.
        if let next = entry.nextAttemptAt {
            scheduleTimerIfNeeded(for: next)
        } else {
            scheduleTimerIfNeeded(for: learnedOffline ? offlineRecheckDate() : now)
        }
        return .queued(id: entry.id)
    }

    // MARK: - Sending at once, and the lines of keys

    func mayTrySending(_ request: some QueueableRequest) async -> Bool {
        guard !learnedOffline, await reachability.isConnected else { return false }
        // Entries already waiting with the same ordering or coalescing key must go first; the
        // storage says when nothing such can be in it (see `QueueStorage.maySendAtOnce`).
        return await storage.maySendAtOnce(orderingKey: request.orderingKey, coalescingKey: request.coalescingKey)
    }

    /// The first attempt of an enqueue, bounded by the request's `timeout` (and its `deadline`,
    /// when that is sooner) on the queue's clock, whatever the sender does (a token refresh that
    /// never returns, a sender without timeouts): past it the attempt is cancelled and counts as
    /// one timed-out attempt, so the entry is stored with a backoff and the caller gets `.queued`.
    func firstAttempt(_ request: PreparedRequest, timeout: TimeInterval, deadline: Duration?) async -> QueueAttemptOutcome {
        let ceiling = Duration.seconds(86_400 * 365)
        var limit = timeout.isFinite && timeout > 0 ? Duration.clamped(seconds: timeout, upperBound: ceiling) : nil
        if let deadline { limit = min(limit ?? ceiling, max(deadline, .zero)) }
        guard let limit else { return await attempt(request, previousAttempts: 0) }
        // Unstructured tasks, not a task group: a group would wait for a sender that ignores
        // cancellation, which is exactly the sender this bound is for.
        let race = FirstAttemptRace()
        let sending = Task { race.answer(.attempt(await self.attempt(request, previousAttempts: 0))) }
        // The queue's one timer, not a sleeping task per enqueue (see `DeadlineTimer`).
        let timeout = deadlines.schedule(after: limit) { race.answer(.timedOut) }
        let winner = await withTaskCancellationHandler {
            await race.value
        } onCancel: {
            race.answer(.callerCancelled)
        }
        deadlines.cancel(timeout)
        sending.cancel()  // a no-op when it answered; otherwise its late outcome is ignored
        switch winner {
        case .attempt(let outcome): return outcome
        case .callerCancelled: return .stop
        case .timedOut: return Task.isCancelled ? .stop : .retry(.timedOut, after: backoff(afterAttempts: 1))
        }
    }

    /// The serialization lines an enqueue with these keys joins, in a fixed order (so two
    /// enqueues needing the same two lines can never wait on each other).
    static func lineKeys(orderingKey: String?, coalescingKey: String?) -> [String] {
        var keys: [String] = []
        if let orderingKey { keys.append("o:" + orderingKey) }
        if let coalescingKey { keys.append("c:" + coalescingKey) }
        return keys.sorted()
    }

    /// Waits for the caller's turn on each line; throws `CancellationError` (holding none) if the
    /// caller is cancelled while it waits.
    func enterLines(_ keys: [String]) async throws {
        for (position, key) in keys.enumerated() {
            var line = keyLines[key] ?? (AdmissionGate(limit: 1), 0)
            line.users += 1
            keyLines[key] = line
            do {
                try await line.gate.enter()
            } catch {
                release(key, entered: false)
                for held in keys[..<position] { release(held, entered: true) }
                throw error
            }
        }
    }

    /// For tests: enqueues holding or waiting for the line of `coalescingKey`.
    func enqueuesInLine(coalescingKey key: String) -> Int { keyLines["c:" + key]?.users ?? 0 }

    func leaveLines(_ keys: [String]) {
        for key in keys { release(key, entered: true) }
    }

    func release(_ key: String, entered: Bool) {
        guard var line = keyLines[key] else { return }
        if entered { line.gate.leave() }
        line.users -= 1
        keyLines[key] = line.users == 0 ? nil : line
    }

    /// Stores `request` as an entry (`QueueStorage.add`: a newer edit of a coalescing key takes
    /// its holder's place unless the holder is being sent).
    func persist(
        _ request: some QueueableRequest,
        id: UUID,
        key: String,
        attempts: Int,
        nextAttemptAt: Date?,
        lastError: String?,
        conflict: QueueConflict? = nil
    ) async throws -> QueueEntry {
        var entry = QueueEntry(
            id: id,
            request: request,
            idempotencyKey: key,
            enqueuedAt: now,
            sequence: QueueEntry.unplacedSequence,
            attempts: attempts,
            nextAttemptAt: nextAttemptAt,
            lastError: lastError
        )
        entry.conflict = conflict
        return try await storage.add(entry, limit: maxQueueSize)
    }
}
