import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// A drain pass, on any `QueueStorage`: it sweeps the expired entries, then takes one entry at a
/// time with `claim`, sends it (renewing the claim's lease, on storage that has leases), and settles
/// the claim with the outcome: `complete` (delivered, rejected), `release` (kept for a later
/// attempt, or untouched when the attempt did not count) or `deadLetter`. The queue's rules (order,
/// one entry in flight per ordering key, the newest edit winning, due and alive entries only) are
/// the storage's, as `QueueStorage` states them; the outcome table is the engine's
/// (`attempt(_:previousAttempts:)`, `QueueEntryLifecycle.replayEnded`). What the disk needs of a
/// pass — deletions batched, made durable before a coalesced edit goes, deleted at once for a
/// delivery a layer above observes — is `DiskQueueStore`'s side of the same calls.
extension OfflineQueueEngine {
    func runPass(_ trigger: FlushReport.Trigger, ignoringReachability: Bool = false) async -> FlushReport {
        var report = FlushReport(trigger: trigger)
        guard !life.isClosed else { return report }
        do {
            try await passGate.enter()
        } catch {
            // Cancelled while another pass ran (e.g. a drain cycle's budget ran out): nothing sent.
            report.wasCancelled = true
            report.remaining = await pendingCount()
            return report
        }
        defer { passGate.leave() }
        guard !life.isClosed else { return report }  // closed while this pass waited its turn
        let connected: Bool
        if ignoringReachability { connected = true } else { connected = await reachability.isConnected }
        report.endedOffline = !connected
        await runClaimingPass(&report, connected: connected)
        return report
    }

    func record(_ result: QueueEntryResult, in report: inout FlushReport) {
        report.results.append(result)
        subscribers.yield(result)
    }

    /// How a claimed entry's send ended.
    private enum ClaimedSend {
        case outcome(QueueAttemptOutcome)
        /// The lease could not be renewed: the send was cancelled, and the entry is someone else's
        /// (or will be, once the lease runs out).
        case lost
    }

    /// One pass: sweep the expired, then claim and send one entry at a time until nothing is
    /// claimable, the network is gone, or the pass is cancelled. An entry the pass already sent
    /// (kept with no wait) ends it rather than going twice.
    ///
    /// Once the pass is cancelled, the storage's calls that settle what it did run outside its task
    /// (`settled`): a cancelled pass (`stop()`, a drain budget, a service's shutdown) still hands
    /// its claim back, or completes an entry whose send landed as the cancellation came, where a
    /// storage that checks for cancellation (postgres-nio does) would refuse the call and leave the
    /// entry leased until its lease ran out.
    func runClaimingPass(_ report: inout FlushReport, connected: Bool) async {
        await storage.passBegins()
        do {
            for expired in try await storage.removeExpired(now: now) {
                record(.expired(id: expired.id), in: &report)
            }
            if connected { try await claimAndSend(&report) }
        } catch is CancellationError {
            report.wasCancelled = true
        } catch {
            if Task.isCancelled { report.wasCancelled = true } else { report.storageError = error }
        }
        await settled { await self.storage.passEnded() }
        report.remaining = await settled { await self.pendingCount() }
        storageFailures = report.storageError == nil ? 0 : storageFailures + 1
        // Offline, the monitor will say when it is back: no timer.
        guard isStarted, connected else { return }
        if learnedOffline {
            scheduleTimerIfNeeded(for: offlineRecheckDate())
        } else {
            // After a storage error, not at once: an entry due now would otherwise start a pass
            // that fails the same way, again and again, while no time passes.
            await scheduleNextTimer(notBefore: storageFailures > 0 ? storageRetryDate() : nil)
        }
    }

    /// Runs `body` at once, on the engine's actor, while the pass is not cancelled; once it is, in
    /// a task of its own, which the cancellation does not reach. (A task for every call cost the
    /// disk queue's replay two thread hops an entry. A cancellation that lands during the call
    /// itself may still make a storage that checks for it refuse: the claim is then left to its
    /// lease, and the entry goes again with its key.)
    private func settled<Result: Sendable>(
        _ body: nonisolated(nonsending) @escaping @Sendable () async throws -> Result
    ) async throws -> Result {
        guard Task.isCancelled else { return try await body() }
        return try await Task { try await body() }.value
    }

    private func settled<Result: Sendable>(_ body: nonisolated(nonsending) @escaping @Sendable () async -> Result) async -> Result {
        guard Task.isCancelled else { return await body() }
        return await Task { await body() }.value
    }

