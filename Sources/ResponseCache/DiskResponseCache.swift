import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Responses kept on disk so a screen can show them offline: one file per stored response,
/// written atomically, bounded by `maxBytes` with least-recently-used eviction, indexed in memory.
///
/// ```swift
/// let cache = try DiskResponseCache(directory: cachesFolder.appendingPathComponent("responses"), maxBytes: 50 << 20)
/// let engine = CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: cache, reachabilityMonitor: monitor)
/// ```
///
/// What a caller can rely on (Sources/ResponseCache/ResponseCache.docc/ResponseCacheGuide.md has the file format and every rule):
/// - **Never a torn response.** Each file is written to a temp name and renamed, and carries its
///   own lengths and a checksum; a file that does not match them (a power loss mid-write, a disk
///   error, tampering) is never served: it is deleted and counted (`statistics.corruptRemoved`).
/// - **Bounded.** The files never take more than `maxBytes` together: the least recently used are
///   deleted first to make room, and a response larger than `maxBytes` is not stored.
/// - **Nothing stored that cannot be read back.** The limits the reader enforces (a stored URL up
///   to 64 KiB, header fields up to 1 MiB together, 10 000 fields, 1 000 `Vary` names) are checked
///   before a response is stored: one beyond them is not stored (`statistics.beyondFormatLimits`)
///   and still returned to its caller, so `corruptRemoved` counts only torn or damaged files.
/// - **Read your writes.** A response is readable the moment it is stored, before its file is
///   written.
/// - **Reads never fail because of the disk.** A response that cannot be written (full disk,
///   unwritable folder) is still returned to the caller; the failure is counted
///   (`statistics.storeFailures`, `lastStoreFailure`).
/// - **No secrets on disk.** File names are digests; a partition is stored only as a digest, and so
///   are the request header values a response varies on (the engine decides what may be stored).
/// - **One owner.** The cache holds an exclusive `flock` on its folder while it lives, or until
///   `close()`; a second cache on the same folder gets `ResponseCacheError.folderInUse`.
/// - **Fast open.** Only each file's small summary is read when the cache opens (in parallel); the
///   body is read, and its checksum checked, on the first hit. Files are mode 0600, the folder 0700.
public final class DiskResponseCache: Sendable {
    /// What the cache has done since it opened.
    public struct Statistics: Sendable, Equatable {
        /// Responses on disk now, and the bytes their files take.
        public var entries = 0
        public var bytes = 0
        /// Lookups that found a stored response for the URL (any variant, fresh or not), and
        /// lookups that found none.
        public var hits = 0
        public var misses = 0
        /// Responses written, and writes that failed (the response was still returned).
        public var stored = 0
        public var storeFailures = 0
        /// The last write failure, if any.
        public var lastStoreFailure: ResponseCacheError?
        /// Responses not stored because they are larger than `maxBytes`.
        public var tooLargeToStore = 0
        /// Responses not stored because their file would exceed a limit the cache enforces when
        /// it reads a file back (a stored URL over 64 KiB, status and header fields over 1 MiB
        /// together, more than 10 000 header fields or 1 000 `Vary` names): the caller still
        /// gets the response; it is simply not kept.
        public var beyondFormatLimits = 0
        /// Files found torn or corrupt (at open or when read), deleted, never served.
        public var corruptRemoved = 0
        /// Files deleted to stay under `maxBytes`.
        public var evicted = 0
        /// Files of responses the cache no longer holds that the disk refused to delete (`EIO`, a
        /// read-only or failing volume): never served in this process, and tried again before each
        /// note is recorded and after each file written; a relaunch before that succeeds may read
        /// them back (see the guide's "Known limits").
        public var undeletedFiles = 0
    }

    /// The cache folder.
    public let directory: URL
    /// The most bytes the cache's files take together.
    public let maxBytes: Int
    /// The most bytes of recently used responses also kept decoded in memory (hits on them read no file).
    public let memoryBytes: Int

    private struct WriteJob: Sendable {
        let response: StoredResponse
        let data: Data
        /// `State.latest[key]` when the job was made; a newer store, a removal or `clear()`
        /// changes it, and the job's file must then not stay.
        let version: UInt64
    }

    private enum FileJob: Sendable {
        case write(WriteJob)
        case delete
    }

    private struct State: Sendable {
        var index = CacheIndex()
        /// Bytes of writes admitted but not yet in the index.
        var reserved: [CacheDigest: Int] = [:]
        /// What the owner of each key's file does next with it: write the newest response, or
        /// delete the file.
        var queued: [CacheDigest: FileJob] = [:]
        /// Keys whose file a thread owns now: a file loop writing or deleting it, or a caller
        /// deleting it. Only a key's owner touches its file, so a deletion can never hit a file
        /// written after it was decided (`claimFileDeletion(_:in:)`).
        var fileOwners: Set<CacheDigest> = []
        /// The version of the write each key's owner is making now.
        var inFlight: [CacheDigest: UInt64] = [:]
        /// Keys whose write waits for room that writes in flight have reserved (their owners keep
        /// them); a write that ends starts their loops again.
        var waitingForRoom: [CacheDigest] = []
        /// The version of each key's last write that reached its file (`annotate` checks its own).
        var written: [CacheDigest: UInt64] = [:]
        /// The version of each key's last write its loop finished (written or failed).
        var finished: [CacheDigest: UInt64] = [:]
        /// Keys whose file the disk refused to delete, no longer in the index (`deleteFile`).
        var undeleted: Set<CacheDigest> = []
        /// `annotate` waiting for the writes of these keys.
        var writeWaiters = WaiterList<Void, CacheDigest>()
        /// The version of each key's latest store or removal (`clear()` forgets them all), so a
        /// write overtaken by a removal cannot bring its response back.
        var latest: [CacheDigest: UInt64] = [:]
        var nextVersion: UInt64 = 1
        /// The version every key not in `latest` has: the last `clear()`'s (0 before any).
        var clearedVersion: UInt64 = 0
        /// The newest response stored under each key whose file is not written yet: what a read
        /// answers meanwhile (the index still describes the previous file, if any).
        var pending: [CacheDigest: StoredResponse] = [:]
        /// Stored responses marked stale since they were stored (`markStale`), by key, with the
        /// number of the marking: a read answers them invalidated, without their files being
        /// rewritten; a store of the key ends its mark (the new response carries its own flag),
        /// and `update` compares the number to notice a marking that came between.
        var marks: [CacheDigest: UInt64] = [:]
        var nextMark: UInt64 = 1
        /// What the marks file (`StaleMarksFile`) must list: each marked key with the version of
        /// its latest store or removal when it was marked. A file written for a newer version
        /// (which carries its own flag) ends it.
        var durableMarks: [CacheDigest: UInt64] = [:]
        /// Durable marks ended since the marks file was last written (it still lists them, which
        /// only makes a relaunch revalidate them: see `writeMarks`).
        var endedMarks = 0
        /// A background rewrite of the marks file is queued (once many marks have ended).
        var marksRewriteScheduled = false
        /// The records in the marks file (appended since its last rewrite, or read at open): it
        /// is rewritten when they are many more than the marks that still hold.
        var marksFileRecords = 0
        /// For each primary key marked stale, the number of its latest marking (see `staleEpoch`).
        var staleEpochs: [CacheDigest: UInt64] = [:]
        var nextStaleEpoch: UInt64 = 1
        /// Exchanges with the origin in flight, by primary key: the method and URL (as stored)
        /// they are for, and how many. `markStale(where:)` and `invalidate(where:)` reach them
        /// too, not only what is stored.
        var exchanges: [CacheDigest: (method: String, url: String, count: Int)] = [:]
        var memory: [CacheDigest: StoredResponse] = [:]
        var memoryIndex = CacheIndex()
        var statistics = Statistics()
        var idleWaiters = WaiterList<Void, Void>()
        /// `close()` was called: no new owner of a file, no new store.
        var closed = false
        /// `close()` let go of the folder's descriptor (`deinit` must not close it again).
        var released = false

