import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineQueue

/// Random sequences of saves, re-saves with another priority, removals and reopens, checked after
/// every step against a model that is too simple to be wrong: a dictionary of live entries, each
/// with its priority and its place in line, sorted on demand.
///
/// These caught the lane bug of issue 14: an entry saved again with another priority stayed in the
/// lane of its old one (replayed out of order), and after about 65 removals a compaction dropped it
/// from replay while `count()` still counted it — until the store was reopened. They fail with
/// `QueueIndex` as it was before "Queue store hardening" (d8ad5c8).
@Suite("QueueIndex and DiskQueueStore keep each entry once, in the lane of its current priority")
struct QueueIndexPropertyTests {
    /// What the queue must hold: id → priority and place (smaller places go first within a priority).
    struct Model {
        private(set) var entries: [UUID: (priority: Int, place: UInt64)] = [:]
        /// The live ids, for drawing one at random in a reproducible way.
        private var live: [UUID] = []
        private(set) var recentlyRemoved: [UUID] = []

        var count: Int { live.count }

        var order: [UUID] {
            entries.sorted { lhs, rhs in
                lhs.value.priority != rhs.value.priority ? lhs.value.priority > rhs.value.priority : lhs.value.place < rhs.value.place
            }.map(\.key)
        }

        func randomLiveID(using generator: inout SplitMix64) -> UUID? {
            live.randomElement(using: &generator)
        }

        /// A removed id that is not live again, if any.
        func randomRemovedID(using generator: inout SplitMix64) -> UUID? {
            recentlyRemoved.filter { entries[$0] == nil }.randomElement(using: &generator)
        }

        mutating func set(_ id: UUID, priority: Int, place: UInt64) {
            if entries.updateValue((priority, place), forKey: id) == nil { live.append(id) }
        }

        mutating func remove(_ id: UUID) {
            guard entries.removeValue(forKey: id) != nil, let position = live.firstIndex(of: id) else { return }
            live.swapAt(position, live.count - 1)
            live.removeLast()
            recentlyRemoved.append(id)
            if recentlyRemoved.count > 16 { recentlyRemoved.removeFirst() }
        }
    }

    /// The chance out of 100 that a step removes an entry: more as the queue grows, so it hovers
    /// around a hundred entries and every lane sees many compactions.
    static func removalChance(count: Int) -> Int { count < 40 ? 20 : count < 120 ? 33 : 50 }

    static func entry(id: UUID, priority: Int, sequence: UInt64) -> QueueEntry {
        let priority = QueuePriority(rawValue: priority) ?? .normal
        return QueueEntry(id: id, request: Mutation("/e", priority: priority), idempotencyKey: "k", enqueuedAt: Date(), sequence: sequence)
    }

