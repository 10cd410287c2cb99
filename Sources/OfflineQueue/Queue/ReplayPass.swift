import Foundation

/// The decisions of one replay pass, as a value: which queued entry is swept, skipped, held back
/// or sent, and whether the pass scans the queue again. `OfflineQueueEngine.runPass` feeds it each
/// entry and each send's result and performs what it says (deleting, sending); the rules are
/// unit-tested on their own (`ReplayPassTests`).
///
/// Ordering keys: an entry with an `orderingKey` is sent only when it is the first queued entry of
/// its key (every predecessor is gone) and no entry of its key has been held back during this
/// pass — a retry, a backoff not yet due, or a replacement in progress keeps the rest of its key
/// waiting. A predecessor delivered during the pass makes its successor eligible, so a pass that
/// delivered anything scans again.
struct ReplayPass: Sendable {
    /// What to do with one entry of the scan.
    enum Decision: Equatable, Sendable {
        /// Expired: delete it and report it.
        case expire
        /// Not now: handled already this pass, waiting behind its key, or the monitor says offline.
        case skip
        /// Not due yet (backoff) or being replaced: leave it, and hold back the rest of its key.
        case holdBack
        /// Send it.
        case replay
    }

    /// How a send ended, as far as the pass cares.
    enum SendResult: Equatable, Sendable {
        /// Gone from the queue (delivered, or failed for good): its key's next entry may go.
        case removed
        /// Kept for a later attempt: the rest of its key waits.
        case kept
        /// The network is gone, or the pass was cancelled: stop scanning.
        case stopped
    }

    /// Whether the monitor said connected when the pass began (offline: sweep, send nothing).
    let connected: Bool
    /// Entries decided this pass (expired or sent): never looked at again in it.
    private(set) var handled: Set<UUID> = []
    /// Keys held back this pass.
    private(set) var blockedKeys: Set<String> = []
    /// The first queued sequence of each ordering key, as of the current scan.
    private var heads: [String: UInt64] = [:]
    /// Something left the queue during the current scan (the first scan always runs).
    private var progress = true
    private var stopped = false

    init(connected: Bool) {
        self.connected = connected
    }

    /// The entries of the next scan, read by `snapshot` (the queue in replay order) only if there
    /// is one: `nil` when the pass is over (the previous scan removed nothing, or a send stopped it).
    mutating func nextScan(_ snapshot: () -> [QueueEntry]) -> [QueueEntry]? {
        guard !stopped, progress else { return nil }
        progress = false
        let entries = snapshot()
        heads = [:]
        for entry in entries {
            if let key = entry.orderingKey { heads[key] = min(heads[key] ?? .max, entry.sequence) }
        }
        return entries
    }

    /// What to do with `entry`, still queued, at `now`.
    mutating func decide(_ entry: QueueEntry, now: Date, beingReplaced: Bool) -> Decision {
        guard !handled.contains(entry.id) else { return .skip }
        if entry.isExpired(at: now) {
            handled.insert(entry.id)
            return .expire
        }
        if let key = entry.orderingKey, blockedKeys.contains(key) || heads[key] != entry.sequence { return .skip }
        guard connected else { return .skip }
        if beingReplaced || entry.nextAttemptAt.map({ $0 > now }) == true {
            if let key = entry.orderingKey { blockedKeys.insert(key) }
            return .holdBack
        }
        handled.insert(entry.id)
        return .replay
    }

    /// `entry`'s send ended with `result`: `false` when the pass must stop at once.
    mutating func sent(_ entry: QueueEntry, _ result: SendResult) -> Bool {
        switch result {
        case .removed:
            progress = true
        case .kept:
            if let key = entry.orderingKey { blockedKeys.insert(key) }
        case .stopped:
            stopped = true
        }
        return !stopped
    }
}