        /// The summaries of what is stored for `urls`: written (the index) or kept in memory only,
        /// each key once. What waits to be written is left to the caller.
        func storedSummaries(of urls: some Sequence<CacheIndex.StoredURL>) -> [StoredResponseSummary] {
            var summaries: [StoredResponseSummary] = []
            for url in urls {
                index.urls[url]?.keys.forEach { key in
                    if let summary = index[key]?.summary { summaries.append(summary) }
                }
                memoryIndex.urls[url]?.keys.forEach { key in
                    if index[key] == nil, let summary = memoryIndex[key]?.summary { summaries.append(summary) }
                }
            }
            return summaries
        }
    }

    /// The most variants (`Vary`) kept for one URL; storing another drops the oldest.
    static let maxVariants = 8

    private let state: Locked<State>
    /// Admits the reads of files and `clear()`s until `close()`, which waits for them (and, on
    /// its own, for the file loops).
    private let gate = ClosingGate()
    /// The folder's descriptor: holds the `flock`, and files are opened relative to it.
    private let folder: Int32
    private let path: String
    private let pool = BlockingIOPool.shared
    /// Held while the marks file is written (one writer at a time: they share its temp name).
    private let marksFile = Locked(())
    /// The building of the path tables begun by `prepareMarkingByPattern()`.
    private let pathIndexing = Locked<Task<Void, Never>?>(nil)

    /// Opens (creating if needed, mode 0700) the cache folder, takes its lock, and indexes every
    /// stored response in it (reading only each file's summary). Torn or corrupt files are deleted
    /// and counted; leftover temp files are removed.
    ///
    /// - Parameters:
    ///   - directory: the folder (use a caches folder: everything in it may be evicted).
    ///   - maxBytes: the most bytes the files may take together (at least 0).
    ///   - memoryBytes: the most bytes of recently used responses kept decoded in memory
    ///     (default 4 MiB, never more than `maxBytes`).
    /// - Throws: `ResponseCacheError.folderInUse` when another cache owns the folder;
    ///   `ResponseCacheError.storage` when the folder cannot be created, locked, listed or read.
    public init(directory: URL, maxBytes: Int, memoryBytes: Int = 4 << 20) throws {
        self.directory = directory
        self.maxBytes = min(max(0, maxBytes), Int.max / 2)  // sums of sizes never overflow
        self.memoryBytes = min(max(0, memoryBytes), max(0, maxBytes))
        path = directory.path
        let lock: FileSystem.LockResult
        var rewriteMarksAtOpen = false
        do {
            try FileSystem.makeDirectoryTree(directory.path)
            try FileSystem.makeDirectory(directory.path)
            lock = try FileSystem.lockDirectory(directory.path, patience: .milliseconds(200))
        } catch {
            throw ResponseCacheError.storage(operation: error.operation, path: error.path, errno: error.errno)
        }
        guard case .locked(let descriptor) = lock else { throw ResponseCacheError.folderInUse(path: directory.path) }
        folder = descriptor
        do {
            let opened = try CacheFolder.open(folder: descriptor, path: directory.path)
            var state = State()
            state.index.reserveCapacity(opened.entries.count)
            for entry in opened.entries { state.index.insert(entry.summary, size: entry.size) }
            state.statistics.corruptRemoved = opened.corruptRemoved
            let (marked, records, rewrite) = Self.readMarks(folder: descriptor, opened: opened)
            for key in marked where state.index[key] != nil {
                state.marks[key] = state.nextMark
                state.nextMark += 1
                state.durableMarks[key] = 0  // every key's version at open
            }
            state.marksFileRecords = records
            rewriteMarksAtOpen = rewrite
            self.state = Locked(state)
        } catch {
            FileSystem.closeDescriptor(descriptor)
            throw error
        }
        let excess = state.withLock { state in
            Self.evict(&state, toFit: self.maxBytes).filter { Self.claimFileDeletion($0, in: &state) }
        }
        deleteFiles(excess)
        state.withLock { Self.updateTotals(&$0) }
        // Damaged or cut by a power loss: written afresh, before anything is appended to it.
        if rewriteMarksAtOpen { writeMarks() }
    }

    /// Starts building, in the background, the tables of stored paths that
    /// `markStale(matching:)` looks its matches up in, so that the first such marking after the
    /// open — a write delivered after a relaunch, on its way — finds them built. Returns at once;
    /// calling it again does nothing. Without it the first marking by pattern builds them (for
    /// 5 000 distinct paths, tens of milliseconds).
    ///
    /// The tables take memory for each distinct stored URL (a few hundred bytes), which is why
    /// the open does not build them: call it when the app marks by pattern. `OfflineFirstClient`
    /// calls it when one of its invalidations has read patterns.
    public func prepareMarkingByPattern() {
        pathIndexing.withLock { indexing in
            guard indexing == nil else { return }
            indexing = Task.detached(priority: .utility) { [weak self] in self?.indexStoredPaths() }
        }
    }

    /// Whether the index's path tables are built (tests read it).
    var indexesStoredPaths: Bool { state.withLock { $0.index.indexesPaths } }

    /// Returns once the path tables `prepareMarkingByPattern()` began to build are built (tests
    /// wait on it).
    func pathsIndexed() async {
        await pathIndexing.withLock { $0 }?.value
    }

