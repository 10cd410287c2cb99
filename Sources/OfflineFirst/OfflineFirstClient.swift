import Foundation
import OfflineQueue
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The one object a screen talks to: reads that survive offline (`CachedRequestEngine`), writes
/// that survive offline (`OfflineQueueEngine`), and the two meeting — what the user saved offline
/// shows in the screens that read it, across relaunches, until the server has it.
///
/// ```swift
/// let client = OfflineFirstClient(
///     reads: CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor),
///     queue: OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: store),
///     optimisticUpdates: [OptimisticUpdate(
///         mutations: { $0.method == "POST" && $0.url.path == "/notes" },
///         reads: { $0.path == "/notes" },
///         apply: { notes, pending in try Notes.appending(pending.body, to: notes) }
///     )]
/// )
/// for try await notes in client.snapshots(for: NotesRequest(), mode: .offlineFirst, staleTime: .seconds(60)) {
///     render(notes.data, pending: notes.hasPendingWrites, offline: notes.isPaused)
/// }
/// try await client.mutate(CreateNote(text: "Milk"))   // shows in the list above before it returns
/// ```
///
/// - **Overlays are computed, never stored**: a read is the cached (or fetched) body with the
///   overlays of every matching pending queue entry applied in replay order, recomputed from the
///   durable queue — so a relaunch offline, in another process, after a kill at any moment, shows
///   the same screen, each write once (the guide's "Across a relaunch" has the three rules that
///   keep the cache and the queue telling one story). Entries enqueued straight on the queue
///   overlay too; a coalesced edit shows only its newest version.
/// - **Delivery**: a delivered entry's reads are marked stale (its `Invalidation`s, and the reads
///   its `OptimisticUpdate`s change) and live reads refetch; the entry stays applied until a
///   fetch that started after its delivery lands, so the screen never shows the server's state
///   from before the write in between.
/// - **Rollback**: an entry that fails for good (rejected, expired, dead-lettered, cancelled)
///   stops overlaying at once; live reads re-yield without it and report it in `rejectedWrites`.
///
/// The client listens to the queue's changes from its creation until it is released, to mark
/// delivered writes' reads stale even when no screen is showing them. Sources/OfflineFirst/OfflineFirst.docc/OfflineFirstGuide.md has
/// the state table.
public final class OfflineFirstClient: Sendable {
    public let reads: CachedRequestEngine
    public let queue: OfflineQueueEngine
    /// The queue storage's change feed, which the client follows (any `QueueStorage`).
    let feed: QueueChangeFeed
    public let optimisticUpdates: [OptimisticUpdate]
    public let invalidations: [Invalidation]

    private let progress: Progress
    private let listener: Task<Void, Never>
    /// Keeps the cache and the queue's files telling one story across a relaunch.
    let settlement: SettlementTracker
    /// Ends the tracker's view of the queue's changes.
    private let stopSettlementFeed: @Sendable () -> Void
    /// Whether the queue's replay still has to be started (once, at the client's first use).
    private let queueStartPending: Locked<Bool>
    /// The live reads running, so that `close()` can end them; and whether it was called.
    private let liveReads = Locked(LiveReads())

    private struct LiveReads: Sendable {
        var closed = false
        var tasks: [UInt64: Task<Void, Never>] = [:]
        var next: UInt64 = 0
    }

    /// - Parameters:
    ///   - reads: the engine the client reads through, with its cache.
    ///   - queue: the engine writes go through, over any `QueueStorage`: the client follows its
    ///     storage's `changeFeed` (a `DiskQueueStore` on a phone; `PostgresQueueStore` shows in a
    ///     live read the writes other replicas store).
    ///   - optimisticUpdates: how queued writes show in the reads they change.
    ///   - invalidations: which reads a delivered write makes stale.
    ///
    /// The client starts the queue's replay (`queue.start()`) the first time it is used — a read,
    /// a write, a wait — so a forgotten `start()` cannot leave writes, and the reads and waits
    /// that follow them, waiting for ever. Once only: a queue the app stops afterwards stays
    /// stopped until the app starts it again.
    public convenience init(
        reads: CachedRequestEngine,
        queue: OfflineQueueEngine,
        optimisticUpdates: [OptimisticUpdate] = [],
        invalidations: [Invalidation] = []
    ) {
        self.init(reads: reads, queue: queue, optimisticUpdates: optimisticUpdates, invalidations: invalidations, startsQueue: true)
    }

