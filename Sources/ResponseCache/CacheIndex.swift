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
    /// The keys stored under each method and URL as stored, and that URL parsed once it was
    /// needed: what `markStale(where:)` and `invalidate(where:)` run their rules on, once per
    /// distinct URL however many responses share it (a list endpoint's query variants, `Vary`
    /// variants, partitions). Built on first use (`indexURLs()`), so an open does not pay for it,
    /// then kept up to date.
    private(set) var urls: [StoredURL: URLEntry] = [:]
    private(set) var indexesURLs = false
    /// The stored URLs by path, for `markStale(matching:)`: built on the first such marking
    /// (`indexPaths()`), or off the cache's lock after `prepareMarkingByPattern()`
    /// (`PathTables(_:)`, `install(_:)`), then kept up to date. Nil until then.
    private var paths: PathTables?
    var indexesPaths: Bool { paths != nil }
    private(set) var totalBytes = 0
    /// The least recently used item (evicted first) and the most recently used one.
    private(set) var oldest: CacheDigest?
    private(set) var newest: CacheDigest?

    var count: Int { items.count }

    /// A method and a URL as stored (without query values).
    struct StoredURL: Hashable, Sendable {
        let method: String
        let url: String
    }

    struct URLEntry: Sendable {
        /// One key without a set's allocation (most URLs hold one response).
        fileprivate(set) var keys: Keys
        /// `url` parsed, once a rule needed it (nil before, and for a URL that does not parse).
        var parsed: URL?
    }

    enum Keys: Sendable {
        case one(CacheDigest)
        case many(Set<CacheDigest>)

        func forEach(_ body: (CacheDigest) -> Void) {
            switch self {
            case .one(let key): body(key)
            case .many(let keys): for key in keys { body(key) }
            }
        }
    }

    /// Builds `urls`, if it is not built yet.
    mutating func indexURLs() {
        guard !indexesURLs else { return }
        indexesURLs = true
        for (key, item) in items { addURL(of: item.summary, key: key) }
    }

    /// Builds the path tables (and `urls`), if they are not built yet.
    mutating func indexPaths() {
        indexURLs()
        if paths == nil { paths = PathTables(urls.keys) }
    }

    /// Takes path tables built from an earlier copy of `urls` (off the cache's lock), brought up
    /// to date with the URLs stored and removed since; `urls` must be built. Kept tables win.
    mutating func install(_ tables: PathTables) {
        guard indexesURLs, paths == nil else { return }
        var tables = tables
        for url in urls.keys where !tables.contains(url) { tables.add(url) }
        if tables.count != urls.count {
            let removed = tables.urls.filter { urls[$0] == nil }
            for url in removed { tables.remove(url) }
        }
        paths = tables
    }

    /// The stored URLs `pattern` matches.
    func urls(matching pattern: CacheURLPattern) -> [StoredURL] {
        paths?.urls(matching: pattern) ?? []
    }

    /// The stored URLs by their path (`byPath`) and by each path a `CacheURLPattern` with
    /// subpaths may name to reach them (`underPath`: `/`, `/a`, `/a/b` for `/a/b`), and each URL's
    /// host and path: what `markStale(matching:)` looks up. A value with no reference to the
    /// index, so it can be built from a copy of the URLs while the cache goes on.
    struct PathTables: Sendable {
        private var byPath: [String: Set<StoredURL>] = [:]
        private var underPath: [String: Set<StoredURL>] = [:]
        private var parts: [StoredURL: StoredURLParts] = [:]

        init(_ urls: some Sequence<StoredURL>) {
            for url in urls { add(url) }
        }

        var count: Int { parts.count }
        var urls: Dictionary<StoredURL, StoredURLParts>.Keys { parts.keys }
        func contains(_ url: StoredURL) -> Bool { parts[url] != nil }

        func urls(matching pattern: CacheURLPattern) -> [StoredURL] {
            let candidates = (pattern.includesSubpaths ? underPath : byPath)[pattern.path] ?? []
            guard pattern.host != nil else { return Array(candidates) }
            return candidates.filter { url in parts[url].map(pattern.matches) ?? false }
        }

        mutating func add(_ url: StoredURL) {
            let urlParts = StoredURLParts(url.url)
            parts[url] = urlParts
            byPath[urlParts.path, default: []].insert(url)
            for path in urlParts.enclosingPaths { underPath[path, default: []].insert(url) }
        }

        mutating func remove(_ url: StoredURL) {
            guard let urlParts = parts.removeValue(forKey: url) else { return }
            Self.remove(url, at: urlParts.path, from: &byPath)
            for path in urlParts.enclosingPaths { Self.remove(url, at: path, from: &underPath) }
        }

        private static func remove(_ url: StoredURL, at path: String, from table: inout [String: Set<StoredURL>]) {
            guard var urls = table.removeValue(forKey: path) else { return }  // taken out: no copy
            urls.remove(url)
            if !urls.isEmpty { table[path] = urls }
        }
    }

    private mutating func addURL(of summary: StoredResponseSummary, key: CacheDigest) {
        let url = StoredURL(method: summary.method, url: summary.url)
        // Taken out and put back, so that its set is not shared while it changes (no copy).
        if var entry = urls.removeValue(forKey: url) {
            switch entry.keys {
            case .one(let other): entry.keys = .many([other, key])
            case .many(var keys):
                entry.keys = .one(key)  // lets go of the set, so the insert does not copy it
                keys.insert(key)
                entry.keys = .many(keys)
            }
            urls[url] = entry
        } else {
            urls[url] = URLEntry(keys: .one(key), parsed: nil)
            paths?.add(url)
        }
    }

    /// Keeps the parsed form of a stored URL (for the next rule).
    mutating func setParsed(_ parsed: URL, for url: StoredURL) {
        urls[url]?.parsed = parsed
    }

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
        if indexesURLs { addURL(of: summary, key: summary.key) }
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
        let url = StoredURL(method: item.summary.method, url: item.summary.url)
        if indexesURLs, var entry = urls.removeValue(forKey: url) {
            switch entry.keys {
            case .one: paths?.remove(url)  // its last response
            case .many(var keys):
                entry.keys = .one(key)  // lets go of the set, so the removal does not copy it
                keys.remove(key)
                entry.keys = keys.count == 1 ? .one(keys.first!) : .many(keys)
                urls[url] = entry
            }
        }
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
        urls = [:]
        if paths != nil { paths = PathTables([]) }
        totalBytes = 0
        oldest = nil
        newest = nil
    }

    private mutating func unlink(_ key: CacheDigest, _ item: Item) {
        if let older = item.older { items[older]?.newer = item.newer } else { oldest = item.newer }
        if let newer = item.newer { items[newer]?.older = item.older } else { newest = item.older }
    }
}