    /// Builds the index's path tables (`CacheIndex.PathTables`): the table of stored URLs under
    /// the lock (a table insert per response), the paths parsed from a copy of it outside the
    /// lock (most of the work), then installed with what changed meanwhile. Does nothing if a
    /// marking built them first.
    func indexStoredPaths() {
        let urls = state.withLock { state -> [CacheIndex.StoredURL]? in
            guard !state.closed, !state.index.indexesPaths else { return nil }
            state.index.indexURLs()
            return Array(state.index.urls.keys)
        }
        guard let urls else { return }
        let tables = CacheIndex.PathTables(urls)
        state.withLock { state in
            if !state.closed { state.index.install(tables) }
        }
    }

    deinit {
        if !state.withLock({ $0.released }) { FileSystem.closeDescriptor(folder) }
    }

    // MARK: - Closing

    /// Lets go of the folder, so that another cache (another user's, after a switch) can open it
    /// at once: the writes stored so far are finished first, then the folder's lock is released.
    /// From the call on, the cache reads no file and stores nothing (a read is a miss, a store is
    /// refused, `clear()` throws `ResponseCacheError.closed`); what it holds in memory may still
    /// answer. Closing twice is closing once. Returns when the folder is free, whether or not the
    /// calling task is cancelled (the wait is for disk I/O, which always ends).
    public func close() async {
        // Reads and clears first: a clear admitted before the close deletes every file it meant
        // to (its deletions need owners, which the closed cache no longer gives).
        await gate.close()
        state.withLock { $0.closed = true }
        await Task { [state] in
            while !state.withLock({ $0.fileOwners.isEmpty }) {
                await state.wait(on: \.idleWaiters, tag: (), cancelled: ()) { $0.fileOwners.isEmpty ? () : nil }
            }
        }.value
        let release = state.withLock { state in
            defer { state.released = true }
            return !state.released
        }
        guard release else { return }
        // Marks ended since the marks file was written need not survive in it (a relaunch would
        // only revalidate those responses once more).
        if state.withLock({ $0.endedMarks > 0 }) { writeMarks(evenIfClosed: true) }
        FileSystem.closeDescriptor(folder)
    }

    /// Whether `close()` was called.
    public var isClosed: Bool { gate.isClosed }

    // MARK: - Inspecting and managing

    /// Counters since the cache opened, and its current size.
    public var statistics: Statistics { state.withLock { $0.statistics } }

    /// The number of stored responses.
    public var count: Int { state.withLock { $0.index.count } }

    /// The file name and size of every response the index holds (for tests).
    func indexedFiles() -> [String: Int] {
        state.withLock { state in
            Dictionary(uniqueKeysWithValues: state.index.items.map { (CacheFolder.fileName($0.key), $0.value.size) })
        }
    }

    /// The bytes the stored responses' files take.
    public var totalBytes: Int { state.withLock { $0.index.totalBytes } }

    /// Deletes every stored response (for example at log-out), in memory and on disk, including
    /// writes still in flight. Throws `ResponseCacheError.storage` for a file it cannot delete (the
    /// response is gone from the cache either way).
    public func clear() throws {
        guard gate.enter() else { throw ResponseCacheError.closed }
        defer { gate.leave() }
        state.withLock { state in
            state.latest = [:]
            state.written = [:]
            state.finished = [:]
            state.staleEpochs = [:]
            state.marks = [:]
            state.durableMarks = [:]
            state.endedMarks = 0
            state.clearedVersion = state.nextVersion
            state.nextVersion += 1
            state.pending = [:]
            state.index.removeAll()
            state.memory = [:]
            state.memoryIndex.removeAll()
            // Writes not begun are dropped; a write in flight is no longer current and its owner
            // deletes what it wrote. Deletions already decided stay.
            state.queued = state.queued.filter { if case .delete = $0.value { true } else { false } }
            Self.updateTotals(&state)
        }
        var firstFailure: ResponseCacheError?
        let names: [String]
        do {
            names = try FileSystem.listDirectory(path)
        } catch {
            throw ResponseCacheError.storage(operation: error.operation, path: error.path, errno: error.errno)
        }
        firstFailure = writeMarks()
        // The marks file's temp name is its writer's (under `marksFile`), not a leftover.
        for name in names where CacheFolder.isCacheFile(name) && name != StaleMarksFile.tempName {
            // A file (or a leftover temp file) whose key a write loop owns is that loop's to
            // delete: it is writing a response stored after this clear, or deletes what it wrote.
            if let key = CacheFolder.key(ofFileNamed: name) {
                guard state.withLock({ Self.claimFileDeletion(key, in: &$0) }) else { continue }
            }
            let key = CacheFolder.key(ofFileNamed: name)
            let isResponse = !name.hasPrefix(".")  // not a leftover temp file
            do {
                try FileSystem.removeFile(path + "/" + name)
                if let key, isResponse { noteDeletion(of: key, succeeded: true) }
            } catch {
                if firstFailure == nil { firstFailure = .storage(operation: error.operation, path: error.path, errno: error.errno) }
                if let key, isResponse { noteDeletion(of: key, succeeded: false) }
            }
            if let key { release([key]) }
        }
        if let firstFailure { throw firstFailure }
    }

