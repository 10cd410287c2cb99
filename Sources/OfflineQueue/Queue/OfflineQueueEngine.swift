import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends mutations now when it can, keeps them durably when it cannot, and replays them in
/// priority/FIFO order when the network returns — at least once, with the same `Idempotency-Key`.
///
/// ```swift
/// let queue = OfflineQueueEngine(
///     requestEngine: AsyncRequestEngine(),
///     reachabilityMonitor: NetworkReachabilityMonitor(),
///     store: try DiskQueueStore(directory: folder)
/// )
/// await queue.start()                          // replays on reconnect and when backoffs end
/// try await queue.enqueue(PostComment(...))    // sent now, or queued durably
/// ```
///
/// `try OfflineQueueEngine(reachabilityMonitor: monitor)` uses the default folder (SwiftResilience's
/// spelling; it throws when that folder cannot be opened).
///
/// See Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md for the outcome table, the file format and the durability argument.
public actor OfflineQueueEngine {
    /// Replay settings.
    public struct Configuration: Sendable {
        /// Backoff between attempts of one entry: `delay(forAttempt: attempts - 1)` after a
        /// transient failure. Returning `nil` dead-letters the entry. Default: exponential from
        /// 1 s, doubling, capped at 5 minutes, equal jitter, unlimited.
        public var retryPolicy: any RetryPolicy
        /// Failed attempts after which an entry moves to `dead-letter/`. `nil` (default): never.
        public var maxAttempts: Int?
        /// Longest wait honoured from a `Retry-After` on 429/503. Default 1 hour.
        public var maximumRetryAfter: Duration
        /// While started, how long after a send found the network unreachable (`noConnection`)
        /// the queue tries again even if the monitor never reports a change — the monitor may say
        /// "connected" while sends fail (captive portal, data not allowed). Default 30 s.
        public var offlineRecheckInterval: Duration
        /// What counts as a secret at enqueue: secret headers and the URL's fragment are stripped
        /// from the stored entry, user-info and secret query or path parameters are refused.
        /// Default `.standard`.
        public var secretPolicy: QueueSecretPolicy
        /// Called for each replay (not for the first attempt, which carries the caller's own
        /// headers) to re-add headers the secret policy stripped, such as an API key; each
        /// replaces a stored header of the same name. Tokens need no hook: replay through
        /// `AuthenticatedRequestEngine`. Default `nil`.
        public var replayHeaders: (@Sendable (QueueEntry) async -> [String: String])?
        /// On storage many consumers share (a `QueueStorage` other than `DiskQueueStore`): how long
        /// a claimed entry stays this engine's without a renewal. The engine renews it every third
        /// of this while the entry's request is in flight; a replica that dies lets it run out, and
        /// another replica claims the entry then. Default 30 s.
        public var claimLease: Duration
        /// On storage many consumers share: how often a started engine looks for work nobody
        /// announced (a lease that ran out, a missed notification), besides the storage's
        /// `arrivals()`. Default 5 s.
        public var storagePollInterval: Duration

        public init(
            retryPolicy: any RetryPolicy = ExponentialRetryPolicy(maxRetries: .max, baseDelay: 1, maxDelay: 300, jitter: .equal),
            maxAttempts: Int? = nil,
            maximumRetryAfter: Duration = .seconds(3600),
            offlineRecheckInterval: Duration = .seconds(30),
            secretPolicy: QueueSecretPolicy = .standard,
            replayHeaders: (@Sendable (QueueEntry) async -> [String: String])? = nil,
            claimLease: Duration = .seconds(30),
            storagePollInterval: Duration = .seconds(5)
        ) {
            self.retryPolicy = retryPolicy
            self.maxAttempts = maxAttempts.map { max(1, $0) }
            self.maximumRetryAfter = max(.zero, maximumRetryAfter)
            self.offlineRecheckInterval = max(.milliseconds(1), offlineRecheckInterval)
            self.secretPolicy = secretPolicy
            self.replayHeaders = replayHeaders
            self.claimLease = max(.milliseconds(3), claimLease)
            self.storagePollInterval = max(.milliseconds(1), storagePollInterval)
        }
    }

    /// The most entries the queue holds; `enqueue` throws `OfflineQueueError.full` beyond it.
    /// Enforced by the store, so it holds under any number of concurrent enqueues.
    public nonisolated let maxQueueSize: Int
    /// Where the entries live: a `DiskQueueStore` (an app's queue), or another `QueueStorage`
    /// that many consumers share (`PostgresQueueStore`, from the Integrations package).
    public nonisolated let storage: any QueueStorage
    /// `storage` when it is a `DiskQueueStore`: the engine then takes its own path for the disk
    /// (deferred deletions, durable deletions before a coalesced edit goes).
    package nonisolated let disk: DiskQueueStore?
    /// SwiftResilience's name for `storage` (`engine.store.load()`, `engine.store.count()` read
    /// it on every storage). The disk store's own API is `storage as? DiskQueueStore`, or the
    /// store the app made and kept.
    public nonisolated var store: any QueueStorage { storage }
    public nonisolated let configuration: Configuration

    private let sender: any RequestSending
    /// The monitor this queue follows (a drain service subscribes to the same one).
    public nonisolated let reachabilityMonitor: any ReachabilityMonitoring
    private var reachability: any ReachabilityMonitoring { reachabilityMonitor }
    let time: TimeSource
    /// Bounds enqueues' first attempts and claimed sends' leases (one sleeping task for all of them),
    /// and a layer above's waits on the queue's clock.
    package nonisolated let deadlines: DeadlineTimer
    private let wallClockOrigin: Date

    /// Which stored entries are being sent or replaced, and what an attempt's end does to them.
    var lifecycle = QueueEntryLifecycle()
    /// One line per ordering or coalescing key: enqueues that share a key run one at a time, in
    /// arrival order (the count includes the holder and everyone waiting).
    private var keyLines: [String: (gate: AdmissionGate, users: Int)] = [:]
    var learnedOffline = false
    /// One drain pass at a time, whoever triggers it; FIFO; a cancelled waiter leaves the line.
    private let passGate = AdmissionGate(limit: 1)
    /// Stopped, started (its tasks, its timer idle or armed, timers firing) or closed: see
    /// `QueueEngineLifecycle`.
    private var life = QueueEngineLifecycle()
    private nonisolated let subscribers = StreamSubscribers<QueueEntryResult>()
    /// Told of each send on the disk path (`observeSends(with:)`).
    nonisolated let sendObserver = Locked<(any QueueSendObserver)?>(nil)
    /// Observed entries that may be in the server's state — on the wire now, or sent without an
    /// answer that says otherwise — and still queued: noted in the folder before each observed
    /// replay, so that the next launch knows them (`DiskQueueStore.sendingAtOpen`).
    private var possiblySent: Set<UUID> = []

    /// A queue on `store`: a `DiskQueueStore` (an app's queue, in a folder), or any other
    /// `QueueStorage`, such as a table a service's replicas share (`PostgresQueueStore`, from the
    /// Integrations package).
    ///
    /// On storage other than a disk store, entries are claimed under `configuration.claimLease`,
    /// renewed while their request is in flight; while started, the engine also looks for work every
    /// `configuration.storagePollInterval` (an expired lease, an entry another consumer added),
    /// besides the storage's `arrivals()`. `items` and `pendingCount()` read the storage;
    /// `pendingCounts` and `changes` follow its `changeFeed`.
    ///
    /// - Parameters:
    ///   - requestEngine: sends the first attempt and every replay; any `RequestSending`
    ///     (`AsyncRequestEngine`, or `AuthenticatedRequestEngine` so tokens refresh during a drain).
    ///   - reachabilityMonitor: says when the network is usable.
    ///   - store: where entries live.
    ///   - maxQueueSize: the most entries held (default 500).
    ///   - configuration: backoff, dead-lettering, Retry-After cap, leases.
    ///   - clock: the clock backoff timers run on; wall-clock times (TTL, next attempt) advance with it.
    public init(
        requestEngine: some RequestSending = AsyncRequestEngine(),
        reachabilityMonitor: any ReachabilityMonitoring,
        store: some QueueStorage,
        maxQueueSize: Int = 500,
        configuration: Configuration = Configuration(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.sender = requestEngine
        self.reachabilityMonitor = reachabilityMonitor
        self.storage = store
        self.disk = store as? DiskQueueStore
        self.maxQueueSize = max(0, maxQueueSize)
        self.configuration = configuration
        self.time = TimeSource(clock)
        self.deadlines = DeadlineTimer(time: self.time)
        self.wallClockOrigin = SimulationPoints.date()  // Date() but under a simulation
    }

    /// A queue on the default folder — SwiftResilience's `OfflineQueueEngine(reachabilityMonitor:)`:
    /// the same as passing `store: try DiskQueueStore()`, whose folder is
    /// `Application Support/Resilience/OfflineQueue` (on Linux `~/.local/share/Resilience/OfflineQueue`,
    /// or under `$XDG_DATA_HOME`).
    ///
    /// - Throws: what opening that folder throws: `OfflineQueueError.folderInUse` when another
    ///   store owns it (a second queue on the default folder, in this process or another — give
    ///   each queue its own folder with `store:`), `OfflineQueueError.storage` when it cannot be
    ///   created, locked or read. Nothing is ever silently dropped for want of a folder.
    public init(
        requestEngine: some RequestSending = AsyncRequestEngine(),
        reachabilityMonitor: any ReachabilityMonitoring,
        maxQueueSize: Int = 500,
        configuration: Configuration = Configuration(),
        clock: some Clock<Duration> = ContinuousClock()
    ) throws {
        self.init(
            requestEngine: requestEngine,
            reachabilityMonitor: reachabilityMonitor,
            store: try DiskQueueStore(),
            maxQueueSize: maxQueueSize,
            configuration: configuration,
            clock: clock
        )
    }

    /// The current wall-clock time as the queue sees it: the moment the engine was made plus the
    /// time elapsed on its clock (so a `ManualClock` moves TTLs and backoffs in tests).
    public nonisolated var now: Date { wallClockOrigin.addingTimeInterval(time.now().seconds) }

    // MARK: - Enqueue

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
                switch QueueEntryLifecycle.firstAttemptEnded(outcome) {
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
            entry = try await persist(request, id: id, key: key, attempts: attempts, nextAttemptAt: nextAttemptAt, lastError: lastError)
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

    // MARK: - Inspect and manage

    /// Entries in replay order (priority descending, FIFO within a priority): none when the
    /// storage cannot be read (`storage.queuedEntries()` throws its error).
    public var items: [QueueEntry] {
        get async { (try? await storage.queuedEntries()) ?? [] }
    }

    /// The number of queued entries (expired ones included until a pass sweeps them): 0 when the
    /// storage cannot be read (`storage.queuedCount()` throws its error).
    public func pendingCount() async -> Int {
        (try? await storage.queuedCount()) ?? 0
    }

    /// A new stream for each access: the number of queued entries at once, then every change (as
    /// entries are queued, delivered, failed, expired, dead-lettered or cancelled), on any storage
    /// (`storage.changeFeed.counts`). Built for an "offline · 3 pending" indicator; combine it with
    /// the monitor's `connectivity` (see Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md).
    /// A slow consumer sees the latest count.
    public nonisolated var pendingCounts: AsyncStream<Int> { storage.changeFeed.counts }

    /// Removes an entry without sending it. Returns whether it was removed: `false` when it was not
    /// queued, or when its file could not be deleted (a read-only folder) — it then stays queued.
    /// An entry being sent at this moment cannot be recalled; its outcome is then discarded.
    @discardableResult
    public func cancel(id: UUID) async -> Bool {
        guard let cancelled = try? await storage.queuedEntry(id: id), (try? await storage.cancel(id: id)) == true else { return false }
        // The first entry of an ordering or coalescing key holds its followers back, and the
        // backoff timer counts only first entries: a follower with no wait of its own would
        // otherwise wait for the cancelled one's backoff, or for the next reconnect. A pass now
        // decides.
        if cancelled.orderingKey != nil || cancelled.coalescingKey != nil { scheduleTimerIfNeeded(for: now) }
        return true
    }

    /// Removes every entry.
    public func clear() async throws {
        try await storage.removeAll()
    }

    /// `storage.changeFeed.changes`: every change to the entries, in order (stored, updated,
    /// attempts starting and ending, removed and why), on any storage.
    public nonisolated var changes: AsyncStream<QueueChange> { storage.changeFeed.changes }

    /// A new stream of per-entry results for each access; it ends when the engine is deinitialised.
    public var results: AsyncStream<QueueEntryResult> {
        subscribers.stream(bufferingPolicy: .bufferingNewest(10_000))
    }

    // MARK: - Draining

    /// Runs one drain pass now and returns what it did. Waits for a pass already running to end
    /// first (passes never overlap, whoever triggers them). Cancelling the calling task ends the
    /// pass: the request in flight is cancelled and its entry stays queued with its attempt count
    /// unchanged (`wasCancelled` is set); a flush cancelled while it waits for another pass returns
    /// without sending anything.
    ///
    /// The pass follows the reachability monitor: while it says offline, nothing is sent (expired
    /// entries are still swept) and the report says `endedOffline`. `flush(.ignoringReachability)`
    /// sends anyway.
    @discardableResult
    public func flush() async -> FlushReport {
        await runPass(.flush)
    }

    /// Whether a `flush(_:)` pass follows the reachability monitor.
    public enum FlushMode: Sendable, Hashable {
        /// Nothing is sent while the monitor says offline (what `flush()` does).
        case followingReachability
        /// The pass sends even while the monitor says offline — for when something else vouches for
        /// the network (a background task the system granted because the network is up, a monitor
        /// that lags behind). A send that finds no network (`noConnection`) still ends the pass,
        /// leaving that entry untouched.
        case ignoringReachability
    }

    /// Like `flush()`, following the reachability monitor or not.
    @discardableResult
    public func flush(_ mode: FlushMode) async -> FlushReport {
        await runPass(.flush, ignoringReachability: mode == .ignoringReachability)
    }

    /// Starts draining automatically: a pass now if connected, one on every reconnect, and one when
    /// the earliest backoff ends. Calling it again while started does nothing.
    public func start() {
        _ = life.start {
            let stream = Task { await reachability.connectivity }
            let loop = Task { [weak self] in
                for await connected in await stream.value {
                    guard let self, !Task.isCancelled else { return }
                    await self.connectivityChanged(connected)
                }
            }
            return (loop, followArrivals())
        }
    }

    /// Stops automatic draining and waits for a pass in flight to end (its entry in flight stays
    /// queued). `start()` may be called again afterwards.
    public func stop() async {
        await end(life.stop())
    }

    /// Cancels the tasks a stop or close took out of `life`, then waits for each.
    private func end(_ tasks: [Task<Void, Never>]) async {
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }

    /// Whether `start()` is in effect.
    public var isStarted: Bool { life.isStarted }

    /// `stop()`, then closes the storage (`QueueStorage.close()`: a `DiskQueueStore` lets go of its
    /// folder, so another store, another user's after a switch, can open it at once). The engine
    /// sends nothing afterwards; an `enqueue` throws the storage's `closed` error.
    public func close() async {
        await end(life.close())
        await storage.close()
    }

    /// Tells `observer` of every send it observes from now on (replacing an observer installed
    /// before); on a `DiskQueueStore`, such an entry's file is then deleted at once when it is
    /// delivered, and the entries that may be on the wire are noted for the next launch.
    package nonisolated func observeSends(with observer: any QueueSendObserver) {
        sendObserver.withLock { $0 = observer }
    }

    /// The observer of `entry`'s sends, if one is installed and observes it.
    func observer(of entry: QueueEntry) -> (any QueueSendObserver)? {
        sendObserver.withLock { $0 }.flatMap { $0.observes(entry) ? $0 : nil }
    }

    /// Stops telling `observer` (if it is still the one installed).
    package nonisolated func stopObservingSends(by observer: AnyObject) {
        sendObserver.withLock { current in
            if let installed = current as AnyObject?, installed === observer { current = nil }
        }
    }

    // MARK: - Internals: sending

    private func mayTrySending(_ request: some QueueableRequest) async -> Bool {
        guard !learnedOffline, await reachability.isConnected else { return false }
        // Entries already waiting with the same ordering or coalescing key must go first; the
        // storage says when nothing such can be in it (see `QueueStorage.maySendAtOnce`).
        return await storage.maySendAtOnce(orderingKey: request.orderingKey, coalescingKey: request.coalescingKey)
    }

    /// The first attempt of an enqueue, bounded by the request's `timeout` (and its `deadline`,
    /// when that is sooner) on the queue's clock, whatever the sender does (a token refresh that
    /// never returns, a sender without timeouts): past it the attempt is cancelled and counts as
    /// one timed-out attempt, so the entry is stored with a backoff and the caller gets `.queued`.
    private func firstAttempt(_ request: PreparedRequest, timeout: TimeInterval, deadline: Duration?) async -> QueueAttemptOutcome {
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
    private static func lineKeys(orderingKey: String?, coalescingKey: String?) -> [String] {
        var keys: [String] = []
        if let orderingKey { keys.append("o:" + orderingKey) }
        if let coalescingKey { keys.append("c:" + coalescingKey) }
        return keys.sorted()
    }

    /// Waits for the caller's turn on each line; throws `CancellationError` (holding none) if the
    /// caller is cancelled while it waits.
    private func enterLines(_ keys: [String]) async throws {
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

    private func leaveLines(_ keys: [String]) {
        for key in keys { release(key, entered: true) }
    }

    private func release(_ key: String, entered: Bool) {
        guard var line = keyLines[key] else { return }
        if entered { line.gate.leave() }
        line.users -= 1
        keyLines[key] = line.users == 0 ? nil : line
    }

    /// One send and its classification (the outcome table of Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md).
    func attempt(_ request: PreparedRequest, previousAttempts: Int) async -> QueueAttemptOutcome {
        do {
            let (data, response) = try await sender.response(for: request)
            learnedOffline = false
            let status = response.statusCode
            let verdict = ResponseClassification(response, now: now)
            let error = NetworkError.httpError(statusCode: status, data: data)
            switch verdict.kind {
            case .success: return .delivered(status: status)
            case .permanent: return .permanent(error)
            case .retryable:
                let delay = verdict.retryAfter.map { min($0, configuration.maximumRetryAfter) }
                return .retry(error, after: delay ?? backoff(afterAttempts: previousAttempts + 1))
            }
        } catch let error as NetworkError {
            // Cancelled first: a send cut by a drain budget may surface as any error, and must
            // neither count as an attempt nor mark the network offline.
            if Task.isCancelled { return .stop }
            switch error {
            case .noConnection:
                learnedOffline = true
                return .offline
            case .cancelled:
                return .stop
            case .responseTooLarge(_, let status?):
                // The server answered; only its body was too large, and the queue never reads a
                // body: the status decides, as for any response (a 201 is delivered, a 503 kept).
                let statusError = NetworkError.httpError(statusCode: status, data: nil)
                switch ResponseClassification(status: status, retryAfterHeader: nil).kind {
                case .success: return .delivered(status: status)
                case .permanent: return .permanent(statusError)
                case .retryable: return .retry(statusError, after: backoff(afterAttempts: previousAttempts + 1))
                }
            case .invalidRequest, .responseTooLarge:
                // Sent again, the request would fail the same way.
                return .permanent(error)
            default:
                if Task.isCancelled { return .stop }
                return .retry(error, after: backoff(afterAttempts: previousAttempts + 1))
            }
        } catch {
            if Task.isCancelled { return .stop }
            return .retry(.underlying(error), after: backoff(afterAttempts: previousAttempts + 1))
        }
    }

    /// The wait after `attempts` failed attempts; `nil` from the policy becomes "never" (dead letter).
    func backoff(afterAttempts attempts: Int) -> Duration {
        guard let seconds = configuration.retryPolicy.delay(forAttempt: max(0, attempts - 1)) else { return QueueEntryLifecycle.neverAgain }
        return RetryPolicyDelay.sanitized(seconds, maximum: .seconds(86_400))
    }

    private func persist(
        _ request: some QueueableRequest,
        id: UUID,
        key: String,
        attempts: Int,
        nextAttemptAt: Date?,
        lastError: String?
    ) async throws -> QueueEntry {
        guard let store = disk else {
            return try await persistShared(request, id: id, key: key, attempts: attempts, nextAttemptAt: nextAttemptAt, lastError: lastError)
        }
        var replaced: QueueEntry?
        if let coalescingKey = request.coalescingKey,
            let existing = store.entry(coalescingKey: coalescingKey),
            lifecycle.startReplacing(existing.id)
        {
            replaced = existing
        }
        // Settled whether the write succeeds or fails; the holder stays queued if it failed.
        defer { if let replaced { lifecycle.replacementEnded(replaced.id) } }
        let sequence: UInt64
        if let replaced { sequence = replaced.sequence } else { sequence = store.makeSequence() }
        // Each edit of a coalescing key takes a fresh number from the store's counter as its
        // revision, so whichever file survives a crash, the open keeps the newest write — even
        // next to an older revision whose deletion was lost, or one still being sent.
        let revision = request.coalescingKey == nil ? 0 : Int(store.makeSequence())
        let entry = QueueEntry(
            id: id,
            request: request,
            idempotencyKey: key,
            enqueuedAt: now,
            sequence: sequence,
            revision: revision,
            attempts: attempts,
            nextAttemptAt: nextAttemptAt,
            lastError: lastError
        )
        try await store.insert(entry, limit: maxQueueSize, replacing: replaced?.id)
        return entry
    }

    // MARK: - Internals: passes

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
        guard let store = disk else {
            await runSharedPass(&report, connected: connected)
            return report
        }
        // The pass's rules (ordering keys, expiry, backoff) are decided by `ReplayPass`; this loop
        // does what it says.
        var pass = ReplayPass(connected: connected)
        // Its deletions wake the pool thread a batch at a time (`DeferredRemovals`).
        store.startBatchingRemovals()
        defer { store.stopBatchingRemovals() }
        scanning: while let snapshot = pass.nextScan({ store.orderedEntries() }) {
            for entry in snapshot {
                if Task.isCancelled {
                    report.wasCancelled = true
                    break scanning
                }
                guard store.entry(id: entry.id) != nil else { continue }  // cancelled meanwhile
                switch pass.decide(entry, now: now, beingReplaced: lifecycle.isBeingReplaced(entry.id)) {
                case .skip, .holdBack:
                    continue
                case .expire:
                    store.discard(id: entry.id, reason: .expired)
                    record(.expired(id: entry.id), in: &report)
                case .replay:
                    let result: ReplayPass.SendResult
                    switch await replay(entry, on: store, report: &report) {
                    case .delivered, .permanent:
                        result = .removed
                    case .retry:
                        // A retry that used the last attempt dead-lettered the entry (or a newer
                        // edit superseded it): gone, so the rest of its key may go in this pass.
                        result = store.entry(id: entry.id) == nil ? .removed : .kept
                    case .offline:
                        report.endedOffline = true
                        result = .stopped
                    case .stop:
                        report.wasCancelled = true
                        result = .stopped
                    }
                    guard pass.sent(entry, result) else { break scanning }
                }
            }
        }
        // The pass's deletions ran beside its sends; when it returns its finished files are gone.
        store.finishRemovals()
        report.remaining = store.entryCount
        if life.isStarted {
            if !connected {
                // The monitor will say when it is back; no timer while offline.
            } else if learnedOffline {
                scheduleTimerIfNeeded(for: offlineRecheckDate())
            } else {
                await scheduleNextTimer()
            }
        }
        return report
    }

    private func replay(_ entry: QueueEntry, on store: DiskQueueStore, report: inout FlushReport) async -> QueueAttemptOutcome {
        guard let request = entry.replayRequest else {
            store.discard(id: entry.id, reason: .rejected(statusCode: nil))
            record(.failedPermanently(id: entry.id, statusCode: nil), in: &report)
            return .permanent(.invalidRequest(reason: "unknown method \(entry.method)"))
        }
        lifecycle.replayStarted(entry.id)
        // An edit of a coalescing key goes out only once every deletion so far is durable: an
        // older edit's file must not come back after a crash, or after a deletion that failed,
        // once this one is delivered. When that cannot be done now (the disk refuses), the edit
        // waits as after a failed attempt.
        var unsafeToSend: (any Error)?
        if entry.coalescingKey != nil {
            do { try await store.makeDeletionsDurable() } catch { unsafeToSend = error }
        }
        let outcome: QueueAttemptOutcome
        let sends = unsafeToSend == nil
        defer { if sends { storage.changeFeed.publish(.attemptEnded(id: entry.id)) } }  // after the outcome is applied
        let observer = observer(of: entry)
        // Told once the outcome is applied (the entry forgotten and its file deleted, or updated),
        // unless a delivery already told it (`deliveryFinished`).
        var observed = false
        defer {
            if observed {
                if !outcome.mayHaveReachedServer { possiblySent.remove(entry.id) }
                observer?.sendEnded(entry, mayHaveReachedServer: outcome.mayHaveReachedServer)
            }
        }
        if let unsafeToSend {
            outcome = .retry(.underlying(unsafeToSend), after: backoff(afterAttempts: entry.attempts + 1))
        } else if let observer, !(await observer.sendBegins(entry, waits: true)) {
            outcome = .stop  // cancelled while a read of what it changes was being fetched: not sent
        } else {
            observed = observer != nil
            if observed {
                // What may be in the server's state from now on, for the next launch should this
                // process die: this entry, and those sent before without an answer that says no.
                possiblySent.insert(entry.id)
                possiblySent = possiblySent.filter { store.entry(id: $0) != nil }
                await store.noteSending(possiblySent)
            }
            storage.changeFeed.publish(.attemptStarted(id: entry.id))
            outcome = await attempt(request.addingReplayHeaders(for: entry, from: configuration.replayHeaders), previousAttempts: entry.attempts)
        }
        // What became of the entry while the attempt was away decides with its outcome: it may have
        // been cancelled, or a newer edit of its coalescing key stored beside it.
        let end = lifecycle.replayEnded(
            entry,
            outcome,
            stillQueued: store.entry(id: entry.id) != nil,
            supersededBy: entry.coalescingKey.flatMap { store.entry(coalescingKey: $0) }?.id,
            maxAttempts: configuration.maxAttempts,
            now: now
        )
        switch end {
        case .remove(let reason, let result):
            if reason.isDelivered, observed, let observer {
                // Recorded with the reads it changes before the queue forgets it; its file goes at
                // once, so no read stored from now on can meet it again after a relaunch.
                await observer.delivered(entry)
                await store.discardPromptly(id: entry.id, reason: reason)
                observed = false
                possiblySent.remove(entry.id)
                observer.deliveryFinished(entry)
            } else {
                store.discard(id: entry.id, reason: reason)
            }
            if let result { record(result, in: &report) }
        case .supersede:
            store.discard(id: entry.id, reason: .superseded)
        case .keep(let updated, let error, let next):
            // On a full disk the file keeps its older state, but the store's index takes the new
            // count and backoff, so this process still honours them (and `maxAttempts`).
            try? await store.update(updated)
            record(.keptForRetry(id: entry.id, error: error, attempts: updated.attempts, nextAttemptAt: next), in: &report)
        case .deadLetter(var updated):
            do {
                if try await store.moveToDeadLetter(updated) {  // false: cancelled meanwhile
                    record(.deadLettered(id: entry.id, attempts: updated.attempts), in: &report)
                }
            } catch {
                // Cannot write the dead letter: keep the entry rather than lose it.
                updated.nextAttemptAt = now.addingTimeInterval(backoff(afterAttempts: updated.attempts).seconds)
                try? await store.update(updated)
            }
        case .leave:
            break
        }
        return outcome
    }

    func record(_ result: QueueEntryResult, in report: inout FlushReport) {
        report.results.append(result)
        subscribers.yield(result)
    }

    private func connectivityChanged(_ connected: Bool) async {
        if connected {
            learnedOffline = false
            _ = await runPass(.reconnect)
        } else {
            life.disarm()?.cancel()
        }
    }

    /// Schedules a pass for when the earliest backoff among entries ends.
    private func scheduleNextTimer() async {
        guard let store = disk else { return await scheduleSharedTimer() }
        scheduleTimerIfNeeded(for: store.earliestBackoffEnd())
    }

    func scheduleTimerIfNeeded(for deadline: Date?) {
        guard let deadline else { return }
        let wait = Duration.clamped(seconds: deadline.timeIntervalSince(now), upperBound: .seconds(86_400))
        let time = self.time
        let replaced = life.arm(at: deadline) { number in
            Task { [weak self] in
                do { try await time.sleep(wait) } catch { return }
                guard let self else { return }
                await self.timerFired(number)
            }
        }
        replaced?.cancel()
    }

    private func timerFired(_ number: UInt64) async {
        // Replaced, or stopped, after its sleep ended: no pass (a stopped queue sends nothing).
        guard life.timerFired(number) else { return }
        defer { life.firingEnded(number) }
        guard await reachability.isConnected else { return }
        _ = await runPass(.timer)
    }

    func offlineRecheckDate() -> Date {
        now.addingTimeInterval(configuration.offlineRecheckInterval.seconds)
    }

    deinit {
        subscribers.finishAll()
        for task in life.tasks { task.cancel() }
        deadlines.shutdown()
    }
}