    private func claimAndSend(_ report: inout FlushReport) async throws {
        let limit = max(1, configuration.maxConcurrentDeliveries)
        if limit == 1 {
            try await claimAndSendOneAtATime(&report)
        } else {
            try await claimAndSendConcurrently(&report, limit: limit)
        }
    }

    /// What to do with a claimed entry before it is sent.
    private enum ClaimTriage {
        /// Send it.
        case send
        /// It went to a resolution of its conflict (which holds the claim).
        case resolving
        /// Handed back: it was sent in this pass already, or its conflict is being resolved; the
        /// pass claims nothing more.
        case handedBack
    }

    /// Sends a claimed entry, unless it is in conflict (its resolution starts) or was sent in this
    /// pass already (kept with no wait: the claim goes back, and the pass ends rather than send it
    /// twice).
    private func triage(_ claim: QueueClaim, handled: inout Set<UUID>) async throws -> ClaimTriage {
        let storage = self.storage
        if claim.entry.conflict != nil, let resolver = configuration.conflictResolver {
            // Resolved in a task of its own, which holds the claim: the pass goes on.
            guard resolutions[claim.entry.id] == nil else {
                try await settled { try await storage.release(claim, keeping: claim.entry) }
                return .handedBack
            }
            startResolving(claim, with: resolver)
            return .resolving
        }
        guard handled.insert(claim.entry.id).inserted else {
            try await settled { try await storage.release(claim, keeping: claim.entry) }
            return .handedBack
        }
        return .send
    }

