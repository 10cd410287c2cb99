import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Conflicts (`ConflictResolver`): a write the server refused with `412` or `428` is stored in
/// conflict, then resolved in a task of its own that holds the entry's claim — the server's
/// current version fetched, the resolver asked, its answer stored — and sent at the next pass.
///
///     replay ──412/428──▶ in conflict (stored) ──claimed──▶ resolving (own task, claim held)
///                                 ▲                             │ fetch fails, resolver throws:
///                                 └─────────────────────────────┘ kept, backoff, attempt counted
///     resolving ──rebase / overwrite──▶ queued, its answer stored (new body or none, new base,
///                                       new Idempotency-Key) ──▶ replayed as any write
///     resolving ──discard──▶ removed (`conflict(statusCode:)`)
///
/// Every step is stored before the next begins: a process killed anywhere resolves again at its
/// next launch, and never sends the refused write again as it was.
extension OfflineQueueEngine {
    /// The status that puts `entry` in conflict after an attempt ended with `outcome`: a `412`
    /// or `428` to a write, on a queue with a resolver; `nil` otherwise (the outcome table decides).
    func conflictStatus(of entry: QueueEntry, after outcome: QueueAttemptOutcome) -> Int? {
        guard configuration.conflictResolver != nil, case .permanent(let error) = outcome else { return nil }
        let isWrite = entry.httpMethod.map { $0 != .get && $0 != .head } ?? false
        guard isWrite, QueueConflict.isConflict(status: error.statusCode) else { return nil }
        return error.statusCode
    }

    /// `entry` as stored once the server answered `status`: in conflict, due at once (the
    /// resolution starts at the next claim), the attempt counted.
    func inConflict(_ entry: QueueEntry, status: Int) -> QueueEntry {
        var updated = entry
        updated.conflict = QueueConflict(statusCode: status)
        updated.attempts = entry.attemptsAfterOneMore
        updated.lastError = NetworkError.httpError(statusCode: status, data: nil).description
        updated.nextAttemptAt = nil
        return updated
    }

    /// Starts resolving a claimed entry in conflict in a task of its own, which settles the claim.
    func startResolving(_ claim: QueueClaim, with resolver: any ConflictResolver) {
        let id = claim.entry.id
        guard resolutions[id] == nil else { return }
        resolutions[id] = Task {
            await self.resolve(claim, with: resolver)
            self.resolutionEnded(id)
        }
    }

    private func resolutionEnded(_ id: UUID) {
        resolutions[id] = nil
    }

    /// Cancels the resolutions in progress and waits for them: each hands its claim back with what
    /// it stored so far (the conflict stays; the next pass, or the next launch, resolves it again).
    func cancelResolutions() async {
        let running = resolutionsInOrder()
        for task in running { task.cancel() }
        for task in running { await task.value }
    }

    /// Waits until every resolution started so far has stored its answer (or given up).
    package func resolutionsSettled() async {
        while let task = resolutionsInOrder().first { await task.value }
    }

    /// The resolutions in progress, by entry id: a fixed order, where the table's varies from one
    /// instance to the next (a simulation must replay a seed step for step).
    private func resolutionsInOrder() -> [Task<Void, Never>] {
        resolutions.sorted { $0.key.uuidString < $1.key.uuidString }.map(\.value)
    }

    /// How a resolution ended.
    enum ResolutionStep: Sendable {
        /// The resolver answered rebase or overwrite: store the entry as it is now.
        case resolved(QueueEntry)
        /// The resolver answered discard.
        case discard(status: Int)
        /// Fetching the server's version failed, or the resolver threw: keep the entry (with what
        /// was fetched) until a later attempt.
        case failed(QueueEntry, NetworkError)
        /// No network, or cancelled: hand the claim back untouched.
        case untouched
    }

    private func resolve(_ claim: QueueClaim, with resolver: any ConflictResolver) async {
        let entry = claim.entry
        let storage = self.storage
        let held = await holding(claim) { await self.resolution(of: entry, with: resolver) }
        guard case .done(let step) = held else { return }  // the lease was lost: another consumer resolves it
        do {
            switch step {
            case .resolved(var resolved):
                // The first resolution's write goes at once. One refused (or failed) before waits
                // the backoff for its attempts: a server that refuses every version never makes
                // the queue spin through fetches and sends.
                if resolved.attempts > 1 {
                    resolved.nextAttemptAt = now.addingTimeInterval(backoff(afterAttempts: resolved.attempts - 1).seconds)
                }
                try await storage.release(claim, keeping: resolved)
                scheduleTimerIfNeeded(for: resolved.nextAttemptAt ?? now)
            case .discard(let status):
                try await storage.complete(claim, reason: .conflict(statusCode: status))
                subscribers.yield(.failedPermanently(id: entry.id, statusCode: status))
            case .failed(var kept, let error):
                kept.attempts = entry.attemptsAfterOneMore
                kept.lastError = error.description
                if let maxAttempts = configuration.maxAttempts, kept.attempts >= maxAttempts {
                    try await storage.deadLetter(claim, entry: kept)
                    subscribers.yield(.deadLettered(id: entry.id, attempts: kept.attempts))
                    return
                }
                let next = now.addingTimeInterval(backoff(afterAttempts: kept.attempts).seconds)
                kept.nextAttemptAt = next
                try await storage.release(claim, keeping: kept)
                subscribers.yield(.keptForRetry(id: entry.id, error: error, attempts: kept.attempts, nextAttemptAt: next))
                if isStarted { await scheduleNextTimer() }
            case .untouched:
                try await storage.release(claim, keeping: entry)
            }
        } catch {
            // The claim was lost meanwhile (cancelled, superseded by a newer edit, its lease taken
            // over), or the storage failed: the entry, still in conflict, is resolved again later.
        }
    }