    /// With `startsQueue: false`, the queue replays only when its owner starts or flushes it: for
    /// tests that drive the passes themselves.
    init(
        reads: CachedRequestEngine,
        queue: OfflineQueueEngine,
        optimisticUpdates: [OptimisticUpdate],
        invalidations: [Invalidation],
        startsQueue: Bool
    ) {
        queueStartPending = Locked(startsQueue)
        self.reads = reads
        self.queue = queue
        self.optimisticUpdates = optimisticUpdates
        self.invalidations = invalidations
        // Delivered writes are recorded in the notes of the stored reads they change, and reads
        // that may hold a write of unknown fate are not stored (see `SettlementTracker`).
        let feed = queue.storage.changeFeed
        self.feed = feed
        let settlement = SettlementTracker(
            rules: optimisticUpdates, deadlines: queue.deadlines, isQueued: { [weak feed] id in feed?.contains(id: id) == true }
        ) { [weak reads] entry, matching in
            _ = await reads?.annotateStored(where: { url in matching.contains { $0.reads(url) } }) { note in
                SettlingNote.adding(entry, to: note)
            }
        }
        let observed = feed.observe { _, change in settlement.queueChanged(change) }
        settlement.seed(observed.entries, sendingAtOpen: feed.sendingAtOpen)
        self.settlement = settlement
        stopSettlementFeed = observed.stop
        reads.observeExchanges(with: settlement)
        queue.observeSends(with: settlement)
        let start = feed.sequencedChangesWithStart()
        let progress = Progress(entries: start.entries, sequence: start.sequence, rules: optimisticUpdates)
        self.progress = progress
        // Deliveries will mark reads by pattern: the cache's path tables are built ahead.
        if invalidations.contains(where: { $0.readPatterns != nil }) { reads.cache.prepareMarkingByPattern() }
        listener = Task { [reads, optimisticUpdates, invalidations] in
            for await (sequence, change) in start.changes {
                if case .removed(let entry, .delivered) = change {
                    // Every read a delivered write could have changed is stale now.
                    // Rules made of patterns are answered from the cache's index; closures run
                    // on every stored URL.
                    let applying = invalidations.filter { $0.mutations(entry) }
                    let rules =
                        optimisticUpdates.filter { $0.mutations(entry) }.map(\.reads)
                        + applying.filter { $0.readPatterns == nil }.map(\.reads)
                    let patterns = applying.flatMap { $0.readPatterns ?? [] }
                    if !rules.isEmpty {
                        reads.markStale { method, url in method == .get && rules.contains { $0(url) } }
                    }
                    if !patterns.isEmpty { reads.markStale(matching: patterns) }
                }
                progress.listenerApplied(change, sequence: sequence)
            }
        }
    }

    deinit {
        listener.cancel()
        stopSettlementFeed()
        queue.stopObservingSends(by: settlement)
        reads.stopObservingExchanges(by: settlement)
    }

    // MARK: - Writes

    /// Enqueues `request` on the queue (sent at once when online, else stored durably; see
    /// `OfflineQueueEngine.enqueue`). Its overlay is shown by every matching live read before
    /// this returns — from the moment it is offered to the network, while stored, and after
    /// delivery until the reads' refetch lands.
    ///
    /// - Throws: what `OfflineQueueEngine.enqueue` throws (a rejection, a full queue, a storage
    ///   failure); live reads then show it in `rejectedWrites`.
    @discardableResult
    public func mutate(_ request: some QueueableRequest) async throws -> EnqueueResult {
        if isClosed { throw OfflineQueueError.closed }
        await startQueueOnFirstUse()
        let result: EnqueueResult
        do {
            result = try await queue.enqueue(request)
        } catch {
            await progress.waitForLiveReads(through: feed.sequence)
            throw error
        }
        await progress.waitForLiveReads(through: feed.sequence)
        return result
    }

