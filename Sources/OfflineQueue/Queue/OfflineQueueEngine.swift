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
        /// On storage whose claims have leases (many consumers share it; not `DiskQueueStore`): how
        /// long a claimed entry stays this engine's without a renewal. The engine renews it every third
        /// of this while the entry's request is in flight; a replica that dies lets it run out, and
        /// another replica claims the entry then. Default 30 s.
        public var claimLease: Duration
        /// On storage others add work to (`QueueStorage.othersAddWork`: many consumers share it):
        /// how often a started engine looks for work nobody announced (a lease that ran out, a
        /// missed notification), besides the storage's `arrivals()`. Default 5 s.
        public var storagePollInterval: Duration
        /// Resolves a write the server refused because its version moved on (`412`, or `428` to
        /// a write without a base): see `ConflictResolver`. `nil` (the default): such a write is
        /// rejected as any other 4xx (`failedPermanently`, removed as `rejected(statusCode:)`).
        public var conflictResolver: (any ConflictResolver)?
        /// How many entries a pass has in flight at once. With 1 (the default) entries go one at a
        /// time in priority-then-FIFO order: an app's strict replay order. With N > 1, a pass keeps
        /// up to N entries in flight, claimed in priority-then-FIFO order: entries of different
        /// ordering keys (and entries without one) go together and may land in any order; an
        /// entry with an ordering key still waits for its predecessor to be settled, and a newer
        /// edit of a coalescing key still replaces only an entry that is not in flight. The request
        /// engine's per-host limits still apply to the requests. Conflicts being resolved
        /// (`conflictResolver`) do not count. Values below 1 count as 1.
        public var maxConcurrentDeliveries: Int

        public init(
            retryPolicy: any RetryPolicy = ExponentialRetryPolicy(maxRetries: .max, baseDelay: 1, maxDelay: 300, jitter: .equal),
            maxAttempts: Int? = nil,
            maximumRetryAfter: Duration = .seconds(3600),
            offlineRecheckInterval: Duration = .seconds(30),
            secretPolicy: QueueSecretPolicy = .standard,
            replayHeaders: (@Sendable (QueueEntry) async -> [String: String])? = nil,
            claimLease: Duration = .seconds(30),
            storagePollInterval: Duration = .seconds(5),
            conflictResolver: (any ConflictResolver)? = nil,
            maxConcurrentDeliveries: Int = 1
        ) {
            self.retryPolicy = retryPolicy
            self.maxAttempts = maxAttempts.map { max(1, $0) }
            self.maximumRetryAfter = max(.zero, maximumRetryAfter)
            self.offlineRecheckInterval = max(.milliseconds(1), offlineRecheckInterval)
            self.secretPolicy = secretPolicy
            self.replayHeaders = replayHeaders
            self.claimLease = max(.milliseconds(3), claimLease)
            self.storagePollInterval = max(.milliseconds(1), storagePollInterval)
            self.conflictResolver = conflictResolver
            self.maxConcurrentDeliveries = max(1, maxConcurrentDeliveries)
        }
    }

    /// The most entries the queue holds; `enqueue` throws `OfflineQueueError.full` beyond it.
    /// Enforced by the store, so it holds under any number of concurrent enqueues.
    public nonisolated let maxQueueSize: Int
    /// Where the entries live: a `DiskQueueStore` (an app's queue), or another `QueueStorage`
    /// that many consumers share (`PostgresQueueStore`, from the Integrations package).
    public nonisolated let storage: any QueueStorage
    /// `storage` when it is a `DiskQueueStore` (for the simulation and tests, which read the
    /// store's own API; the engine itself never asks).
    package nonisolated let disk: DiskQueueStore?
    /// SwiftResilience's name for `storage` (`engine.store.load()`, `engine.store.count()` read
    /// it on every storage). The disk store's own API is `storage as? DiskQueueStore`, or the
    /// store the app made and kept.
    public nonisolated var store: any QueueStorage { storage }
    public nonisolated let configuration: Configuration

    let sender: any RequestSending
    /// The monitor this queue follows (a drain service subscribes to the same one).
    public nonisolated let reachabilityMonitor: any ReachabilityMonitoring
    var reachability: any ReachabilityMonitoring { reachabilityMonitor }
    let time: TimeSource
    /// Bounds enqueues' first attempts and claimed sends' leases (one sleeping task for all of them),
    /// and a layer above's waits on the queue's clock.
    package nonisolated let deadlines: DeadlineTimer
    private let wallClockOrigin: Date

    /// What an attempt's end does to its entry (`QueueEntryLifecycle.replayEnded`). Which entries
    /// are being sent or replaced is the storage's to know (its claims; `DiskClaims` on a disk).
    var lifecycle = QueueEntryLifecycle()
    /// One line per ordering or coalescing key: enqueues that share a key run one at a time, in
    /// arrival order (the count includes the holder and everyone waiting).
    var keyLines: [String: (gate: AdmissionGate, users: Int)] = [:]
    var learnedOffline = false
    /// Passes in a row that a storage error ended (a disk that refuses, a database that is down):
    /// the next waits a backoff that grows with them (`storageRetryDate()`).
    var storageFailures = 0
    /// One drain pass at a time, whoever triggers it; FIFO; a cancelled waiter leaves the line.
    let passGate = AdmissionGate(limit: 1)
    /// Stopped, started (its tasks, its timer idle or armed, timers firing) or closed: see
    /// `QueueEngineLifecycle`.
    var life = QueueEngineLifecycle()
    nonisolated let subscribers = StreamSubscribers<QueueEntryResult>()
    /// Told of each send (`observeSends(with:)`).
    nonisolated let sendObserver = Locked<(any QueueSendObserver)?>(nil)
    /// Observed entries that may be in the server's state — on the wire now, or sent without an
    /// answer that says otherwise — and still queued: noted in the folder before each observed
    /// replay, so that the next launch knows them (`DiskQueueStore.sendingAtOpen`).
    var possiblySent: Set<UUID> = []
    /// The conflicts being resolved, each in a task of its own that holds its entry's claim.
    var resolutions: [UUID: Task<Void, Never>] = [:]

    /// A queue on `store`: a `DiskQueueStore` (an app's queue, in a folder), or any other
    /// `QueueStorage`, such as a table a service's replicas share (`PostgresQueueStore`, from the
    /// Integrations package).
    ///
    /// Every pass claims its entries from the storage: on storage with leases (other than a disk
    /// store) under `configuration.claimLease`, renewed while their request is in flight; on
    /// storage others add work to (`othersAddWork`), a started engine also looks for work every
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
        await cancelResolutions()
    }

    /// Cancels the tasks a stop or close took out of `life`, then waits for each.
    func end(_ tasks: [Task<Void, Never>]) async {
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
        await cancelResolutions()
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

    // MARK: - One send, classified by the outcome table

    /// One send and its classification (the outcome table of Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md).
    func attempt(_ request: PreparedRequest, previousAttempts: Int) async -> QueueAttemptOutcome {
        do {
            let (data, response) = try await sender.response(for: request)
            learnedOffline = false
            let status = response.statusCode
            let verdict = ResponseClassification(response, now: now)
            switch verdict.kind {
            case .success: return .delivered(status: status)
            case .permanent: return .permanent(.httpError(statusCode: status, data: data))
            case .retryable:
                let delay = verdict.retryAfter.map { min($0, configuration.maximumRetryAfter) }
                return .retry(.httpError(statusCode: status, data: data), after: delay ?? backoff(afterAttempts: previousAttempts + 1))
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

    deinit {
        subscribers.finishAll()
        for task in life.tasks { task.cancel() }
        for task in resolutions.values { task.cancel() }
        deadlines.shutdown()
    }
}