    /// Fetches the server's version if the entry has none yet, asks the resolver, and returns
    /// the entry as its answer makes it.
    private func resolution(of entry: QueueEntry, with resolver: any ConflictResolver) async -> ResolutionStep {
        guard var conflict = entry.conflict else { return .untouched }
        if !conflict.fetched {
            switch await fetchCurrentVersion(of: entry) {
            case .success(let fetched): conflict = fetched.with(statusCode: conflict.statusCode)
            case .failure(.noConnection), .failure(.cancelled): return .untouched
            case .failure(let error): return .failed(entry, error)
            }
        }
        var fetched = entry
        fetched.conflict = conflict
        let answer: ConflictResolution
        do {
            answer = try await resolver.resolve(
                WriteConflict(entry: fetched, serverBody: conflict.serverBody, serverValidator: conflict.serverValidator, statusCode: conflict.statusCode)
            )
        } catch {
            if Task.isCancelled { return .untouched }
            return .failed(fetched, .underlying(error))
        }
        if Task.isCancelled { return .untouched }
        return fetched.resolved(by: answer).map { .resolved($0) } ?? .discard(status: conflict.statusCode)
    }

    /// `GET` of the write's URL with `Cache-Control: no-cache`, carrying the write's stored headers
    /// that describe the client (not its body, its precondition or its key) and the queue's
    /// replay headers: the server's current version, or (404, 410) the knowledge that it has none.
    private func fetchCurrentVersion(of entry: QueueEntry) async -> Result<QueueConflict, NetworkError> {
        let dropped: Set<String> = ["content-type", "content-length", "content-encoding", "if-match", "if-unmodified-since", "if-none-match", "idempotency-key"]
        var headers = entry.headers.filter { !dropped.contains($0.key.lowercased()) }
        headers["Cache-Control"] = "no-cache"
        var request = PreparedRequest(url: entry.url, method: .get, headers: headers, timeout: entry.timeout, requestPriority: .background)
        request = await request.addingReplayHeaders(for: entry, from: configuration.replayHeaders)
        do {
            let (data, response) = try await sender.response(for: request)
            switch response.statusCode {
            case 200..<300:
                let etag = response.value(forHTTPHeaderField: "ETag")
                let lastModified = response.value(forHTTPHeaderField: "Last-Modified")
                let validator = etag == nil && lastModified == nil ? nil : EditBase(etag: etag, lastModified: lastModified)
                return .success(QueueConflict(statusCode: 0, fetched: true, serverBody: data.isEmpty ? nil : data, serverValidator: validator))
            case 404, 410:
                return .success(QueueConflict(statusCode: 0, fetched: true))
            default:
                return .failure(.httpError(statusCode: response.statusCode, data: nil))
            }
        } catch let error as NetworkError {
            return .failure(Task.isCancelled ? .cancelled : error)
        } catch {
            return .failure(Task.isCancelled ? .cancelled : .underlying(error))
        }
    }
}

extension QueueConflict {
    fileprivate func with(statusCode: Int) -> QueueConflict {
        var copy = self
        copy.statusCode = statusCode
        return copy
    }
}

extension QueueEntry {
    /// This entry in conflict as `resolution` makes it; `nil` for `discard`. A rebased or
    /// overwritten write leaves the conflict, drops any precondition of its own headers, and gets a
    /// new `Idempotency-Key` (its key went with the refused body).
    func resolved(by resolution: ConflictResolution) -> QueueEntry? {
        guard let conflict else { return self }
        var resolved = self
        switch resolution {
        case .discard:
            return nil
        case .rebase(let body):
            resolved.body = body
            resolved.base = conflict.serverValidator
        case .overwrite:
            // After a 428 the server takes no unconditional write: overwrite its current version.
            resolved.base = conflict.statusCode == 428 ? conflict.serverValidator : nil
        }
        resolved.headers = headers.filter { name, _ in
            name.caseInsensitiveCompare("If-Match") != .orderedSame && name.caseInsensitiveCompare("If-Unmodified-Since") != .orderedSame
        }
        resolved.conflict = nil
        resolved.idempotencyKey = SimulationPoints.uuid().uuidString
        resolved.nextAttemptAt = nil
        return resolved
    }
}