    /// Enqueues `request` as an edit of what `read` shows: the write carries the validators of
    /// the response stored for `read` (its `ETag`, else its `Last-Modified`) as its `EditBase`, so
    /// it is sent conditionally and never silently overwrites a version someone else wrote since
    /// (`412`; the queue's `ConflictResolver` decides then). A base the request sets itself
    /// stands; with nothing stored for `read`, or no validator on it, the write goes as `mutate(_:)`
    /// sends it. Otherwise as `mutate(_:)`.
    @discardableResult
    public func mutate(_ request: some QueueableRequest, editing read: some NetworkRequest) async throws -> EnqueueResult {
        guard request.editBase == nil, let validators = reads.storedValidators(for: read) else { return try await mutate(request) }
        return try await mutate(EditOfRead(wrapped: request, editBase: EditBase(etag: validators.etag, lastModified: validators.lastModified)))
    }

    /// Returns when every write pending now (stored, or being offered at once) has left the
    /// queue: delivered, or failed for good (Firestore's `waitForPendingWrites`). A write replaced
    /// by a newer edit of its coalescing key is waited for through that edit.
    ///
    /// - Throws: `NetworkError.cancelled` when the calling task is cancelled.
    public func waitForPendingWrites() async throws {
        try throwIfClosed()
        await startQueueOnFirstUse()
        let start = feed.sequencedChangesWithStart()  // stored and offered, with the feed from then on
        var waiting = Set(start.entries.map(\.id))
        guard !waiting.isEmpty else { return }
        for await (_, change) in start.changes {
            switch change {
            case .removed(let entry, _):
                waiting.remove(entry.id)
            case .stored(let entry, let replacing?) where waiting.contains(replacing):
                waiting.remove(replacing)
                waiting.insert(entry.id)
            default:
                break
            }
            if waiting.isEmpty { return }
        }
        throw NetworkError.cancelled
    }

