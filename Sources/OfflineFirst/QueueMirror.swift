import Foundation
import OfflineQueue

/// The queue's pending writes as its change feed leaves them: stored entries and requests being
/// offered at once, in replay order (priority descending, then the order they were queued; an
/// offered request, not stored yet, after the stored ones of its priority), and which are being
/// sent. A value type with no I/O: apply `OfflineQueueEngine.changes` in order and it follows the
/// queue exactly, change by change — which no re-read of the store can do, since the store may
/// already be ahead of the change being handled.
struct QueueMirror: Sendable {
    /// A kept entry and the indices of the rules that apply to it, worked out once when it
    /// arrives (rules are pure), so that showing a read calls no rule's `mutations` again.
    struct Item: Sendable {
        let entry: QueueEntry
        let rules: [Int]
    }

    /// The entries kept, in replay order.
    private(set) var items: [Item] = []
    /// The kept entries that some rule applies to, in replay order: what overlays are made of
    /// (a mirror that keeps every entry may hold many that change no read).
    private(set) var overlaying: [Item] = []
    /// The ids in `items`: a new entry (most changes bring one) is known not to be there without
    /// a scan.
    private var ids: Set<UUID> = []
    /// The entries being sent now.
    private(set) var sending: Set<UUID> = []
    /// How often an entry was removed, replaced or inserted anywhere but last: while it stays
    /// the same, `items` only grew at the end (what lets a read apply only the new overlays).
    private(set) var rewrites = 0
    /// Which entries to keep, and the rules that apply to each (`nil`: not kept).
    private let classify: @Sendable (QueueEntry) -> [Int]?

    /// What one change did to the mirror.
    enum Effect: Sendable {
        /// Nothing the mirror keeps changed.
        case none
        /// A kept entry was added, replaced, updated, or started or stopped being sent.
        case changed
        /// An entry left the queue (`wasKept`: the mirror held it).
        case removed(QueueEntry, QueueRemovalReason, wasKept: Bool)
    }

    init(_ stored: [QueueEntry], classify: @escaping @Sendable (QueueEntry) -> [Int]? = { _ in [] }) {
        self.classify = classify
        for entry in stored {
            if let rules = classify(entry) { insert(Item(entry: entry, rules: rules)) }
        }
    }

    /// The kept entries, in replay order.
    var entries: [QueueEntry] { items.map(\.entry) }

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

    func contains(_ id: UUID) -> Bool { ids.contains(id) }

    /// The kept entry with this id (a linear search: for the rare change that needs the old copy).
    func entry(id: UUID) -> QueueEntry? {
        guard contains(id) else { return nil }
        return items.first { $0.entry.id == id }?.entry
    }

    /// Adds or replaces `entry` if it is kept (removing an older copy either way); returns whether
    /// the mirror changed.
    private mutating func upsert(_ entry: QueueEntry) -> Bool {
        let removed = remove(entry.id) != nil
        guard let rules = classify(entry) else { return removed }
        insert(Item(entry: entry, rules: rules))
        return true
    }

    private mutating func insert(_ item: Item) {
        // From the back: a new entry usually goes last.
        var position = items.endIndex
        while position > items.startIndex, Self.replaysBefore(item.entry, items[position - 1].entry) { position -= 1 }
        if position != items.endIndex { rewrites += 1 }
        items.insert(item, at: position)
        ids.insert(item.entry.id)
        guard !item.rules.isEmpty else { return }
        var overlayPosition = overlaying.endIndex
        while overlayPosition > overlaying.startIndex, Self.replaysBefore(item.entry, overlaying[overlayPosition - 1].entry) { overlayPosition -= 1 }
        overlaying.insert(item, at: overlayPosition)
    }

    @discardableResult
    private mutating func remove(_ id: UUID) -> QueueEntry? {
        guard ids.remove(id) != nil, let position = items.firstIndex(where: { $0.entry.id == id }) else { return nil }
        rewrites += 1
        let removed = items.remove(at: position)
        if !removed.rules.isEmpty, let overlayPosition = overlaying.firstIndex(where: { $0.entry.id == id }) {
            overlaying.remove(at: overlayPosition)
        }
        return removed.entry
    }

    /// The queue's replay order: higher priority first, then the order queued; a request not
    /// stored yet (sequence 0) after the stored ones.
    static func replaysBefore(_ a: QueueEntry, _ b: QueueEntry) -> Bool {
        if a.priority != b.priority { return a.priority > b.priority }
        func rank(_ entry: QueueEntry) -> UInt64 { entry.sequence == 0 ? .max : entry.sequence }
        return rank(a) < rank(b)
    }
}

/// Applies overlays: each item's rules (indices into `rules`; with `only`, just those in it) to
/// the body, in order; the items in `skipping` not at all (applied already).
enum Overlays {
    struct Result: Sendable {
        var data: Data?
        var applied: [UUID] = []
        var failures: [OverlayFailure] = []
    }

    static func apply(
        _ items: some Sequence<QueueMirror.Item>, to result: Result, rules: [OptimisticUpdate], only: Set<Int>? = nil, skipping: Set<UUID> = []
    ) -> Result {
        var result = result
        for item in items where !skipping.contains(item.entry.id) {
            var applied = false
            for index in item.rules where only?.contains(index) ?? true {
                do {
                    result.data = try rules[index].apply(result.data, item.entry)
                    applied = true
                } catch {
                    result.failures.append(OverlayFailure(entryID: item.entry.id, message: String(describing: error)))
                }
            }
            if applied { result.applied.append(item.entry.id) }
        }
        return result
    }
}