    /// Deletes the stored responses whose method and URL match `predicate` (for example what a
    /// delivered mutation made stale); returns how many. URLs are as stored: without user-info,
    /// fragment or the values of query parameters (the names stay), so a query value may hold a
    /// secret without it reaching the disk.
    @discardableResult
    public func invalidate(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Int {
        // An exchange in flight may bring the state from before whatever made the caller
        // invalidate: what it stores is stored stale.
        bumpStaleEpochs(matchingExchanges(predicate))
        let matching = matchingKeys(predicate)
        remove(matching)
        return matching.count
    }

    /// The primary keys of the exchanges in flight whose method and URL match.
    private func matchingExchanges(_ predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> [CacheDigest] {
        let exchanges = state.withLock { $0.exchanges }
        return exchanges.compactMap { key, exchange in Self.matches(exchange.method, exchange.url, predicate) ? key : nil }
    }

    /// Whether a method and URL as stored (strings) match `predicate`; never when either does not
    /// parse.
    private static func matches(_ method: String, _ url: String, _ predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Bool {
        guard let method = HTTPMethod(rawValue: method), let url = URL(string: url) else { return false }
        return predicate(method, url)
    }

    /// A `CachedRequestEngine` asks the origin about `primaryKey` (until `exchangeEnded`), for
    /// `method` and `url` (as stored).
    func exchangeBegan(_ primaryKey: CacheDigest, method: String, url: String) {
        state.withLock { state in
            state.exchanges[primaryKey, default: (method, url, 0)].count += 1
        }
    }

    func exchangeEnded(_ primaryKey: CacheDigest) {
        state.withLock { state in
            guard let exchange = state.exchanges[primaryKey] else { return }
            state.exchanges[primaryKey] = exchange.count > 1 ? (exchange.method, exchange.url, exchange.count - 1) : nil
        }
    }

    /// The keys of every stored response (written, in memory or waiting to be written) whose
    /// method and stored URL match.
    private func matchingKeys(_ predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> [CacheDigest] {
        matchingSummaries(predicate).map(\.key)
    }

    /// The summaries of every stored response (written, in memory or waiting to be written)
    /// whose method and stored URL match. The rule runs once per distinct method and URL as stored
    /// (`CacheIndex.urls`), not once per response (a list endpoint's query variants share one
    /// stored URL), on URLs parsed once and kept (`URL(string:)` costs about a microsecond on
    /// Linux); no file is read.
    private func matchingSummaries(_ predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> [StoredResponseSummary] {
        typealias StoredURL = CacheIndex.StoredURL
        // The distinct URLs stored (written, kept in memory, or waiting to be written), each with
        // its parsed form if a rule parsed it before.
        let candidates = state.withLock { state -> [(url: StoredURL, parsed: URL?)] in
            state.index.indexURLs()
            state.memoryIndex.indexURLs()
            var candidates: [(url: StoredURL, parsed: URL?)] = []
            candidates.reserveCapacity(state.index.urls.count)
            for (url, entry) in state.index.urls { candidates.append((url, entry.parsed)) }
            for (url, entry) in state.memoryIndex.urls where state.index.urls[url] == nil { candidates.append((url, entry.parsed)) }
            var seen = Set<StoredURL>()
            for response in state.pending.values {
                let url = StoredURL(method: response.method, url: response.url)
                if state.index.urls[url] == nil, state.memoryIndex.urls[url] == nil, seen.insert(url).inserted { candidates.append((url, nil)) }
            }
            return candidates
        }
        // The rule, outside the lock (it is the caller's code), once per distinct URL.
        var parsedNow: [(StoredURL, URL)] = []
        var matched: [StoredURL] = []
        for candidate in candidates {
            var parsed = candidate.parsed
            if parsed == nil {
                parsed = URL(string: candidate.url.url)
                if let parsed { parsedNow.append((candidate.url, parsed)) }
            }
            guard let parsed, let method = HTTPMethod(rawValue: candidate.url.method), predicate(method, parsed) else { continue }
            matched.append(candidate.url)
        }
        return state.withLock { state in
            for (url, parsed) in parsedNow {
                state.index.setParsed(parsed, for: url)
                state.memoryIndex.setParsed(parsed, for: url)
            }
            var summaries = state.storedSummaries(of: matched)
            if !state.pending.isEmpty, !matched.isEmpty {
                let matchedURLs = Set(matched)
                for (key, response) in state.pending where state.index[key] == nil && state.memoryIndex[key] == nil {
                    if matchedURLs.contains(StoredURL(method: response.method, url: response.url)) { summaries.append(response.summary) }
                }
            }
            // In a fixed order (the tables' order varies from one instance to the next): what is
            // marked or removed first must not depend on it (a simulation replays a seed exactly).
            summaries.sort { $0.key < $1.key }
            return summaries
        }
    }

    /// Marks stale the stored responses whose method and URL match `predicate` (URLs as stored,
    /// as for `invalidate(where:)`): kept, to be shown offline and revalidated, never served as
    /// fresh again. Returns how many.
    @discardableResult
    public func markStale(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Int {
        let summaries = matchingSummaries(predicate)
        // Exchanges in flight too: with nothing stored yet, one begun before the change would
        // otherwise store the state from before it as fresh.
        bumpStaleEpochs(Set(summaries.map(\.primaryKey)).union(matchingExchanges(predicate)))
        let keys = summaries.map(\.key)
        mark(keys)
        return keys.count
    }

    /// Marks stale the stored responses (any method) whose stored URL one of `patterns` matches,
    /// as `markStale(where:)` does, found from the cache's index of stored paths (built in the
    /// background after `prepareMarkingByPattern()`, else by the first such marking) rather than
    /// by a rule run on every stored URL. Returns how many.
    @discardableResult
    public func markStale(matching patterns: [CacheURLPattern]) -> Int {
        guard !patterns.isEmpty else { return 0 }
        let summaries = state.withLock { state -> [StoredResponseSummary] in
            state.index.indexPaths()
            state.memoryIndex.indexPaths()
            var matched = Set<CacheIndex.StoredURL>()
            for pattern in patterns {
                matched.formUnion(state.index.urls(matching: pattern))
                matched.formUnion(state.memoryIndex.urls(matching: pattern))
            }
            var summaries = state.storedSummaries(of: matched)
            for (key, response) in state.pending where state.index[key] == nil && state.memoryIndex[key] == nil {
                let parts = StoredURLParts(response.url)
                if patterns.contains(where: { $0.matches(parts) }) { summaries.append(response.summary) }
            }
            summaries.sort { $0.key < $1.key }  // a fixed order, as `matchingSummaries` keeps
            return summaries
        }
        let exchanges = state.withLock { $0.exchanges }
        let inFlight = exchanges.compactMap { key, exchange -> CacheDigest? in
            let parts = StoredURLParts(exchange.url)
            return patterns.contains { $0.matches(parts) } ? key : nil
        }
        bumpStaleEpochs(Set(summaries.map(\.primaryKey)).union(inFlight))
        let keys = summaries.map(\.key)
        mark(keys)
        return keys.count
    }

    /// Deletes what is stored for `method` and `url`: every partition and every `Vary` variant of
    /// it, and — since stored URLs keep no query values — every URL differing from it only in its
    /// query values. Returns how many responses were deleted.
    @discardableResult
    public func remove(method: HTTPMethod = .get, url: URL) -> Int {
        let stored = HTTPCachePolicy.storedURL(url)
        return invalidate { $0 == method && HTTPCachePolicy.storedURL($1) == stored }
    }

    /// Removes the responses stored under these keys, in memory and on disk.
    func remove(_ keys: [CacheDigest]) {
        guard !keys.isEmpty else { return }
        let claimed = state.withLock { state in
            Self.forget(keys, in: &state)
            return keys.filter { Self.claimFileDeletion($0, in: &state) }
        }
        deleteFiles(claimed)
    }

    /// Forgets `keys` in memory (the caller then has their files deleted), so that a write of
    /// theirs still in flight cannot bring them back.
    private static func forget(_ keys: [CacheDigest], in state: inout State) {
        for key in keys {
            state.latest[key] = state.nextVersion
            state.nextVersion += 1
            state.index.remove(key)
            state.memory[key] = nil
            state.memoryIndex.remove(key)
            state.marks[key] = nil
            state.queued[key] = nil
            state.pending[key] = nil
            state.written[key] = nil
            state.finished[key] = nil
        }
        updateTotals(&state)
    }

    /// The version of `key`'s latest store or removal.
    private static func version(of key: CacheDigest, in state: State) -> UInt64 {
        state.latest[key] ?? state.clearedVersion
    }

    // MARK: - Reading

    /// The response stored under `key`, if there is one and it reads back intact. A torn or
    /// corrupt file is deleted and counted, and reads as a miss.
    func response(for key: CacheDigest, counting: Bool = true) -> StoredResponse? {
        let response = read(key)
        if counting { count(hit: response != nil) }
        return response
    }

    /// Every variant stored under these primary keys (method, URL, partition) that reads back
    /// intact. `counting`: one hit when there is any, one miss otherwise (a lookup for a reader;
    /// the engine's own bookkeeping reads do not count).
    func variants(for primaryKeys: [CacheDigest], counting: Bool = true) -> [StoredResponse] {
        let responses = variantKeys(of: primaryKeys).compactMap(read)
        if counting { count(hit: !responses.isEmpty) }
        return responses
    }

    /// Replaces the response stored under `key` with `change(current)` — unless nothing is stored
    /// there, or another store or removal of `key` came between reading it and writing (then
    /// the newer one stays: a change made from an older response must not overwrite it).
    @discardableResult
    func update(_ key: CacheDigest, _ change: (StoredResponse) -> StoredResponse) -> StoreOutcome {
        // A marking in between counts as a change: the stale flag read here would be lost.
        let (version, mark) = state.withLock { (Self.version(of: key, in: $0), $0.marks[key]) }
        guard let current = read(key) else { return .overtaken }
        return store(change(current), ifUnchangedSince: (version, mark))
    }

    /// What `store` did with a response.
    enum StoreOutcome: Equatable {
        /// Queued to be written, as this version of its key.
        case queued(version: UInt64)
        /// Not stored: larger than `maxBytes`, past the file format's limits, or the cache is closed.
        case refused
        /// Not stored: another store or removal of the key came first (`ifUnchangedSince`), or
        /// nothing was stored to change (`update`).
        case overtaken
    }

    /// Changes the note of every stored response whose method and URL match `predicate` and marks
    /// it stale (exchanges in flight for those URLs store what they bring stale), then waits until
    /// the changed files are written. A response whose change cannot be written (refused, or its
    /// write failed) is removed, so that no file is left without its note; returns how many were.
    /// A response removed meanwhile is left removed.
    func annotate(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool, _ change: (Data) -> Data) async -> Int {
        // A file the disk would not delete before (a read removed when its note failed) would come
        // back at a relaunch without this note either: it is tried again first.
        retryUndeleted()
        let summaries = matchingSummaries(predicate)
        bumpStaleEpochs(Set(summaries.map(\.primaryKey)).union(matchingExchanges(predicate)))
        var queued: [(key: CacheDigest, version: UInt64)] = []
        var failed: [CacheDigest] = []
        for key in summaries.map(\.key) {
            // Another change of the response between reading and writing it (another marking
            // stale, say) would otherwise drop this one: it is made again on what is there now,
            // until it lands or nothing is stored under the key any more.
            changing: while true {
                let outcome = update(key) { stored in
                    var annotated = stored
                    annotated.note = change(stored.note)
                    annotated.isInvalidated = true
                    return annotated
                }
                switch outcome {
                case .queued(let version): queued.append((key, version))
                case .refused: failed.append(key)
                case .overtaken: if read(key) != nil { continue changing }
                }
                break
            }
        }
        guard !queued.isEmpty || !failed.isEmpty else { return 0 }
        for (key, version) in queued { await waitUntilFinished(key, version: version) }
        failed += state.withLock { state in
            queued.filter { Self.version(of: $0.key, in: state) == $0.version && state.written[$0.key] != $0.version }.map(\.key)
        }
        remove(failed)
        return failed.count
    }

    /// The number of the latest time `primaryKey` was marked stale (0: never). An exchange with
    /// the origin that began under an older number may carry the state from before whatever made
    /// it stale: what it brings is stored stale, and later reads do not join it.
    func staleEpoch(of primaryKey: CacheDigest) -> UInt64 {
        state.withLock { $0.staleEpochs[primaryKey] ?? 0 }
    }

    /// Starts a new stale epoch for these primary keys, whether anything is stored under them or not.
    func bumpStaleEpochs(_ primaryKeys: some Sequence<CacheDigest>) {
        // In a fixed order: the numbers name shared exchanges, and a set's order varies by run.
        // (The digests' own order, which is their hex strings' order without making a string per
        // comparison: sorting 5 000 by `hex` took 50–100 ms.)
        let ordered = primaryKeys.sorted()
        state.withLock { state in
            for key in ordered {
                state.staleEpochs[key] = state.nextStaleEpoch
                state.nextStaleEpoch += 1
            }
        }
    }

    /// Marks every variant stored under these primary keys stale (RFC 9111 §4.4 "invalidate"):
    /// kept, to be shown offline and revalidated, never served as fresh again.
    func markStale(_ primaryKeys: [CacheDigest]) {
        bumpStaleEpochs(primaryKeys)
        mark(variantKeys(of: primaryKeys))
    }

    /// Marks the responses stored under `keys` stale: in memory at once, and on disk by one
    /// append to the marks file — not by rewriting each response's file, so marking 5 000
    /// responses costs little more than marking 10. When the marks file cannot be written (a full
    /// or failing disk), the responses are removed instead: a relaunch must never read one back as
    /// fresh.
    private func mark(_ keys: [CacheDigest]) {
        guard !keys.isEmpty else { return }
        let marked = state.withLock { state -> [CacheDigest] in
            var marked: [CacheDigest] = []
            for key in keys where state.index[key] != nil || state.pending[key] != nil || state.memory[key] != nil {
                state.marks[key] = state.nextMark
                state.nextMark += 1
                state.durableMarks[key] = Self.version(of: key, in: state)
                marked.append(key)
            }
            return marked
        }
        guard !marked.isEmpty else { return }
        if appendMarks(marked) != nil { remove(keys) }
    }

    /// Appends `keys` to the marks file (writing it whole when there is none), then rewrites it
    /// whole when it holds many more records than marks; returns the failure, if the append (or
    /// the first write) failed.
    private func appendMarks(_ keys: [CacheDigest]) -> ResponseCacheError? {
        let (failure, compact) = marksFile.withLock { _ -> (ResponseCacheError?, Bool) in
            guard !state.withLock({ $0.closed }) else { return (nil, false) }  // the folder may be another cache's
            do throws(FileSystemError) {
                try FileSystem.appendFile(StaleMarksFile.records(keys), to: path + "/" + StaleMarksFile.name)
            } catch {
                // None yet (or cleared): written whole, with these.
                if error.errno == ENOENT { return (writeMarksLocked(), false) }
                return (noteStoreFailure(error), false)
            }
            let compact = state.withLock { state in
                state.marksFileRecords += keys.count
                return state.marksFileRecords > max(1_024, 2 * state.durableMarks.count)
            }
            return (nil, compact)
        }
        if compact { writeMarks() }
        return failure
    }

    private func noteStoreFailure(_ error: FileSystemError) -> ResponseCacheError {
        let failure = ResponseCacheError.storage(operation: error.operation, path: error.path, errno: error.errno)
        state.withLock { state in
            state.statistics.storeFailures += 1
            state.statistics.lastStoreFailure = failure
        }
        return failure
    }

    /// Writes the marks file from `durableMarks` (removing it when there are none), after
    /// forgetting the marks of keys that no longer have a file; returns the failure, if the write
    /// failed (also counted as a store failure). A closed cache writes nothing (another cache may
    /// own the folder now), unless `close()` itself asks, before it lets the folder go.
    @discardableResult
    private func writeMarks(evenIfClosed: Bool = false) -> ResponseCacheError? {
        marksFile.withLock { _ in writeMarksLocked(evenIfClosed: evenIfClosed) }
    }

    /// `writeMarks`, for a caller holding `marksFile`.
    private func writeMarksLocked(evenIfClosed: Bool = false) -> ResponseCacheError? {
        let keys = state.withLock { state -> [CacheDigest]? in
            state.marksRewriteScheduled = false
            guard evenIfClosed || !state.closed else { return nil }
            state.durableMarks = state.durableMarks.filter { key, _ in
                state.index[key] != nil || state.pending[key] != nil || state.fileOwners.contains(key) || state.undeleted.contains(key)
            }
            state.endedMarks = 0
            state.marksFileRecords = state.durableMarks.count
            return state.durableMarks.keys.sorted()
        }
        guard let keys else { return nil }
        do throws(FileSystemError) {
            if keys.isEmpty {
                try FileSystem.removeFile(path + "/" + StaleMarksFile.name)
            } else {
                try FileSystem.writeFile(
                    StaleMarksFile.encode(keys), to: path + "/" + StaleMarksFile.name, via: path + "/" + StaleMarksFile.tempName, sync: false)
            }
            return nil
        } catch {
            return noteStoreFailure(error)
        }
    }

    /// The keys the folder's marks file lists, how many records it holds, and whether it must be
    /// written afresh. A damaged or unreadable one lists every response opened: which were marked
    /// is unknown, and a marked one must not be served as fresh.
    private static func readMarks(folder: Int32, opened: CacheFolder.Opened) -> (keys: [CacheDigest], records: Int, rewrite: Bool) {
        var buffer: [UInt8] = []
        var info = stat()
        switch FileSystem.readRegularFile(named: StaleMarksFile.name, in: folder, maximumSize: 1 << 30, into: &buffer, info: &info) {
        case .vanished:
            return ([], 0, false)
        case .bytes(let length):
            switch buffer.withUnsafeBytes({ StaleMarksFile.decode(UnsafeRawBufferPointer(rebasing: $0[0..<length])) }) {
            case .keys(let keys, let cut): return (keys, keys.count, cut)
            case .damaged: return (opened.entries.map(\.summary.key), 0, true)
            }
        case .notRegular, .tooLarge, .failed:
            return (opened.entries.map(\.summary.key), 0, true)
        }
    }

    /// The keys stored under these primary keys: written, kept in memory, or waiting to be written.
    private func variantKeys(of primaryKeys: [CacheDigest]) -> [CacheDigest] {
        state.withLock { state in
            var keys: [CacheDigest] = []
            for primaryKey in primaryKeys {
                for key in state.index.variants(of: primaryKey) + state.memoryIndex.variants(of: primaryKey) where !keys.contains(key) {
                    keys.append(key)
                }
            }
            for (key, response) in state.pending where primaryKeys.contains(response.primaryKey) && !keys.contains(key) {
                keys.append(key)
            }
            return keys
        }
    }

    /// The response under `key`: the one waiting to be written, else the decoded copy in
    /// memory, else its file. Marks it recently used.
    private func read(_ key: CacheDigest) -> StoredResponse? {
        enum Found {
            case response(StoredResponse)
            case disk(size: Int)
            case none
        }
        let found = state.withLock { state -> Found in
            if var response = state.pending[key] ?? state.memory[key] {
                state.memoryIndex.touch(key)
                state.index.touch(key)
                if state.marks[key] != nil { response.isInvalidated = true }
                return .response(response)
            }
            return state.index[key].map { .disk(size: $0.size) } ?? .none
        }
        switch found {
        case .response(let response): return response
        case .none: return nil
        case .disk(let size):
            return readFile(key, expectedSize: size)
        }
    }

    private func count(hit: Bool) {
        state.withLock { state in
            if hit { state.statistics.hits += 1 } else { state.statistics.misses += 1 }
        }
    }

    private func readFile(_ key: CacheDigest, expectedSize: Int) -> StoredResponse? {
        guard gate.enter() else { return nil }  // closed: the folder may be another cache's now
        defer { gate.leave() }
        var buffer: [UInt8] = []
        var info = stat()
        let name = CacheFolder.fileName(key)
        let read = FileSystem.readRegularFile(named: name, in: folder, maximumSize: max(expectedSize, maxBytes), into: &buffer, info: &info)
        var decoded: StoredResponse?
        var corrupt = false
        switch read {
        case .bytes(let length):
            decoded = buffer.withUnsafeBytes { bytes in try? CacheFileFormat.decode(UnsafeRawBufferPointer(rebasing: bytes[0..<length])) }
            if decoded?.key != key { decoded = nil }
            corrupt = decoded == nil
        case .notRegular, .tooLarge:
            corrupt = true
        case .vanished, .failed:
            break  // gone (evicted or cleared meanwhile) or unreadable now: a miss, not a verdict
        }
        let (deletes, marked) = state.withLock { state -> (Bool, Bool) in
            if let decoded {
                state.index.touch(key)
                Self.remember(decoded, in: &state, budget: memoryBytes)  // as in its file: a mark is applied on each read
                return (false, state.marks[key] != nil)
            }
            guard corrupt else { return (false, false) }
            if state.index.remove(key) != nil {
                state.statistics.corruptRemoved += 1
                Self.updateTotals(&state)
            }
            return (Self.claimFileDeletion(key, in: &state), false)
        }
        if deletes { deleteFiles([key]) }
        guard var response = decoded else { return nil }
        FileSystem.touch(named: name, in: folder)  // recency survives a restart
        if marked { response.isInvalidated = true }
        return response
    }

    // MARK: - Writing

    /// Stores `response` (replacing what `response.key` held): at once for reads, then in its
    /// file, written in the background after the least recently used files are deleted to make
    /// room. A write that fails is counted; the caller is never told (it already has its
    /// response). With `ifUnchangedSince`, only if the key's latest store or removal is still that
    /// version and no marking stale came since (see `update`).
    @discardableResult
    func store(_ response: StoredResponse, ifUnchangedSince expected: (version: UInt64, mark: UInt64?)? = nil) -> StoreOutcome {
        let data: Data
        do {
            data = try CacheFileFormat.encode(response)
        } catch {
            state.withLock { $0.statistics.beyondFormatLimits += 1 }
            return .refused
        }
        guard data.count <= maxBytes else {
            state.withLock { $0.statistics.tooLargeToStore += 1 }
            return .refused
        }
        let admitted = state.withLock { state -> (Bool, [CacheDigest], UInt64?)? in
            guard !state.closed else { return nil }
            if let expected, Self.version(of: response.key, in: state) != expected.version || state.marks[response.key] != expected.mark {
                return (false, [], nil)
            }
            // At most `maxVariants` per URL: a server that varies on a header whose value changes
            // with every request must not fill the cache with one URL's variants. Oldest stored
            // first; of equal age, the one stored earlier in this process.
            var others: [CacheDigest: Date] = [:]
            for index in [state.index, state.memoryIndex] {
                for key in index.variants(of: response.primaryKey) where key != response.key {
                    others[key] = index[key]?.summary.storedAt
                }
            }
            for (key, pending) in state.pending where pending.primaryKey == response.primaryKey && key != response.key {
                others[key] = pending.storedAt
            }
            let oldestFirst = others.map { (key: $0.key, storedAt: $0.value, version: state.latest[$0.key] ?? 0) }
                .sorted { ($0.storedAt, $0.version, $0.key) < ($1.storedAt, $1.version, $1.key) }
                .map(\.key)
            let dropped = Array(oldestFirst.prefix(max(0, oldestFirst.count - (Self.maxVariants - 1))))
            if !dropped.isEmpty { Self.forget(dropped, in: &state) }
            Self.remember(response, in: &state, budget: memoryBytes)
            let version = state.nextVersion
            state.nextVersion += 1
            state.latest[response.key] = version
            state.marks[response.key] = nil  // the response carries its own flag
            state.pending[response.key] = response
            state.queued[response.key] = .write(WriteJob(response: response, data: data, version: version))
            return (state.fileOwners.insert(response.key).inserted, dropped.filter { Self.claimFileDeletion($0, in: &state) }, version)
        }
        guard let (startWriter, dropped, version) = admitted else { return .refused }  // closed
        deleteFiles(dropped)
        if startWriter { pool.submit { [self] in fileLoop(response.key) } }
        return version.map { .queued(version: $0) } ?? .overtaken
    }

    /// Returns once the write of `key` at `version` is finished (written, or failed), or was
    /// overtaken by a newer store or a removal — whatever other keys are writing, and whether or
    /// not the calling task is cancelled (the wait is for disk I/O, which always ends).
    private func waitUntilFinished(_ key: CacheDigest, version: UInt64) async {
        let settled: @Sendable (State) -> Bool = { state in
            (state.finished[key] ?? 0) >= version || Self.version(of: key, in: state) != version
        }
        await Task { [state] in
            while !state.withLock({ settled($0) }) {
                await state.wait(on: \.writeWaiters, tag: key, cancelled: ()) { settled($0) ? () : nil }
            }
        }.value
    }

    /// Returns once every response stored so far is in its file (or its write failed, which
    /// `statistics` counts): before the app is suspended, or a test reopens the folder. A cancelled
    /// caller returns at once.
    public func waitForWrites() async {
        await state.wait(on: \.idleWaiters, tag: (), cancelled: ()) { $0.fileOwners.isEmpty ? () : nil }
    }

    /// Runs on an I/O pool thread as the owner of `key`'s file: writes the newest queued response,
    /// or deletes the file, until nothing is queued for it.
    private func fileLoop(_ key: CacheDigest) {
        enum Step {
            case write(WriteJob, evicted: [CacheDigest])
            case delete
            case waitForRoom(evicted: [CacheDigest])
        }
        while true {
            let (next, woken) = state.withLock { state -> (Step?, [WaiterList<Void, CacheDigest>.Waiter]) in
                // `annotate` waiting on this key looks again at each step (a removal or a clear
                // may have overtaken the write it waits for).
                let woken = state.writeWaiters.takeAll { $0 == key }
                guard let job = state.queued.removeValue(forKey: key) else {
                    state.fileOwners.remove(key)
                    return (nil, woken)
                }
                guard case .write(let write) = job else { return (.delete, woken) }
                // Make room first, so the folder never holds more than maxBytes; the victims this
                // thread may delete now (the others' owners delete them).
                let current = state.index[key]?.size ?? 0
                let reservedElsewhere = state.reserved.values.reduce(0, +)
                let evicted = Self.evict(&state, toFit: maxBytes - write.data.count - reservedElsewhere + current, sparing: key)
                    .filter { Self.claimFileDeletion($0, in: &state) }
                guard state.index.totalBytes - current + reservedElsewhere + write.data.count <= maxBytes else {
                    // Other writes in flight hold the room this one needs (every stored response
                    // is evicted already): it waits for one of them to end, still the key's owner.
                    state.queued[key] = job
                    state.waitingForRoom.append(key)
                    return (.waitForRoom(evicted: evicted), woken)
                }
                state.reserved[key] = write.data.count
                state.inFlight[key] = write.version
                return (.write(write, evicted: evicted), woken)
            }
            for waiter in woken { waiter.continuation.resume(returning: ()) }
            guard let next else { break }
            let job: WriteJob
            switch next {
            case .delete:
                deleteFile(key)
                continue
            case .waitForRoom(let evicted):
                deleteFiles(evicted)
                return
            case .write(let write, let evicted):
                deleteFiles(evicted)
                job = write
            }
            var failure: FileSystemError?
            if state.withLock({ Self.version(of: key, in: $0) == job.version }) {
                do {
                    try FileSystem.writeFile(job.data, to: filePath(key), via: path + "/." + CacheFolder.fileName(key) + ".tmp", sync: false)
                } catch {
                    failure = error
                }
            }
            var rewriteMarks = false
            let (unwanted, waiting, annotating) = state.withLock { state -> (Bool, [CacheDigest], [WaiterList<Void, CacheDigest>.Waiter]) in
                state.reserved[key] = nil
                state.inFlight[key] = nil
                // Kept only for the current version (an overtaken write's waiters are settled by
                // the version), so it holds no more keys than the index does.
                state.finished[key] = Self.version(of: key, in: state) == job.version ? job.version : nil
                let annotating = state.writeWaiters.takeAll { $0 == key }
                let waiting = state.waitingForRoom
                state.waitingForRoom = []
                // Removed, replaced or cleared meanwhile: a job queued since takes over (a newer
                // write replaces the file, a deletion deletes it); with none, the file goes.
                guard Self.version(of: key, in: state) == job.version else { return (state.queued[key] == nil, waiting, annotating) }
                state.pending[key] = nil  // reads go to the file (or, if it failed, the previous one)
                defer { Self.updateTotals(&state) }
                if let failure {
                    state.statistics.storeFailures += 1
                    state.statistics.lastStoreFailure = .storage(operation: failure.operation, path: failure.path, errno: failure.errno)
                    // The file left is the previous one: kept while the index holds it, else it
                    // goes; marked stale again if the marks file lists it.
                    if state.index[key] != nil, state.durableMarks[key] != nil {
                        state.marks[key] = state.nextMark
                        state.nextMark += 1
                    }
                    return (state.index[key] == nil, waiting, annotating)
                }
                if let marked = state.durableMarks[key], job.version > marked {
                    state.durableMarks[key] = nil  // this file carries its own flag
                    state.endedMarks += 1
                    // Many ended (revalidations after a marking of many): the file is rewritten in
                    // the background, so a relaunch does not revalidate them all again.
                    if state.endedMarks >= 64, state.endedMarks >= state.durableMarks.count, !state.marksRewriteScheduled {
                        state.marksRewriteScheduled = true
                        rewriteMarks = true
                    }
                }
                state.index.insert(job.response.summary, size: job.data.count)
                state.undeleted.remove(key)  // the file is this response's now
                state.written[key] = job.version
                state.statistics.stored += 1
                return (false, waiting, annotating)
            }
            if unwanted { deleteFile(key) } else if failure == nil { retryUndeleted() }
            if rewriteMarks { pool.submit { [self] in writeMarks() } }
            for waiter in annotating { waiter.continuation.resume(returning: ()) }
            for waiter in waiting { pool.submit { [self] in fileLoop(waiter) } }
        }
        let waiters = state.withLock { state in
            state.fileOwners.isEmpty ? state.idleWaiters.takeAll() : []
        }
        for waiter in waiters { waiter.resume(returning: ()) }
    }

    /// Once `key`'s response has left the cache in memory (removed, replaced by a newer variant,
    /// evicted, found corrupt, cleared), arranges for its file to go. Only a key's owner touches
    /// its file: with no owner, the caller becomes it and must delete the file, then `release`
    /// the key (true); a file loop that owns it deletes the file after what it is doing (false) —
    /// unless it is writing, or has queued, a current response of the key, whose file replaces the
    /// old one. So a deletion decided before a store never removes the file that store writes.
    private static func claimFileDeletion(_ key: CacheDigest, in state: inout State) -> Bool {
        // Closed: no new owner; the file stays for whoever opens the folder next (who indexes it).
        if state.closed, !state.fileOwners.contains(key) { return false }
        guard !state.fileOwners.insert(key).inserted else { return true }
        let current = version(of: key, in: state)
        let currentWriteQueued = if case .write(let job) = state.queued[key] { job.version == current } else { false }
        if !currentWriteQueued, state.inFlight[key] != current { state.queued[key] = .delete }
        return false
    }

    /// Deletes the files of keys the caller claimed (`claimFileDeletion`), then releases them.
    private func deleteFiles(_ keys: [CacheDigest]) {
        guard !keys.isEmpty else { return }
        for key in keys { deleteFile(key) }
        release(keys)
    }

    /// Deletes `key`'s file (the caller owns the key). A file the disk refuses to delete is kept
    /// in `undeleted`: the index has forgotten it, but a relaunch would read it back, so it is
    /// tried again (`retryUndeleted`).
    private func deleteFile(_ key: CacheDigest) {
        let deleted = (try? FileSystem.removeFile(filePath(key))) != nil
        noteDeletion(of: key, succeeded: deleted)
    }

    private func noteDeletion(of key: CacheDigest, succeeded: Bool) {
        state.withLock { state in
            if succeeded { state.undeleted.remove(key) } else { state.undeleted.insert(key) }
            Self.updateTotals(&state)
        }
    }

    /// Tries again to delete the files the disk refused to delete, of keys no one owns now (a
    /// write of the key replaces its file, and takes it out of `undeleted`).
    private func retryUndeleted() {
        let claimed = state.withLock { state -> [CacheDigest] in
            guard !state.undeleted.isEmpty else { return [] }
            guard !state.closed else { return [] }
            return state.undeleted.sorted().filter { state.index[$0] == nil && state.fileOwners.insert($0).inserted }
        }
        deleteFiles(claimed)
    }

    /// Gives up the ownership of keys whose files the caller has dealt with; a job queued for one
    /// meanwhile gets a file loop of its own.
    private func release(_ keys: [CacheDigest]) {
        let (loops, waiters) = state.withLock { state in
            var loops: [CacheDigest] = []
            for key in keys {
                if state.queued[key] != nil { loops.append(key) } else { state.fileOwners.remove(key) }
            }
            return (loops, state.fileOwners.isEmpty ? state.idleWaiters.takeAll() : [])
        }
        for key in loops { pool.submit { [self] in fileLoop(key) } }
        for waiter in waiters { waiter.resume(returning: ()) }
    }

    // MARK: - Internals

    private func filePath(_ key: CacheDigest) -> String { path + "/" + CacheFolder.fileName(key) }

    /// Removes least recently used entries from the index until its files take at most `limit`
    /// bytes; returns their keys (the caller deletes the files).
    private static func evict(_ state: inout State, toFit limit: Int, sparing spared: CacheDigest? = nil) -> [CacheDigest] {
        // From the oldest, only as far as needed: the whole list walked on every store made a
        // store into a cache of 100 000 responses take milliseconds, under the cache's lock.
        let victims = state.index.evictionCandidates(toFit: limit, sparing: spared)
        for key in victims {
            state.index.remove(key)
            state.memory[key] = nil
            state.memoryIndex.remove(key)
            state.marks[key] = nil
        }
        state.statistics.evicted += victims.count
        return victims
    }

    /// Keeps a decoded copy of `response` among the most recently used, within `budget` bytes.
    private static func remember(_ response: StoredResponse, in state: inout State, budget: Int) {
        let size = response.body.count + 512
        guard size <= budget else {
            state.memory[response.key] = nil
            state.memoryIndex.remove(response.key)
            return
        }
        state.memory[response.key] = response
        state.memoryIndex.insert(response.summary, size: size)
        for key in state.memoryIndex.evictionCandidates(toFit: budget) {
            state.memoryIndex.remove(key)
            state.memory[key] = nil
        }
    }

    private static func updateTotals(_ state: inout State) {
        state.statistics.entries = state.index.count
        state.statistics.bytes = state.index.totalBytes
        state.statistics.undeletedFiles = state.undeleted.count
    }
}