    /// The pending writes in replay order, each with its state (waiting, sending, retrying with
    /// its attempts, next attempt time and last error): at once, then on every change. A slow
    /// consumer sees the latest list. Ends when the consuming task is cancelled.
    public var pendingWrites: AsyncStream<[PendingWrite]> {
        let start = feed.sequencedChangesWithStart()
        return AsyncStream(bufferingPolicy: .bufferingNewest(1)) { continuation in
            let task = Task {
                var mirror = QueueMirror(start.entries)
                continuation.yield(Self.pendingWrites(mirror))
                for await (_, change) in start.changes {
                    guard case .none = mirror.apply(change) else {
                        continuation.yield(Self.pendingWrites(mirror))
                        continue
                    }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    private static func pendingWrites(_ mirror: QueueMirror) -> [PendingWrite] {
        mirror.entries.map { entry in
            // An offered request (sequence 0: not stored yet) is in its first attempt.
            let state: PendingWrite.State =
                if let conflict = entry.conflict {
                    .conflicted(statusCode: conflict.statusCode)
                } else if mirror.sending.contains(entry.id) || entry.sequence == 0 {
                    .sending
                } else if entry.attempts > 0 {
                    .retrying(attempts: entry.attempts, nextAttemptAt: entry.nextAttemptAt, lastError: entry.lastError)
                } else {
                    .waiting
                }
            return PendingWrite(entry: entry, state: state)
        }
    }

    // MARK: - Reads

    /// One snapshot: `CachedRequestEngine.response(for:mode:staleTime:)` (waiting while offline
    /// as the mode says) with the overlays of every matching pending write — and of every matching
    /// delivered write the body lacks (`settlingEntryIDs`): those a stored body's note records
    /// (delivered since it was stored, also before a relaunch), those delivered while a body from
    /// the network was fetched. A stale stored body, shown offline or while it is revalidated,
    /// never hides a write the server already took; no write is applied twice.
    ///
    /// - Throws: what the read throws when no body can be had (`NetworkError`).
    public func snapshot(for request: some NetworkRequest, mode: NetworkMode, staleTime: StaleTime) async throws -> QuerySnapshot {
        try throwIfClosed()
        await startQueueOnFirstUse()
        // Writes delivered before now have made their reads stale before this one reads.
        let started = feed.sequence
        await progress.waitForListener(through: started)
        let answer = try await reads.response(for: request, mode: mode, staleTime: staleTime)
        let reading = Set(optimisticUpdates.indices.filter { optimisticUpdates[$0].reads(request.url) })
        guard !reading.isEmpty else {
            return QuerySnapshot(
                data: answer.data, response: answer.response, source: answer.source == .network ? .network : .cache,
                isStale: answer.isStale, pendingEntryIDs: [], conflictedEntryIDs: [], settlingEntryIDs: [], rejectedWrites: [],
                overlayFailures: [], isPaused: false, isFetching: false, lastFetchError: nil
            )
        }
        // A body fetched (or stored) after the writes delivered before this read began has them:
        // they settle. A stale stored body predates them: they stay applied (settling).
        // An error status from the server is not the read's body: it settles nothing.
        let fetchedSinceDeliveries = answer.source == .network ? (200...299).contains(answer.response.statusCode) : !answer.isStale
        let (delivered, pending) = progress.overlays(reading: reading, settledThrough: fetchedSinceDeliveries ? started : nil)
        // Which delivered writes the body lacks: a stored body says so itself — its note holds
        // every write delivered since it was stored (by this process or one before a relaunch), in
        // order, and it holds the others; a body from the network lacks those delivered while it
        // was fetched. Each write is applied once, settling before pending.
        let settling =
            answer.source == .cache
            ? SettlingNote.entries(answer.note).map { entry in
                QueueMirror.Item(entry: entry, rules: optimisticUpdates.indices.filter { optimisticUpdates[$0].mutations(entry) })
            }
            : delivered
        // A queued write a note says was delivered (its file outlived the delivery) is not pending.
        settlement.learn(from: answer.note)
        let settled = Overlays.apply(settling, to: Overlays.Result(data: answer.data), rules: optimisticUpdates, only: reading)
        let overlaid = Overlays.apply(
            pending, to: Overlays.Result(data: settled.data), rules: optimisticUpdates, only: reading,
            skipping: settlement.knownDeliveredIDs.union(settling.map(\.entry.id)))
        return QuerySnapshot(
            data: overlaid.data, response: answer.response, source: answer.source == .network ? .network : .cache,
            isStale: answer.isStale, pendingEntryIDs: overlaid.applied,
            conflictedEntryIDs: pending.filter { $0.entry.conflict != nil && overlaid.applied.contains($0.entry.id) }.map(\.entry.id),
            settlingEntryIDs: settled.applied, rejectedWrites: [],
            overlayFailures: settled.failures + overlaid.failures, isPaused: false, isFetching: false, lastFetchError: nil
        )
    }

    /// A live read: a snapshot at once — what the cache holds, with the overlays of every matching
    /// pending write, without waiting for anything — and again on every change beneath it: a
    /// fetch landing or failing, a matching write offered, stored, coalesced, delivered, rejected
    /// or cancelled, connectivity (`isPaused`). It fetches when nothing is stored, when what is
    /// stored is stale, when a delivered write made it stale, and at once in mode `.always`;
    /// while offline it waits (`isPaused`) and fetches when connectivity returns.
    ///
    /// It never finishes on its own: cancelling the consuming task (or dropping the stream) ends
    /// it and everything it started. A fetch failure does not end it either: the snapshot keeps
    /// what it showed, with `lastFetchError`. A slow consumer sees the latest snapshot.
    public func snapshots(for request: some NetworkRequest, mode: NetworkMode, staleTime: StaleTime) -> AsyncThrowingStream<QuerySnapshot, any Error> {
        let read = LiveRead(request: PreparedRequest(request), mode: mode, staleTime: staleTime, client: self)
        return AsyncThrowingStream(bufferingPolicy: .bufferingNewest(1)) { continuation in
            // Registered before it runs (and taken out when it ends), so `close()` finds it.
            let task = liveReads.withLock { reads -> Task<Void, Never>? in
                guard !reads.closed else { return nil }
                let number = reads.next
                reads.next += 1
                let task = Task { [liveReads] in
                    await read.run(continuation)
                    liveReads.withLock { _ = $0.tasks.removeValue(forKey: number) }
                }
                reads.tasks[number] = task
                return task
            }
            guard let task else { return continuation.finish(throwing: NetworkError.cancelled) }  // closed
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    // MARK: - Closing

    /// Ends the client, so that another (the next user's, after a switch) can open the same
    /// folders at once: cancels every live read and the fetches they started, stops the queue's
    /// replay, and closes the queue's store and the cache (`OfflineQueueEngine.close()`,
    /// `DiskResponseCache.close()`), which finish the writes in progress and let go of their
    /// folders. Returns when both folders are free.
    ///
    /// Afterwards a live read ends at once and a one-shot read or `waitForPendingWrites()` throws,
    /// as cancelled ones do (`NetworkError.cancelled`); `mutate` throws `OfflineQueueError.closed`.
    /// What was queued stays in the folder for the next client on it. A call in flight while
    /// `close()` runs ends as its layer says (a write either stored before the store closed, or
    /// refused); a replay pass the app started itself (`queue.flush()`) finishes its entry in
    /// flight, whose completion the closed store may not record: it is sent again by the next
    /// owner, with its `Idempotency-Key` (at-least-once). Closing twice is closing once.
    public func close() async {
        let running = liveReads.withLock { reads in
            reads.closed = true
            return Array(reads.tasks.values)
        }
        for task in running { task.cancel() }
        for task in running { await task.value }
        listener.cancel()
        await listener.value
        stopSettlementFeed()
        queue.stopObservingSends(by: settlement)
        reads.stopObservingExchanges(by: settlement)
        await queue.close()
        await reads.cache.close()
    }

    /// Whether `close()` was called.
    public var isClosed: Bool { liveReads.withLock { $0.closed } }

    private func throwIfClosed() throws {
        if isClosed { throw NetworkError.cancelled }
    }

    // MARK: - Internals

    /// Starts the queue's replay at the client's first use (see `init`); later calls do nothing.
    func startQueueOnFirstUse() async {
        let pending = queueStartPending.withLock { pending in
            defer { pending = false }
            return pending
        }
        guard pending else { return }
        await queue.start()
    }

    /// One live read's loop: its own view of the queue (a mirror fed by the change feed from the
    /// moment it starts), connectivity, and its fetches, all handled one event at a time.
    private struct LiveRead: Sendable {
        let request: PreparedRequest
        let mode: NetworkMode
        let staleTime: StaleTime
        let client: OfflineFirstClient

        enum Event: Sendable {
            case change(UInt64, QueueChange)
            case connectivity(Bool)
            /// A fetch ended; with the deliveries finished when its request took its turn, if known.
            case fetched(Int, Result<CachedResponse, NetworkError>, deliveriesBefore: UInt64?)
        }

        func run(_ continuation: AsyncThrowingStream<QuerySnapshot, any Error>.Continuation) async {
            await client.startQueueOnFirstUse()
            let url = request.url
            let rules = client.optimisticUpdates.filter { $0.reads(url) }
            let invalidations = client.invalidations.filter { $0.reads(url) }
            let (events, inbox) = AsyncStream<Event>.makeStream()
            // Queue changes go straight into the inbox as they are published (no forwarding task).
            let start = client.feed.observe { sequence, change in inbox.yield(.change(sequence, change)) }
            defer { start.stop() }
            let monitor = client.reads.reachabilityMonitor
            let connectivity = await monitor.connectivity
            let registration = client.progress.register(at: start.sequence)
            defer { client.progress.unregister(registration) }
            // Writes delivered before this read began have made what it reads stale first.
            await client.progress.waitForListener(through: start.sequence)
            let stored = client.reads.storedResponse(for: request, staleTime: staleTime)
            client.settlement.learn(from: stored?.note ?? Data())
            var state = LiveReadState(
                rules: rules,
                invalidatedBy: { entry in invalidations.contains { $0.mutations(entry) } },
                entries: start.entries,
                stored: stored,
                fetchAtOnce: mode == .always,
                connected: await monitor.isConnected,
                knownDelivered: client.settlement.knownDeliveredIDs
            )
            // A discarding group: finished fetches must not pile up until the read ends.
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await connected in connectivity { inbox.yield(.connectivity(connected)) }
                }
                continuation.yield(state.snapshot())
                if state.shouldFetch { startFetch(&state, group: &group, inbox: inbox) }
                for await event in events {
                    var changed: Bool
                    var sequence: UInt64?
                    switch event {
                    case .change(let number, let change):
                        changed = state.apply(change)
                        sequence = number
                    case .connectivity(let connected):
                        changed = state.setConnected(connected)
                    case .fetched(let number, .success(let response), let deliveries):
                        let settlement = client.settlement
                        state.fetchLanded(number, response) { id in deliveries.map { settlement.wasDelivered(id, within: $0) } ?? false }
                        changed = true
                    case .fetched(let number, .failure(let error), _):
                        state.fetchFailed(number, error)
                        changed = true
                    }
                    if state.takeDeliveryInvalidation() {
                        // Before the refetch: what the origin sent before the delivery must not answer it.
                        client.reads.markStale(for: request)
                    }
                    if state.shouldFetch {
                        startFetch(&state, group: &group, inbox: inbox)
                        changed = true
                    }
                    if changed { continuation.yield(state.snapshot()) }
                    if let sequence { client.progress.liveRead(registration, reached: sequence) }
                }
                group.cancelAll()
            }
            continuation.finish(throwing: NetworkError.cancelled)
        }

        private func startFetch(_ state: inout LiveReadState, group: inout DiscardingTaskGroup, inbox: AsyncStream<Event>.Continuation) {
            let (number, followsDelivery) = state.fetchStarted()
            let (reads, staleTime) = (client.reads, staleTime)
            let request = followsDelivery ? request.revalidating() : request
            group.addTask {
                let admission = SettlementTracker.FetchAdmission()
                do {
                    // `.always`: the fetch is decided here (stale, invalidated, or asked for); the
                    // store must not answer it, nor the monitor hold it.
                    let response = try await SettlementTracker.FetchAdmission.$current.withValue(admission) {
                        try await reads.response(for: request, mode: .always, staleTime: staleTime)
                    }
                    // An error status is not the read's body: what is shown stays.
                    guard (200...299).contains(response.response.statusCode) else {
                        throw NetworkError.httpError(statusCode: response.response.statusCode, data: response.data)
                    }
                    inbox.yield(.fetched(number, .success(response), deliveriesBefore: admission.deliveriesBefore))
                } catch {
                    inbox.yield(.fetched(number, .failure(NetworkError(mapping: error)), deliveriesBefore: nil))
                }
            }
        }
    }

    /// What the client's listener and its live reads have handled of the queue's changes, so
    /// that `mutate` can return once every live read shows the write, and `snapshot` can read
    /// once every delivered write has made its reads stale.
    final class Progress: Sendable {
        private struct State: Sendable {
            /// The queue as the listener has seen it (stored and offered entries).
            var mirror: QueueMirror
            var listenerSequence: UInt64
            var liveReads: [UInt64: UInt64] = [:]
            var nextRegistration: UInt64 = 0
            /// Tagged with the sequence they wait for: the listener's (`listener`) or every live
            /// read's (`liveReads`).
            var waiters = WaiterList<Void, Wait>()
            /// Delivered writes some update applies to, with the change sequence of their
            /// delivery, oldest first: one-shot reads keep them applied until a read of theirs
            /// gets a body fetched after the delivery (at most `settlingLimit`).
            var settling: [(item: QueueMirror.Item, sequence: UInt64)] = []
        }

        /// How many delivered writes one-shot reads keep applied before the oldest is let go.
        static let settlingLimit = 256

        enum Wait: Sendable, Equatable {
            case listener(UInt64)
            case liveReads(UInt64)
        }

        private let state: Locked<State>

        init(entries: [QueueEntry], sequence: UInt64, rules: [OptimisticUpdate]) {
            // Every pending write is kept, with the updates that apply to it worked out once.
            let mirror = QueueMirror(entries) { entry in rules.indices.filter { rules[$0].mutations(entry) } }
            state = Locked(State(mirror: mirror, listenerSequence: sequence))
        }

        /// For a one-shot read of the updates `reading`: the delivered writes still settling and
        /// the pending writes that apply to it, in order. With `settledThrough`, the read's body
        /// was fetched after every delivery up to that sequence: those writes settle (are let go).
        func overlays(reading: Set<Int>, settledThrough: UInt64?) -> (settling: [QueueMirror.Item], pending: [QueueMirror.Item]) {
            state.withLock { state in
                let applies = { (item: QueueMirror.Item) in item.rules.contains { reading.contains($0) } }
                if let settledThrough {
                    state.settling.removeAll { $0.sequence <= settledThrough && applies($0.item) }
                }
                return (state.settling.map(\.item).filter(applies), state.mirror.overlaying)
            }
        }

        func listenerApplied(_ change: QueueChange, sequence: UInt64) {
            let ready = state.withLock { state in
                if case .removed(let entry, .delivered) = change, let item = state.mirror.overlaying.first(where: { $0.entry.id == entry.id }) {
                    state.settling.append((item, sequence))
                    if state.settling.count > Self.settlingLimit { state.settling.removeFirst(state.settling.count - Self.settlingLimit) }
                }
                _ = state.mirror.apply(change)
                state.listenerSequence = sequence
                return Self.takeReady(&state)
            }
            for waiter in ready { waiter.resume(returning: ()) }
        }

        func register(at sequence: UInt64) -> UInt64 {
            state.withLock { state in
                defer { state.nextRegistration += 1 }
                state.liveReads[state.nextRegistration] = sequence
                return state.nextRegistration
            }
        }

        func unregister(_ registration: UInt64) {
            let ready = state.withLock { state in
                state.liveReads[registration] = nil
                return Self.takeReady(&state)
            }
            for waiter in ready { waiter.resume(returning: ()) }
        }

        func liveRead(_ registration: UInt64, reached sequence: UInt64) {
            let ready = state.withLock { state -> [WaiterList<Void, Wait>.Waiter] in
                guard state.liveReads[registration] != nil else { return [] }
                state.liveReads[registration] = sequence
                return Self.takeReady(&state)
            }
            for waiter in ready { waiter.resume(returning: ()) }
        }

        /// Returns once the listener has handled every change up to `sequence` (or the task is cancelled).
        func waitForListener(through sequence: UInt64) async {
            await state.wait(on: \.waiters, tag: .listener(sequence), cancelled: ()) { state in
                state.listenerSequence >= sequence ? () : nil
            }
        }

        /// Returns once every live read has handled every change up to `sequence` (or the task is
        /// cancelled).
        func waitForLiveReads(through sequence: UInt64) async {
            await state.wait(on: \.waiters, tag: .liveReads(sequence), cancelled: ()) { state in
                state.liveReads.values.allSatisfy { $0 >= sequence } ? () : nil
            }
        }

        private static func takeReady(_ state: inout State) -> [WaiterList<Void, Wait>.Waiter] {
            guard !state.waiters.isEmpty else { return [] }  // most live reads' steps: nobody waits
            let listener = state.listenerSequence
            let slowest = state.liveReads.values.min() ?? .max
            return state.waiters.takeAll { wait in
                switch wait {
                case .listener(let sequence): listener >= sequence
                case .liveReads(let sequence): slowest >= sequence
                }
            }
        }
    }
}

extension PreparedRequest {
    /// This request with `no-cache` added to its `Cache-Control`: answered by the origin itself.
    func revalidating() -> PreparedRequest {
        settingHeader("Cache-Control", to: header("Cache-Control").map { $0 + ", no-cache" } ?? "no-cache")
    }
}

/// A request as an edit of a read's version: every field the caller's, with the base captured by
/// `OfflineFirstClient.mutate(_:editing:)`.
struct EditOfRead<Wrapped: QueueableRequest>: QueueableRequest {
    let wrapped: Wrapped
    let editBase: EditBase?

    var url: URL { wrapped.url }
    var method: HTTPMethod { wrapped.method }
    var headers: [String: String] { wrapped.headers }
    var body: Data? { wrapped.body }
    var timeout: TimeInterval { wrapped.timeout }
    var maximumResponseBodySize: Int? { wrapped.maximumResponseBodySize }
    var deadline: Duration? { wrapped.deadline }
    var requestPriority: RequestPriority { wrapped.requestPriority }
    var ttl: TimeInterval { wrapped.ttl }
    var priority: QueuePriority { wrapped.priority }
    /// Read through: its default is a fresh UUID per read, and the queue reads it once.
    var idempotencyKey: String { wrapped.idempotencyKey }
    var orderingKey: String? { wrapped.orderingKey }
    var coalescingKey: String? { wrapped.coalescingKey }
}
