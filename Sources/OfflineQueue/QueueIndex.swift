import Foundation

/// The queue's in-memory index: every live entry by id, replay order, and coalescing keys.
/// A value type with no I/O, so ordering rules are testable by hand.
///
/// Replay order is priority descending, then `sequence` ascending (FIFO). Each priority has a lane
/// of ids in sequence order; new entries get increasing sequence numbers and are appended, so an
/// insert is O(1) amortised. Removal is lazy (the id disappears from `entries` and the lane is
/// compacted once half of it is dead), so a drain of n entries costs O(n), not O(n²).
struct QueueIndex: Sendable {
    private struct Slot: Sendable {
        let sequence: UInt64
        let id: UUID
    }

    private(set) var entries: [UUID: QueueEntry] = [:]
    private var lanes: [Int: [Slot]] = [:]
    private var deadInLanes = 0
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

    /// Adds an entry (or replaces the entry with the same id, e.g. after an attempt).
    mutating func upsert(_ entry: QueueEntry) {
        if entries.updateValue(entry, forKey: entry.id) == nil {
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
        }
        if let key = entry.coalescingKey { byCoalescingKey[key] = entry.id }
    }

    @discardableResult
    mutating func remove(_ id: UUID) -> QueueEntry? {
        guard let entry = entries.removeValue(forKey: id) else { return nil }
        if let key = entry.coalescingKey, byCoalescingKey[key] == id { byCoalescingKey[key] = nil }
        if let key = entry.orderingKey {
            orderingKeyCounts[key, default: 1] -= 1
            if orderingKeyCounts[key] == 0 { orderingKeyCounts[key] = nil }
        }
        deadInLanes += 1
        if deadInLanes > max(64, entries.count) { compact() }
        return entry
    }

    mutating func removeAll() {
        entries = [:]
        lanes = [:]
        deadInLanes = 0
        byCoalescingKey = [:]
        orderingKeyCounts = [:]
    }

    /// Live entries in replay order.
    func ordered() -> [QueueEntry] {
        var result: [QueueEntry] = []
        result.reserveCapacity(entries.count)
        for priority in lanes.keys.sorted(by: >) {
            for slot in lanes[priority] ?? [] {
                if let entry = entries[slot.id] { result.append(entry) }
            }
        }
        return result
    }

    /// The largest sequence number in use.
    var maxSequence: UInt64 { entries.values.map(\.sequence).max() ?? 0 }

    private mutating func compact() {
        for (priority, lane) in lanes {
            lanes[priority] = lane.filter { entries[$0.id]?.priority == priority }
        }
        deadInLanes = 0
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