    /// `maxConcurrentDeliveries` 1: one entry at a time, each settled before the next is claimed.
    private func claimAndSendOneAtATime(_ report: inout FlushReport) async throws {
        var handled: Set<UUID> = []
        while !Task.isCancelled {
            guard let claim = try await storage.claim(upTo: 1, now: now, lease: configuration.claimLease).first else { return }
            switch try await triage(claim, handled: &handled) {
            case .resolving: continue
            case .handedBack: return
            case .send: break
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

    /// One entry's delivery in a concurrent pass: what `replay` returned, the results it recorded,
    /// or the storage error it met.
    private struct Delivery: Sendable {
        var send: ClaimedSend?
        var report: FlushReport
        var error: (any Error)?
        /// Whether the entry had an ordering or coalescing key: its successor may be claimable now.
        var hadKey: Bool
    }

    /// `maxConcurrentDeliveries` N > 1: up to `limit` entries in flight, each in a child task of the
    /// pass. The storage's rules decide what is claimable (one entry in flight per ordering key, a
    /// coalesced edit never replacing one in flight); the pass fills its free slots with one claim
    /// call, and claims again once an eighth of its slots were freed since (so a database is asked once
    /// for several entries, not once per delivery), or at once when the entry that ended had an
    /// ordering or coalescing key (its successor may be waiting for it), or when nothing is in
    /// flight. A send that finds no network, a cancellation, an entry met twice or a storage error
    /// stop the claiming: the deliveries in flight end as they would have (a cancellation cuts
    /// them), then the pass ends, throwing the first storage error.
    private func claimAndSendConcurrently(_ report: inout FlushReport, limit: Int) async throws {
        var handled: Set<UUID> = []
        var failure: (any Error)?
        let trigger = report.trigger
        let refill = max(1, limit / 8)
        await withTaskGroup(of: Delivery.self) { group in
            var inFlight = 0
            var claiming = true
            var claimNow = true
            // Deliveries ended since the last claim.
            var freed = 0
            while true {
                if claiming, claimNow, inFlight < limit, !Task.isCancelled {
                    claimNow = false
                    freed = 0
                    let wanted = limit - inFlight
                    let claims: [QueueClaim]
                    do {
                        claims = try await storage.claim(upTo: wanted, now: now, lease: configuration.claimLease)
                    } catch {
                        failure = failure ?? error
                        claiming = false
                        claims = []
                    }
                    for claim in claims {
                        guard claiming, !Task.isCancelled else {
                            // Claimed with the others, not to be sent now (the claiming stopped,
                            // or the pass was cancelled as the claim came back): handed back
                            // untouched (a storage that refuses leaves it to its lease).
                            _ = try? await settled { try await self.storage.release(claim, keeping: claim.entry) }
                            continue
                        }
                        do {
                            switch try await triage(claim, handled: &handled) {
                            case .resolving: claimNow = claims.count == wanted  // its slot is free again
                            case .handedBack: claiming = false
                            case .send:
                                inFlight += 1
                                group.addTask { await self.delivery(of: claim, trigger: trigger) }
                            }
                        } catch {
                            failure = failure ?? error
                            claiming = false
                        }
                    }
                    if claimNow, claiming { continue }
                }
                guard inFlight > 0, let delivery = await group.next() else { break }
                inFlight -= 1
                freed += 1
                if inFlight == 0 || freed >= refill || delivery.hadKey { claimNow = true }
                report.results += delivery.report.results
                if let error = delivery.error {
                    failure = failure ?? error
                    claiming = false
                }
                switch delivery.send {
                case .outcome(.offline)?:
                    report.endedOffline = true
                    claiming = false
                case .outcome(.stop)?:
                    report.wasCancelled = true
                    claiming = false
                default:
                    break
                }
            }
        }
        if let failure { throw failure }
        if Task.isCancelled { report.wasCancelled = true }
    }

    private func delivery(of claim: QueueClaim, trigger: FlushReport.Trigger) async -> Delivery {
        var local = FlushReport(trigger: trigger)
        let hadKey = claim.entry.orderingKey != nil || claim.entry.coalescingKey != nil
        do {
            let send = try await replay(claim, report: &local)
            return Delivery(send: send, report: local, error: nil, hadKey: hadKey)
        } catch {
            return Delivery(send: nil, report: local, error: error, hadKey: hadKey)
        }
    }

    private func replay(_ claim: QueueClaim, report: inout FlushReport) async throws -> ClaimedSend {
        let entry = claim.entry
        let storage = self.storage
        guard let request = entry.replayRequest else {
            try await settled { try await storage.complete(claim, reason: .rejected(statusCode: nil)) }
            record(.failedPermanently(id: entry.id, statusCode: nil), in: &report)
            return .outcome(.permanent(.invalidRequest(reason: "unknown method \(entry.method)")))
        }
        if let conflict = entry.conflict {
            // In conflict from a run that had a resolver; this one has none: rejected, as its
            // status would be without one.
            try await settled { try await storage.complete(claim, reason: .rejected(statusCode: conflict.statusCode)) }
            record(.failedPermanently(id: entry.id, statusCode: conflict.statusCode), in: &report)
            return .outcome(.permanent(.httpError(statusCode: conflict.statusCode, data: nil)))
        }
        let prepared = await request.addingReplayHeaders(for: entry, from: configuration.replayHeaders)
        // A layer above (OfflineFirst) may hold the replay while a read of what it changes is
        // being fetched: cancelled meanwhile, it is not sent and the claim goes back untouched.
        let observer = observer(of: entry)
        if let observer, !(await observer.sendBegins(entry, waits: true)) {
            try await settled { try await storage.release(claim, keeping: entry) }
            return .outcome(.stop)
        }
        if observer != nil {
            // What may be in the server's state from now on, for the next launch should this
            // process die: this entry, and those sent before without an answer that says no.
            possiblySent.insert(entry.id)
            possiblySent = possiblySent.filter { storage.changeFeed.contains(id: $0) }
            await storage.noteInFlight(possiblySent)
        }
        storage.changeFeed.publish(.attemptStarted(id: entry.id))
        defer { storage.changeFeed.publish(.attemptEnded(id: entry.id)) }  // after the outcome is settled
        let send = await sendHolding(claim, prepared)
        guard case .outcome(let outcome) = send else {
            // Cut because the lease could not be kept: it is another consumer's already, or its
            // lease ends within a tenth of it (a storage that cannot renew may not answer a release
            // either, so none is asked for).
            observer?.sendEnded(entry, mayHaveReachedServer: true)
            return send
        }
        // Told once the outcome is settled, unless a delivery told it already.
        var observed = observer != nil
        defer {
            if observed {
                if !outcome.mayHaveReachedServer { possiblySent.remove(entry.id) }
                observer?.sendEnded(entry, mayHaveReachedServer: outcome.mayHaveReachedServer)
            }
        }
        if let status = conflictStatus(of: entry, after: outcome) {
            // Stored in conflict before anything else happens; the resolution starts when the
            // entry is next claimed (in this pass: it is due at once).
            let conflicted = inConflict(entry, status: status)
            do {
                try await settled { try await storage.release(claim, keeping: conflicted) }
            } catch OfflineQueueError.claimLost {
                return .lost
            }
            let error = NetworkError.httpError(statusCode: status, data: nil)
            record(.keptForRetry(id: entry.id, error: error, attempts: conflicted.attempts, nextAttemptAt: now), in: &report)
            return send
        }
        let end = lifecycle.replayEnded(entry, outcome, stillQueued: true, supersededBy: nil, maxAttempts: configuration.maxAttempts, now: now)
        do {
            switch end {
            case .remove(let reason, let result):
                // An observed delivery is recorded with the reads it changes before the storage
                // forgets it, and told finished once it has; its file (on a disk) goes at once, so
                // no read stored from now on meets it after a relaunch.
                let deliveryObserver = reason.isDelivered ? observer : nil
                if let deliveryObserver {
                    await deliveryObserver.delivered(entry)
                    observed = false
                    possiblySent.remove(entry.id)
                }
                do {
                    defer { deliveryObserver?.deliveryFinished(entry) }
                    try await settled {
                        try await storage.complete(claim, reason: reason)
                        if deliveryObserver != nil { await storage.removalsSettled() }
                    }
                }
                if let result { record(result, in: &report) }
            case .keep(let updated, let error, let next):
                try await settled { try await storage.release(claim, keeping: updated) }
                record(.keptForRetry(id: entry.id, error: error, attempts: updated.attempts, nextAttemptAt: next), in: &report)
            case .deadLetter(var updated):
                do {
                    let final = updated
                    try await settled { try await storage.deadLetter(claim, entry: final) }
                    record(.deadLettered(id: entry.id, attempts: updated.attempts), in: &report)
                } catch OfflineQueueError.claimLost(let id) {
                    throw OfflineQueueError.claimLost(id: id)
                } catch {
                    // Cannot write the dead letter: keep the entry rather than lose it.
                    updated.nextAttemptAt = now.addingTimeInterval(backoff(afterAttempts: updated.attempts).seconds)
                    let kept = updated
                    try await settled { try await storage.release(claim, keeping: kept) }
                }
            case .supersede, .leave:
                try await settled { try await storage.release(claim, keeping: entry) }
            }
        } catch OfflineQueueError.claimLost {
            // Cancelled, superseded by a newer edit, or its lease ran out and another consumer has
            // it: its outcome is not ours to record (a delivery stands at the server all the same).
            // A send that found no network, or was cut, still ends the pass.
            switch outcome {
            case .offline, .stop: return send
            default: return .lost
            }
        }
        return send
    }

    /// Who ends a claimed entry's work (its send, its conflict's resolution) first.
    private enum HeldWork<Done: Sendable>: Sendable {
        /// The work ended, with this result.
        case done(Done)
        /// The lease was lost (another consumer has the entry) or is about to end unrenewed.
        case leaseLost
        /// The pass was cancelled.
        case cancelled
    }

    /// What came of work done while holding a claim.
    enum Held<Done: Sendable>: Sendable {
        /// The work ended (or was cut by a cancellation and waited for), with this result.
        case done(Done)
        /// The lease could not be kept: the work was cut, and the entry is someone else's (or will
        /// be, once the lease runs out).
        case lost
    }

    /// Sends `request` while holding `claim` (`holding(_:_:)`).
    private func sendHolding(_ claim: QueueClaim, _ request: PreparedRequest) async -> ClaimedSend {
        let previousAttempts = claim.entry.attempts
        switch await holding(claim, { await self.attempt(request, previousAttempts: previousAttempts) }) {
        case .done(let outcome): return .outcome(outcome)
        case .lost: return .lost
        }
    }

    /// Runs `work` (a send, a resolution) while renewing `claim` every third of the lease. The
    /// work is cut (`lost`) when the storage says the claim is lost, or when the lease is about to
    /// end unrenewed — a tenth of it before its end, whatever a renewal in progress does meanwhile
    /// (one that hangs on a network gone silent included), so the work never outlives its lease. A
    /// renewal that fails is tried again at the next third while the lease lasts. A cancellation
    /// cuts the work and waits for it, so the claim is settled by what the work did. A claim
    /// without a lease is worked on as it is.
    func holding<Done: Sendable>(_ claim: QueueClaim, _ work: @escaping @Sendable () async -> Done) async -> Held<Done> {
        guard let firstEnd = claim.leaseEnds else { return .done(await work()) }
        let lease = configuration.claimLease
        let margin = lease / 10
        let race = FirstAnswer<HeldWork<Done>>()
        let deadlines = self.deadlines
        let expiry = Locked<DeadlineTimer.Token?>(nil)
        let now: @Sendable () -> Date = { self.now }
        // (Re)arms the cut for a lease that ends at `end`.
        let arm: @Sendable (Date) -> Void = { end in
            let wait = Duration.clamped(seconds: end.timeIntervalSince(now()), upperBound: .seconds(86_400)) - margin
            let token = deadlines.schedule(after: max(Duration.zero, wait)) { race.answer(.leaseLost) }
            if let old = expiry.withLock({ state in
                defer { state = token }; return state
            }) {
                deadlines.cancel(old)
            }
        }
        arm(firstEnd)
        let working = Task {
            let done = await work()
            race.answer(.done(done))
            return done
        }
        let renewal = LeaseRenewal(claim, lease: lease, storage: storage, deadlines: deadlines, now: now) { renewed in
            switch renewed {
            case .some(let current): if let end = current.leaseEnds { arm(end) }
            case .none: race.answer(.leaseLost)
            }
        }
        renewal.start()
        let winner = await withTaskCancellationHandler {
            await race.value
        } onCancel: {
            race.answer(.cancelled)
        }
        renewal.stop()
        if let token = expiry.withLock({ state in
            defer { state = nil }; return state
        }) {
            deadlines.cancel(token)
        }
        switch winner {
        case .done(let done):
            return .done(done)
        case .cancelled:
            // The work is cut and waited for: a response that landed first is still delivered.
            working.cancel()
            return .done(await working.value)
        case .leaseLost:
            working.cancel()
            _ = await working.value  // never two sends of the entry from this engine at once
            return .lost
        }
    }
}

/// Renews a claim every third of its lease while work holds it. The renewals are deadlines on the
/// engine's `DeadlineTimer`, so a delivery that ends within a third of the lease — most do — costs
/// one deadline scheduled and cancelled, no task and no timer of its own. A renewal that fails is
/// tried again a third of the lease later (the lease's cut comes first if none succeeds); one that
/// finds the claim lost reports `nil` and stops.
private final class LeaseRenewal: Sendable {
    private struct State: Sendable {
        var current: QueueClaim
        var pending: DeadlineTimer.Token?
        var renewing: Task<Void, Never>?
        var stopped = false
    }

    private let state: Locked<State>
    private let lease: Duration
    private let storage: any QueueStorage
    private let deadlines: DeadlineTimer
    private let now: @Sendable () -> Date
    private let renewed: @Sendable (QueueClaim?) -> Void

    init(
        _ claim: QueueClaim, lease: Duration, storage: any QueueStorage, deadlines: DeadlineTimer,
        now: @escaping @Sendable () -> Date, renewed: @escaping @Sendable (QueueClaim?) -> Void
    ) {
        state = Locked(State(current: claim))
        self.lease = lease
        self.storage = storage
        self.deadlines = deadlines
        self.now = now
        self.renewed = renewed
    }

    func start() { scheduleNext() }

    /// No renewal starts from now on; one in progress is cancelled.
    func stop() {
        let (pending, renewing) = state.withLock { state in
            state.stopped = true
            defer { (state.pending, state.renewing) = (nil, nil) }
            return (state.pending, state.renewing)
        }
        if let pending { deadlines.cancel(pending) }
        renewing?.cancel()
    }

    private func scheduleNext() {
        let token = deadlines.schedule(after: lease / 3) { [self] in renewNow() }
        let stopped = state.withLock { state in
            if !state.stopped { state.pending = token }
            return state.stopped
        }
        if stopped { deadlines.cancel(token) }
    }

    private func renewNow() {
        state.withLock { state in
            guard !state.stopped else { return }
            state.pending = nil
            state.renewing = Task { await self.renew() }
        }
    }

    private func renew() async {
        let current = state.withLock { $0.current }
        do {
            let claim = try await storage.renew(current, now: now(), lease: lease)
            state.withLock { $0.current = claim }
            // The next renewal is due a third of the lease from now whoever hears of this one first.
            if !Task.isCancelled { scheduleNext() }
            renewed(claim)
        } catch OfflineQueueError.claimLost {
            renewed(nil)
        } catch {
            // Tried again a third of the lease later.
            if !Task.isCancelled { scheduleNext() }
        }
    }
}
