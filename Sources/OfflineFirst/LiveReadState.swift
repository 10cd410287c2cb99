import Foundation
import OfflineQueue
import RequestEngine
import ResponseCache

/// One live read's state, as a value with no I/O: what is stored or fetched (the base), the
/// pending writes that overlay it, the delivered ones still overlaid until a refetch lands, the
/// rejections to report, and when to fetch. The client's loop feeds it events (queue changes,
/// connectivity, fetch results) and performs what it asks (start a fetch, yield a snapshot).
///
/// The rule that keeps a screen from flickering: a delivered write stays applied until a fetch
/// that *started after* its delivery has landed. A fetch already in flight when the write was
/// delivered may carry the server's state from before it, so its landing clears only the writes
/// delivered before it started, and another fetch follows; a fetch that fails clears nothing.
struct LiveReadState: Sendable {
    /// The optimistic updates that change this read.
    let rules: [OptimisticUpdate]
    /// Whether a delivered entry makes this read stale (an invalidation or an update names it).
    let invalidatedBy: @Sendable (QueueEntry) -> Bool
    /// The most rejections a read keeps to report.
    static let rejectionLimit = 32

    private(set) var mirror: QueueMirror
    private(set) var base: CachedResponse?
    /// Counts changes of `base` (for `memo`).
    private var baseVersion = 0
    private var baseIsStale: Bool
    /// Delivered entries still applied, each with the number of fetches started when it was
    /// delivered: a fetch numbered higher started after it.
    private var settling: [(item: QueueMirror.Item, fetchesStartedBefore: Int)] = []
    /// The overlays last applied: while base, settling writes and the mirror's order are
    /// unchanged, a new pending write at the end is applied on top of them alone.
    private var memo: Memo?
    /// Queued writes a stored note says were delivered (their files outlived the delivery): never
    /// overlaid as pending, though they stay queued until sent again.
    private let knownDelivered: Set<UUID>

    private struct Memo: Sendable {
        let baseVersion: Int
        let settlingIDs: [UUID]
        let rewrites: Int
        let pendingCount: Int
        let settled: Overlays.Result
        let pending: Overlays.Result
    }
    private var rejections: [RejectedWrite] = []
    private(set) var connected: Bool
    private var fetchesStarted = 0
    /// Whether a fetch is due, the one in flight, and whether the next must reach the origin.
    private(set) var phase: FetchPhase
    private var lastFetchError: NetworkError?
    /// A delivered write made this read stale since the loop last asked: not a phase of the read
    /// but an instruction to its loop, taken once (`takeDeliveryInvalidation`).
    private var deliveredSinceAsked = false

    init(
        rules: [OptimisticUpdate], invalidatedBy: @escaping @Sendable (QueueEntry) -> Bool, entries: [QueueEntry],
        stored: CachedResponse?, fetchAtOnce: Bool, connected: Bool, knownDelivered: Set<UUID> = []
    ) {
        self.rules = rules
        self.invalidatedBy = invalidatedBy
        mirror = QueueMirror(entries, classify: Self.classifier(rules))
        base = stored
        self.knownDelivered = knownDelivered.union(SettlingNote.entries(stored?.note ?? Data()).map(\.id))
        // Writes delivered while this read's stored body was already stored (by this process or
        // one before a relaunch): recorded in its note, settled by the first fetch that lands.
        let classify = Self.classifier(rules)
        settling = SettlingNote.entries(stored?.note ?? Data()).compactMap { entry in
            classify(entry).map { (QueueMirror.Item(entry: entry, rules: $0), 0) }
        }
        baseIsStale = stored?.isStale ?? false
        phase = FetchPhase(fetchDue: stored == nil || stored?.isStale == true || fetchAtOnce)
        self.connected = connected
    }

    /// The indices of the rules that apply to an entry; `nil` when none does.
    static func classifier(_ rules: [OptimisticUpdate]) -> @Sendable (QueueEntry) -> [Int]? {
        { entry in
            let matching = rules.indices.filter { rules[$0].mutations(entry) }
            return matching.isEmpty ? nil : matching
        }
    }

    /// Whether a delivered write made the read stale since the last call: the loop then marks
    /// the read stale in the cache, so that its next fetch starts a new exchange with the origin
    /// rather than join one begun before the delivery.
    mutating func takeDeliveryInvalidation() -> Bool {
        defer { deliveredSinceAsked = false }
        return deliveredSinceAsked
    }

    /// Whether a fetch should start now.
    var shouldFetch: Bool {
        guard connected, case .due = phase else { return false }
        return true
    }

    /// Applies one queue change; returns whether the snapshot may have changed.
    mutating func apply(_ change: QueueChange) -> Bool {
        if let entry = Self.enteringConflict(change), mirror.entry(id: entry.id)?.conflict == nil,
            mirror.contains(entry.id) || Self.classifier(rules)(entry) != nil
        {
            // A write this read shows was refused (412/428): the server has a newer version, which
            // the read fetches, and the write stays on top of it until it is resolved.
            phase.deliveryInvalidated()
            deliveredSinceAsked = true
            if base != nil { baseIsStale = true }
        }
        switch mirror.apply(change) {
        case .none:
            return false
        case .changed:
            return true
        case .removed(let entry, let reason, let wasKept):
            let matching = Self.classifier(rules)(entry)
            let overlays = wasKept || matching != nil
            switch reason {
            case .delivered:
                let invalidates = overlays || invalidatedBy(entry)
                if let matching, !settling.contains(where: { $0.item.entry.id == entry.id }) {
                    settling.append((QueueMirror.Item(entry: entry, rules: matching), fetchesStarted))
                }
                if invalidates {
                    phase.deliveryInvalidated()
                    deliveredSinceAsked = true
                    if base != nil { baseIsStale = true }
                }
                return overlays || invalidates
            case .superseded:
                return wasKept
            case .rejected, .expired, .deadLettered, .cancelled, .notStored, .conflict:
                guard overlays else { return false }
                let statusCode: Int? =
                    switch reason {
                    case .rejected(let status): status
                    case .conflict(let status): status
                    default: nil
                    }
                rejections.append(RejectedWrite(id: entry.id, statusCode: statusCode, reason: reason, entry: entry))
                if rejections.count > Self.rejectionLimit { rejections.removeFirst(rejections.count - Self.rejectionLimit) }
                return true
            }
        }
    }

