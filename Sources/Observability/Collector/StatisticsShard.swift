/// One shard of the collector's counters: a row of `EndpointStatistics` per endpoint, plus a
/// direct-mapped cache from endpoint hash to row so that a known endpoint is found without the
/// registry's lock.
///
/// The collector gives each recording thread its own shard (by `ThreadOrdinal`), so the counters a
/// thread updates stay in its core's cache and threads do not wait for each other; a snapshot
/// adds the shards up.
struct StatisticsShard {
    var rows: [EndpointStatistics]
    private var cacheHashes: [Int]
    private var cacheRows: [Int32]
    private let cacheMask: Int
    private var padding = CacheLinePadding()

    static let cacheSize = 512

    init(rowCount: Int) {
        rows = Array(repeating: EndpointStatistics(), count: rowCount)
        cacheHashes = Array(repeating: 0, count: Self.cacheSize)
        cacheRows = Array(repeating: 0, count: Self.cacheSize)
        cacheMask = Self.cacheSize - 1
    }

    /// The row cached for an endpoint hash (never 0), if any.
    @inline(__always)
    func cachedRow(forHash hash: Int) -> Int32? {
        let slot = hash & cacheMask
        return cacheHashes[slot] == hash ? cacheRows[slot] : nil
    }

    /// Caches `row` for `hash`, replacing whatever shared its slot.
    @inline(__always)
    mutating func cache(_ row: Int32, forHash hash: Int) {
        let slot = hash & cacheMask
        cacheHashes[slot] = hash
        cacheRows[slot] = row
    }

    /// Counts a `started` (or, with `isDeduplication`, a `deduplicated`) event for `row`.
    @inline(__always)
    mutating func countEndpointEvent(row: Int32, isDeduplication: Bool) {
        if isDeduplication {
            rows[Int(row)].deduplicated &+= 1
        } else {
            rows[Int(row)].started &+= 1
        }
    }
}