    /// The heads a claim offers (`QueueIndex.isHead`): through random adds, removals, re-saves
    /// with another priority or key and reloads, an entry is a head exactly when no live entry of
    /// its ordering key, nor of its coalescing key, has a smaller sequence — whatever the
    /// priorities — and `forEachInOrder` visits the replay order, stopping when told.
    @Test(arguments: [1, 2, 3] as [UInt64])
    func headsMatchTheModelThroughRandomChanges(seed: UInt64) {
        var generator = SplitMix64(seed: seed)
        var index = QueueIndex()
        var live: [UUID: QueueEntry] = [:]
        var nextSequence: UInt64 = 1
        func keyed(_ id: UUID, sequence: UInt64) -> QueueEntry {
            var request = Mutation("/e", priority: QueuePriority(rawValue: Int.random(in: 0...2, using: &generator)) ?? .normal)
            request.orderingKey = Int.random(in: 0..<3, using: &generator) == 0 ? nil : "o\(Int.random(in: 0..<4, using: &generator))"
            request.coalescingKey = Int.random(in: 0..<2, using: &generator) == 0 ? nil : "c\(Int.random(in: 0..<4, using: &generator))"
            return QueueEntry(id: id, request: request, idempotencyKey: "k", enqueuedAt: Date(), sequence: sequence)
        }
        for step in 0..<1_500 {
            // Past 30 entries every step removes one, so the queue stays small enough to check
            // every entry against every other at each step.
            let roll = live.count > 30 ? 0 : Int.random(in: 0..<100, using: &generator)
            if roll < 30, let id = live.keys.sorted(by: { $0.uuidString < $1.uuidString }).randomElement(using: &generator) {
                index.remove(id)
                live[id] = nil
            } else if roll < 45, let id = live.keys.sorted(by: { $0.uuidString < $1.uuidString }).randomElement(using: &generator) {
                let entry = keyed(id, sequence: live[id]!.sequence)  // other keys and priority, same place
                index.upsert(entry)
                live[id] = entry
            } else if roll < 48 {
                index = QueueIndex(loading: Array(live.values))
            } else {
                let entry = keyed(UUID(), sequence: nextSequence)
                nextSequence += 1
                index.upsert(entry)
                live[entry.id] = entry
            }
            for entry in live.values {
                let blocked = live.values.contains { other in
                    other.sequence < entry.sequence
                        && ((entry.orderingKey != nil && other.orderingKey == entry.orderingKey)
                            || (entry.coalescingKey != nil && other.coalescingKey == entry.coalescingKey))
                }
                guard index.isHead(entry) == !blocked else {
                    Issue.record("seed \(seed), step \(step): isHead \(index.isHead(entry)) for an entry the model says is \(blocked ? "blocked" : "a head")")
                    return
                }
            }
            var visited: [UUID] = []
            let index2 = index
            index.forEachInOrder { entry, isHead in
                #expect(isHead == index2.isHead(entry))
                visited.append(entry.id)
                return true
            }
            #expect(visited == index.ordered().map(\.id))
            var first: [UUID] = []
            index.forEachInOrder { entry, _ in
                first.append(entry.id)
                return false
            }
            #expect(first == Array(visited.prefix(1)))
        }
    }

    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func indexMatchesTheModelThroughRandomSavesResavesRemovesAndReloads(seed: UInt64) {
        var generator = SplitMix64(seed: seed)
        var index = QueueIndex()
        var model = Model()
        var nextSequence: UInt64 = 1
        for step in 0..<5_000 {
            let priority = Int.random(in: 0...2, using: &generator)
            let removing = Int.random(in: 0..<100, using: &generator) < Self.removalChance(count: model.count)
            let roll = removing ? -1 : Int.random(in: 0..<100, using: &generator)
            switch roll {
            case -1:
                guard let id = model.randomLiveID(using: &generator) else { continue }
                #expect(index.remove(id)?.id == id, "seed \(seed), step \(step): remove")
                model.remove(id)
            case 0..<45:  // a new entry at the back of its lane
                let id = UUID()
                index.upsert(Self.entry(id: id, priority: priority, sequence: nextSequence))
                model.set(id, priority: priority, place: nextSequence)
                nextSequence += 1
            case 45..<85:  // saved again with a (maybe) different priority, keeping its place
                guard let id = model.randomLiveID(using: &generator), let place = model.entries[id]?.place else { continue }
                index.upsert(Self.entry(id: id, priority: priority, sequence: place))
                model.set(id, priority: priority, place: place)
            case 85..<90:  // saved again at a new place (another sequence)
                guard let id = model.randomLiveID(using: &generator) else { continue }
                index.upsert(Self.entry(id: id, priority: priority, sequence: nextSequence))
                model.set(id, priority: priority, place: nextSequence)
                nextSequence += 1
            case 90..<97:  // a removed id saved again, while its dead slot may still linger
                guard let id = model.randomRemovedID(using: &generator) else { continue }
                index.upsert(Self.entry(id: id, priority: priority, sequence: nextSequence))
                model.set(id, priority: priority, place: nextSequence)
                nextSequence += 1
            default:  // reopen: rebuilt from what is stored
                index = QueueIndex(loading: Array(index.entries.values))
            }
            let ordered = index.ordered().map(\.id)
            guard ordered == model.order, index.count == model.count else {
                Issue.record("seed \(seed), step \(step) (roll \(roll)): replay order has \(ordered.count) entries, count \(index.count); the model has \(model.count)")
                return
            }
        }
    }

    @Test(.timeLimit(.minutes(2)))
    func storeMatchesTheModelThroughRandomSavesResavesDeletesAndReopens() async throws {
        let directory = TemporaryDirectory()
        var store = try DiskQueueStore(directory: directory.url)
        var generator = SplitMix64(seed: 14)
        var model = Model()
        var nextPlace: UInt64 = 0
        func save(_ id: UUID, _ priority: Int) async throws {
            let request = Mutation("/e", priority: QueuePriority(rawValue: priority) ?? .normal)
            try await store.save(QueueEntry(request, id: id))
        }
        for step in 0..<2_000 {
            let priority = Int.random(in: 0...2, using: &generator)
            let removing = Int.random(in: 0..<100, using: &generator) < Self.removalChance(count: model.count)
            let roll = removing ? -1 : Int.random(in: 0..<100, using: &generator)
            switch roll {
            case -1:
                guard let id = model.randomLiveID(using: &generator) else { continue }
                await store.delete(id: id)
                model.remove(id)
            case 0..<45:  // a new entry: the back of its priority's line
                let id = UUID()
                try await save(id, priority)
                model.set(id, priority: priority, place: nextPlace)
                nextPlace += 1
            case 45..<90:  // saved again, maybe with another priority: keeps its place
                guard let id = model.randomLiveID(using: &generator), let place = model.entries[id]?.place else { continue }
                try await save(id, priority)
                model.set(id, priority: priority, place: place)
            case 90..<97:  // a deleted id saved again: a new entry
                guard let id = model.randomRemovedID(using: &generator) else { continue }
                try await save(id, priority)
                model.set(id, priority: priority, place: nextPlace)
                nextPlace += 1
            default:  // the process ends and a new one opens the folder
                store.releaseLock()
                store = try DiskQueueStore(directory: directory.url)
            }
            let ordered = store.orderedEntries()
            let loaded = await store.load().map(\.id)
            let count = await store.count()
            guard ordered.map(\.id) == model.order, loaded == model.order, count == model.count,
                ordered.allSatisfy({ model.entries[$0.id]?.priority == $0.priority })
            else {
                Issue.record("step \(step) (roll \(roll)): replay order has \(ordered.count) entries, load() \(loaded.count), count() \(count); the model has \(model.count)")
                return
            }
        }
        store.releaseLock()
        let reopened = try DiskQueueStore(directory: directory.url)
        #expect(reopened.orderedEntries().map(\.id) == model.order)
        #expect(reopened.openReport.quarantined.isEmpty)
    }
}