    /// The entry a change puts in conflict (`QueueEntry.conflict`): a replay's (`updated`), or a
    /// first attempt's stored in conflict (`stored`).
    private static func enteringConflict(_ change: QueueChange) -> QueueEntry? {
        switch change {
        case .updated(let entry), .stored(let entry, _): entry.conflict != nil ? entry : nil
        default: nil
        }
    }

    /// Connectivity changed; returns whether the snapshot changed (`isPaused`).
    mutating func setConnected(_ connected: Bool) -> Bool {
        guard connected != self.connected else { return false }
        let wasPaused = isPaused
        self.connected = connected
        if connected, base?.isStale == true || baseIsStale { phase.fetchAskedFor() }
        return wasPaused != isPaused || shouldFetch
    }

    /// A fetch is starting; returns its number, and whether it follows a delivery — then it is
    /// sent with `Cache-Control: no-cache`, so that neither a cache on the way nor a request
    /// already in flight for the same read (which the engine would let it share) can answer it
    /// with the state from before the write.
    mutating func fetchStarted() -> (number: Int, followsDelivery: Bool) {
        fetchesStarted += 1
        return (fetchesStarted, phase.start(fetchesStarted))
    }

    /// The fetch numbered `number` answered. `deliveredBefore` says which writes were delivered
    /// before its request was sent (it may have waited for their sends): those are in its body,
    /// even when the fetch was asked for before their delivery was known here.
    mutating func fetchLanded(_ number: Int, _ response: CachedResponse, deliveredBefore: (UUID) -> Bool = { _ in false }) {
        guard phase.fetchingNumber == number else { return }
        base = response
        baseVersion += 1
        baseIsStale = response.isStale
        lastFetchError = nil
        settle(after: number, deliveredBefore: deliveredBefore)
    }

    /// The fetch numbered `number` failed: what is shown stays — delivered writes included, since
    /// nothing showed the server has them — marked with the error. The next reconnect (or the
    /// next change that asks for a fetch) tries again.
    mutating func fetchFailed(_ number: Int, _ error: NetworkError) {
        guard phase.fetchingNumber == number else { return }
        lastFetchError = error
        if base != nil { baseIsStale = true }
        phase.ended(landed: false, stillSettling: !settling.isEmpty)
    }

    /// Drops the delivered writes the fetch numbered `number` accounts for (delivered before it
    /// started); those delivered since need another fetch.
    private mutating func settle(after number: Int, deliveredBefore: (UUID) -> Bool) {
        settling.removeAll { $0.fetchesStartedBefore < number || deliveredBefore($0.item.entry.id) }
        phase.ended(landed: true, stillSettling: !settling.isEmpty)
        if phase.isDue, base != nil { baseIsStale = true }
    }

    var isPaused: Bool { phase.isDue && !connected }

    /// The snapshot to show now (it remembers the overlays it applied, for the next one).
    mutating func snapshot() -> QuerySnapshot {
        let settlingIDs = settling.map(\.item.entry.id)
        let settled: Overlays.Result
        let pending: Overlays.Result
        // A write both settling and queued (its file outlived its delivery, or it was recorded in
        // the stored note and then seen delivered) is applied once, as settling.
        let skipped = knownDelivered.union(settlingIDs)
        if let memo, memo.baseVersion == baseVersion, memo.settlingIDs == settlingIDs {
            settled = memo.settled
            if memo.rewrites == mirror.rewrites, memo.pendingCount <= mirror.items.count {
                pending = Overlays.apply(mirror.items[memo.pendingCount...], to: memo.pending, rules: rules, skipping: skipped)
            } else {
                pending = Overlays.apply(mirror.items, to: Overlays.Result(data: settled.data), rules: rules, skipping: skipped)
            }
        } else {
            settled = Overlays.apply(settling.map(\.item), to: Overlays.Result(data: base?.data), rules: rules)
            pending = Overlays.apply(mirror.items, to: Overlays.Result(data: settled.data), rules: rules, skipping: skipped)
        }
        memo = Memo(baseVersion: baseVersion, settlingIDs: settlingIDs, rewrites: mirror.rewrites, pendingCount: mirror.items.count, settled: settled, pending: pending)

        let source: QuerySnapshot.Source =
            switch base?.source {
            case .network: .network
            case .cache: .cache
            case nil: .overlayOnly
            }
        return QuerySnapshot(
            data: pending.data,
            response: base?.response,
            source: source,
            isStale: base != nil && baseIsStale,
            pendingEntryIDs: pending.applied,
            conflictedEntryIDs: mirror.items.filter { $0.entry.conflict != nil && pending.applied.contains($0.entry.id) }.map(\.entry.id),
            settlingEntryIDs: settled.applied,
            rejectedWrites: rejections,
            overlayFailures: settled.failures + pending.failures,
            isPaused: isPaused,
            isFetching: phase.fetchingNumber != nil,
            lastFetchError: lastFetchError
        )
    }
}
