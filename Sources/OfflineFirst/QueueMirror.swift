import Foundation
import OfflineQueue

/// The queue's pending writes as its change feed leaves them: stored entries and requests being
/// offered at once, in replay order (priority descending, then the order they were queued; an
/// offered request, not stored yet, after the stored ones of its priority), and which are being
/// sent. A value type with no I/O: apply `OfflineQueueEngine.changes` in order and it follows the
/// queue exactly, change by change — which no re-read of the store can do, since the store may
/// already be ahead of the change being handled.
struct QueueMirror: Sendable {
    /// The entries kept, in replay order.
    private(set) var entries: [QueueEntry] = []
    /// The entries being sent now.
    private(set) var sending: Set<UUID> = []
    /// Which entries to keep (a live read keeps only those its rules overlay).
    private let keep: @Sendable (QueueEntry) -> Bool

    /// What one change did to the mirror.
    enum Effect: Sendable {
        /// Nothing the mirror keeps changed.
        case none
        /// A kept entry was added, replaced, updated, or started or stopped being sent.
        case changed
        /// An entry left the queue (`wasKept`: the mirror held it).
        case removed(QueueEntry, QueueRemovalReason, wasKept: Bool)
    }

    init(_ stored: [QueueEntry], keep: @escaping @Sendable (QueueEntry) -> Bool = { _ in true }) {
        self.keep = keep
        for entry in stored where keep(entry) { insert(entry) }
    }

    mutating func apply(_ change: QueueChange) -> Effect {
        switch change {
        case .offered(let entry):
            return upsert(entry) ? .changed : .none
        case .stored(let entry, let replacing):
            let replaced = replacing.map { remove($0) != nil } ?? false
            let stored = upsert(entry)
            return replaced || stored ? .changed : .none
        case .updated(let entry):
            guard contains(entry.id) else { return .none }
            return upsert(entry) ? .changed : .none
        case .attemptStarted(let id):
            guard contains(id) else { return .none }
            return sending.insert(id).inserted ? .changed : .none
        case .attemptEnded(let id):
            return sending.remove(id) != nil && contains(id) ? .changed : .none
        case .removed(let entry, let reason):
            sending.remove(entry.id)
            return .removed(entry, reason, wasKept: remove(entry.id) != nil)
        }
    }

    func contains(_ id: UUID) -> Bool { entries.contains { $0.id == id } }

    /// Adds or replaces `entry` if it is kept (removing an older copy either way); returns whether
    /// the mirror changed.
    private mutating func upsert(_ entry: QueueEntry) -> Bool {
        let removed = remove(entry.id) != nil
        guard keep(entry) else { return removed }
        insert(entry)
        return true
    }

    private mutating func insert(_ entry: QueueEntry) {
        let position = entries.firstIndex { Self.replaysBefore(entry, $0) } ?? entries.endIndex
        entries.insert(entry, at: position)
    }

    @discardableResult
    private mutating func remove(_ id: UUID) -> QueueEntry? {
        guard let position = entries.firstIndex(where: { $0.id == id }) else { return nil }
        return entries.remove(at: position)
    }

    /// The queue's replay order: higher priority first, then the order queued; a request not
    /// stored yet (sequence 0) after the stored ones.
    static func replaysBefore(_ a: QueueEntry, _ b: QueueEntry) -> Bool {
        if a.priority != b.priority { return a.priority > b.priority }
        func rank(_ entry: QueueEntry) -> UInt64 { entry.sequence == 0 ? .max : entry.sequence }
        return rank(a) < rank(b)
    }
}

/// Applies the overlays of `entries` (in order) to `base` with the rules that apply to each.
enum Overlays {
    struct Result: Sendable {
        var data: Data?
        var applied: [UUID] = []
        var failures: [OverlayFailure] = []
    }

    static func apply(_ entries: [QueueEntry], to base: Data?, rules: [OptimisticUpdate]) -> Result {
        var result = Result(data: base)
        for entry in entries {
            var applied = false
            for rule in rules where rule.mutations(entry) {
                do {
                    result.data = try rule.apply(result.data, entry)
                    applied = true
                } catch {
                    result.failures.append(OverlayFailure(entryID: entry.id, message: String(describing: error)))
                }
            }
            if applied { result.applied.append(entry.id) }
        }
        return result
    }
}
