import Foundation

/// The response cache's in-memory index: every stored response by key, the variants stored for
/// each URL, the bytes they take, and their least-recently-used order. A value type with no I/O,
/// so eviction is testable by hand.
///
/// Recency is a doubly linked list threaded through the items (`older`/`newer` keys), so a hit,
/// an insert and an eviction are each O(1).
struct CacheIndex: Sendable {
    struct Item: Sendable, Equatable {
        var summary: StoredResponseSummary
        /// The file's size in bytes (what counts against `maxBytes`).
        var size: Int
        fileprivate var older: CacheDigest?
        fileprivate var newer: CacheDigest?
    }

    private(set) var items: [CacheDigest: Item] = [:]
    /// The keys of the `Vary` variants stored under each primary key (method, URL, partition). A
    /// response without `Vary` is stored under its primary key itself and needs no entry here,
    /// so opening a folder of such responses builds no second table.
    private var varyingKeys: [CacheDigest: [CacheDigest]] = [:]
    private(set) var totalBytes = 0
    /// The least recently used item (evicted first) and the most recently used one.
    private(set) var oldest: CacheDigest?
    private(set) var newest: CacheDigest?

    var count: Int { items.count }

    subscript(key: CacheDigest) -> Item? { items[key] }

    /// The keys of the variants stored for `primaryKey`.
    func variants(of primaryKey: CacheDigest) -> [CacheDigest] {
        let varying = varyingKeys[primaryKey] ?? []
        return items[primaryKey] == nil ? varying : [primaryKey] + varying
    }

    /// Makes room for `count` items at once (opening a folder of 100 000 responses otherwise
    /// regrows the table a dozen times).
    mutating func reserveCapacity(_ count: Int) {
        items.reserveCapacity(count)
    }

    /// Adds or replaces the item for `summary.key` as the most recently used.
    mutating func insert(_ summary: StoredResponseSummary, size: Int) {
        remove(summary.key)
        let item = Item(summary: summary, size: max(0, size), older: newest, newer: nil)
        if let newest { items[newest]?.newer = summary.key }
        newest = summary.key
        if oldest == nil { oldest = summary.key }
        items[summary.key] = item
        if summary.key != summary.primaryKey { varyingKeys[summary.primaryKey, default: []].append(summary.key) }
        totalBytes += item.size
    }

    /// Marks `key` as just used.
    mutating func touch(_ key: CacheDigest) {
        guard newest != key, let item = items[key] else { return }
        unlink(key, item)
        items[key]?.older = newest
        items[key]?.newer = nil
        if let newest { items[newest]?.newer = key }
        newest = key
        if oldest == nil { oldest = key }
    }

    @discardableResult
    mutating func remove(_ key: CacheDigest) -> Item? {
        guard let item = items[key] else { return nil }
        unlink(key, item)
        items[key] = nil
        let primaryKey = item.summary.primaryKey
        if key != primaryKey {
            varyingKeys[primaryKey]?.removeAll { $0 == key }
            if varyingKeys[primaryKey]?.isEmpty == true { varyingKeys[primaryKey] = nil }
        }
        totalBytes -= item.size
        return item
    }

    /// Keys to evict, least recently used first, so that `totalBytes` drops to `limit` or below
    /// (`spared` is never among them). Walks only as far as it must: nothing when the index fits.
    func evictionCandidates(toFit limit: Int, sparing spared: CacheDigest? = nil) -> [CacheDigest] {
        var excess = totalBytes - limit
        var keys: [CacheDigest] = []
        var cursor = oldest
        while excess > 0, let key = cursor, let item = items[key] {
            if key != spared {
                keys.append(key)
                excess -= item.size
            }
            cursor = item.newer
        }
        return keys
    }

    /// Keys from least to most recently used.
    func keysByRecency() -> [CacheDigest] {
        var keys: [CacheDigest] = []
        keys.reserveCapacity(items.count)
        var cursor = oldest
        while let key = cursor, let item = items[key] {
            keys.append(key)
            cursor = item.newer
        }
        return keys
    }

    mutating func removeAll() {
        items = [:]
        varyingKeys = [:]
        totalBytes = 0
        oldest = nil
        newest = nil
    }

    private mutating func unlink(_ key: CacheDigest, _ item: Item) {
        if let older = item.older { items[older]?.newer = item.newer } else { oldest = item.newer }
        if let newer = item.newer { items[newer]?.older = item.older } else { newest = item.older }
    }
}
