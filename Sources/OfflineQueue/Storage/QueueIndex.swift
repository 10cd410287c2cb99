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
    /// Per lane, how many slots at its front are known dead (`forEachInOrder` skips them without
    /// looking, and moves past each dead slot it meets there): a drain from the front does not
    /// walk the slots of everything it delivered on every claim.
    private var laneStarts: [Int: Int] = [:]
    /// The lanes' priorities, highest first (kept, so a claim sorts nothing).
    private var priorities: [Int] = []
    private var deadInLanes = 0
    /// Ids whose dead slots are still in a lane (cleared by `compact()`).
    private var deadIDs: Set<UUID> = []
    private var byCoalescingKey: [String: UUID] = [:]
    /// The sequences of each ordering key's and each coalescing key's live entries, ascending: the
    /// first is the key's head, the only entry of the key a claim may offer.
    private var orderingSequences: [String: [UInt64]] = [:]
    private var coalescingSequences: [String: [UInt64]] = [:]

    init() {}

    /// Builds the index from entries in any order (sorted once, then appended).
    init(loading loaded: [QueueEntry]) {
        entries.reserveCapacity(loaded.count)
        for entry in loaded.sorted(by: { $0.sequence < $1.sequence }) { upsert(entry) }
    }

    var count: Int { entries.count }

    subscript(id: UUID) -> QueueEntry? { entries[id] }

    /// Whether any live entry carries `orderingKey`.
    func contains(orderingKey: String) -> Bool { orderingSequences[orderingKey] != nil }

    /// Whether `entry` is the first queued entry (the smallest sequence) of its ordering key and
    /// of its coalescing key: only such an entry may be sent (a key's entries go one at a time, in
    /// order).
    func isHead(_ entry: QueueEntry) -> Bool {
        if let key = entry.orderingKey, orderingSequences[key]?.first != entry.sequence { return false }
        if let key = entry.coalescingKey, coalescingSequences[key]?.first != entry.sequence { return false }
        return true
    }

    /// Calls `body` with the live entries in replay order, and whether each is the head of its keys
    /// (`isHead`), until it returns false: a claim reads only as far as it needs.
    mutating func forEachInOrder(_ body: (_ entry: QueueEntry, _ isHead: Bool) -> Bool) {
        for priority in priorities {
            guard let lane = lanes[priority] else { continue }
            var position = laneStarts[priority] ?? 0
            var atFront = true
            while position < lane.count {
                let slot = lane[position]
                position += 1
                guard let entry = entries[slot.id], entry.sequence == slot.sequence, entry.priority == priority else {
                    if atFront { laneStarts[priority] = position }
                    continue
                }
                atFront = false
                if !body(entry, isHead(entry)) { return }
            }
        }
    }

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
                if let key = old.orderingKey { Self.remove(old.sequence, key, from: &orderingSequences) }
                if let key = entry.orderingKey { Self.insert(entry.sequence, key, into: &orderingSequences) }
            }
            if old.coalescingKey != entry.coalescingKey {
                if let key = old.coalescingKey { Self.remove(old.sequence, key, from: &coalescingSequences) }
                if let key = entry.coalescingKey { Self.insert(entry.sequence, key, into: &coalescingSequences) }
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
            let position = insertionIndex(in: lane, for: entry.sequence)
            lane.insert(slot, at: position)
            if let start = laneStarts[entry.priority], position < start { laneStarts[entry.priority] = position }
        } else {
            lane.append(slot)
        }
        if lanes.updateValue(lane, forKey: entry.priority) == nil, !priorities.contains(entry.priority) {
            priorities.append(entry.priority)
            priorities.sort(by: >)
        }
        if let key = entry.orderingKey { Self.insert(entry.sequence, key, into: &orderingSequences) }
        if let key = entry.coalescingKey {
            byCoalescingKey[key] = entry.id
            Self.insert(entry.sequence, key, into: &coalescingSequences)
        }
    }

    @discardableResult
    mutating func remove(_ id: UUID) -> QueueEntry? {
        guard let entry = entries.removeValue(forKey: id) else { return nil }
        if let key = entry.coalescingKey {
            if byCoalescingKey[key] == id { byCoalescingKey[key] = nil }
            Self.remove(entry.sequence, key, from: &coalescingSequences)
        }
        if let key = entry.orderingKey { Self.remove(entry.sequence, key, from: &orderingSequences) }
        deadInLanes += 1
        deadIDs.insert(id)
        if deadInLanes > max(64, entries.count) { compact() }
        return entry
    }

    mutating func removeAll() {
        entries = [:]
        lanes = [:]
        laneStarts = [:]
        priorities = []
        deadInLanes = 0
        deadIDs = []
        byCoalescingKey = [:]
        orderingSequences = [:]
        coalescingSequences = [:]
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
        laneStarts = [:]
        priorities = lanes.keys.sorted(by: >)
    }

    private func insertionIndex(in lane: [Slot], for sequence: UInt64) -> Int {
        Self.insertionIndex(of: sequence, count: lane.count) { lane[$0].sequence }
    }

    /// Adds `sequence` to `key`'s ascending list (appended when it is the largest, as a new
    /// entry's is).
    private static func insert(_ sequence: UInt64, _ key: String, into lists: inout [String: [UInt64]]) {
        if let last = lists[key]?.last, last > sequence {
            let list = lists[key]!
            lists[key]!.insert(sequence, at: insertionIndex(of: sequence, count: list.count) { list[$0] })
        } else {
            lists[key, default: []].append(sequence)
        }
    }

    /// Removes one `sequence` from `key`'s list, and the list once it is empty.
    private static func remove(_ sequence: UInt64, _ key: String, from lists: inout [String: [UInt64]]) {
        guard let list = lists[key] else { return }
        let position = insertionIndex(of: sequence, count: list.count) { list[$0] }
        guard position < list.count, list[position] == sequence else { return }
        if list.count == 1 {
            lists[key] = nil
        } else {
            lists[key]!.remove(at: position)
        }
    }

    /// The first position whose value is not below `sequence`, in an ascending list read by `value`.
    private static func insertionIndex(of sequence: UInt64, count: Int, value: (Int) -> UInt64) -> Int {
        var low = 0
        var high = count
        while low < high {
            let mid = (low + high) / 2
            if value(mid) < sequence { low = mid + 1 } else { high = mid }
        }
        return low
    }
}
