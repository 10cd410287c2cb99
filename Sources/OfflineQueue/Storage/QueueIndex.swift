import Foundation

/// The queue's in-memory index: every live entry by id, replay order, and coalescing keys.
/// A value type with no I/O, so ordering rules are testable by hand.
///
/// Replay order is priority descending, then `sequence` ascending (FIFO). Each priority has a lane
/// of ids in sequence order; new entries get increasing sequence numbers and are appended, so an
/// insert is O(1) amortised. Removal is lazy (the id disappears from `entries` and the lane is
/// compacted once half of it is dead), so a drain of n entries costs O(n), not O(n²). An entry
/// re-inserted while a dead slot of its id still lingers, or saved again with another priority
/// or sequence, first has its old slot compacted away, so each live entry has exactly one slot,
/// in the lane of its current priority.
struct QueueIndex: Sendable {
    private struct Slot: Sendable {
        let sequence: UInt64
        let id: UUID
    }

    private(set) var entries: [UUID: QueueEntry] = [:]
    private var lanes: [Int: [Slot]] = [:]
    private var deadInLanes = 0
    /// Ids whose dead slots are still in a lane (cleared by `compact()`).
    private var deadIDs: Set<UUID> = []
    private var byCoalescingKey: [String: UUID] = [:]
    private var orderingKeyCounts: [String: Int] = [:]

    init() {}

    /// Builds the index from entries in any order (sorted once, then appended).
    init(loading loaded: [QueueEntry]) {
        entries.reserveCapacity(loaded.count)
        for entry in loaded.sorted(by: { $0.sequence < $1.sequence }) { upsert(entry) }
    }

    var count: Int { entries.count }

    subscript(id: UUID) -> QueueEntry? { entries[id] }

    /// Whether any live entry carries `orderingKey`.
    func contains(orderingKey: String) -> Bool { orderingKeyCounts[orderingKey, default: 0] > 0 }

    func entry(coalescingKey: String) -> QueueEntry? {
        byCoalescingKey[coalescingKey].flatMap { entries[$0] }
    }

    /// Adds an entry, or replaces the entry with the same id (after an attempt, or a save with
    /// other content — then in the lane and at the place of its new priority and sequence).
    mutating func upsert(_ entry: QueueEntry) {
        if let old = entries[entry.id] {
            guard old.priority == entry.priority, old.sequence == entry.sequence else {
                remove(entry.id)
                upsert(entry)
                return
            }
            entries[entry.id] = entry
            if old.orderingKey != entry.orderingKey {
                if let key = old.orderingKey { decrementOrderingKey(key) }
                if let key = entry.orderingKey { orderingKeyCounts[key, default: 0] += 1 }
            }
            if let key = old.coalescingKey, key != entry.coalescingKey, byCoalescingKey[key] == entry.id {
                byCoalescingKey[key] = nil
            }
            if let key = entry.coalescingKey { byCoalescingKey[key] = entry.id }
            return
        }
        if deadIDs.contains(entry.id) { compact() }  // its old slot must not come back to life
        entries[entry.id] = entry
        let slot = Slot(sequence: entry.sequence, id: entry.id)
        var lane = lanes.removeValue(forKey: entry.priority) ?? []
        if let last = lane.last, last.sequence > entry.sequence {
            // Out of order (a coalescing replacement keeps its predecessor's place, or a load
            // from disk): binary insert by sequence.
            lane.insert(slot, at: insertionIndex(in: lane, for: entry.sequence))
        } else {
            lane.append(slot)
        }
        lanes[entry.priority] = lane
        if let key = entry.orderingKey { orderingKeyCounts[key, default: 0] += 1 }
        if let key = entry.coalescingKey { byCoalescingKey[key] = entry.id }
    }

    @discardableResult
    mutating func remove(_ id: UUID) -> QueueEntry? {
        guard let entry = entries.removeValue(forKey: id) else { return nil }
        if let key = entry.coalescingKey, byCoalescingKey[key] == id { byCoalescingKey[key] = nil }
        if let key = entry.orderingKey { decrementOrderingKey(key) }
        deadInLanes += 1
        deadIDs.insert(id)
        if deadInLanes > max(64, entries.count) { compact() }
        return entry
    }

    mutating func removeAll() {
        entries = [:]
        lanes = [:]
        deadInLanes = 0
        deadIDs = []
        byCoalescingKey = [:]
        orderingKeyCounts = [:]
    }

    /// Live entries in replay order.
    func ordered() -> [QueueEntry] {
        var result: [QueueEntry] = []
        result.reserveCapacity(entries.count)
        for priority in lanes.keys.sorted(by: >) {
            for slot in lanes[priority] ?? [] {
                if let entry = entries[slot.id], entry.sequence == slot.sequence, entry.priority == priority {
                    result.append(entry)
                }
            }
        }
        return result
    }

    /// The largest sequence number in use.
    var maxSequence: UInt64 { entries.values.map(\.sequence).max() ?? 0 }

    /// Drops every dead slot: a slot stays only while its id is live with that lane's priority
    /// and that sequence.
    private mutating func compact() {
        for (priority, lane) in lanes {
            let live = lane.filter { slot in
                guard let entry = entries[slot.id] else { return false }
                return entry.priority == priority && entry.sequence == slot.sequence
            }
            lanes[priority] = live.isEmpty ? nil : live
        }
        deadInLanes = 0
        deadIDs = []
    }

    private mutating func decrementOrderingKey(_ key: String) {
        orderingKeyCounts[key, default: 1] -= 1
        if orderingKeyCounts[key] == 0 { orderingKeyCounts[key] = nil }
    }

    private func insertionIndex(in lane: [Slot], for sequence: UInt64) -> Int {
        var low = 0
        var high = lane.count
        while low < high {
            let mid = (low + high) / 2
            if lane[mid].sequence < sequence { low = mid + 1 } else { high = mid }
        }
        return low
    }
}
