import Foundation
import RequestEngine
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The offline queue's storage: one JSON file per entry, written durably, indexed in memory.
///
/// **Layout** of the folder given to `init(directory:)`:
/// ```
/// <directory>/
///   <UUID>.json            one live entry per file (mode 0600)
///   .<UUID>.json.tmp       a write in progress (dot-prefixed; removed at open if a crash left it)
///   quarantine/            files that could not be read or decoded, moved aside at open
///   dead-letter/           entries that used up `maxAttempts`
/// ```
///
/// **Durability**: `save`/insert returns only after the entry's bytes were written to a temp
/// file, the file was fsynced, renamed to `<id>.json`, and the directory was fsynced — so an
/// acknowledged entry survives a crash or power loss. Concurrent inserts share directory fsyncs
/// (group commit). Deletions and attempt updates are not directory-fsynced: after a crash a
/// delivered entry may come back and be replayed once more, with the same `Idempotency-Key`
/// (at-least-once), and an attempt counter may read one lower.
///
/// **Open**: the folder is listed once and each file decoded once (in parallel); replay order and
/// counts come from the in-memory index afterwards. A file that cannot be read, is not valid JSON,
/// has an unknown method or format version, or whose name does not match its id is moved to
/// `quarantine/` and listed in `openReport` — never counted, never fatal.
///
/// **Errors**: a full disk, an unwritable folder or any failed file call is thrown as
/// `OfflineQueueError.storage(operation:path:errno:)`; the entry is then not stored and no partial
/// file is left.
public final class DiskQueueStore: Sendable {
    /// A file moved to `quarantine/` when the store opened.
    public struct QuarantinedFile: Sendable, Hashable {
        /// The file's name as it was in the queue folder.
        public let name: String
        /// Why it could not be loaded.
        public let reason: String
    }

    /// What opening the folder found.
    public struct OpenReport: Sendable {
        /// Entries loaded into the queue.
        public let loaded: Int
        /// Files moved to `quarantine/`.
        public let quarantined: [QuarantinedFile]
        /// Temp files of interrupted writes that were removed.
        public let removedTemporaryFiles: Int
        /// Older revisions of coalesced entries that a crash left behind, removed.
        public let removedSupersededEntries: Int
    }

    /// The queue folder.
    public let directory: URL
    /// `<directory>/quarantine`.
    public let quarantineDirectory: URL
    /// `<directory>/dead-letter`.
    public let deadLetterDirectory: URL
    /// What the open found (entries loaded, files quarantined, temp files removed).
    public let openReport: OpenReport

    // A lock rather than an actor: the replay loop reads and updates the index several times per
    // entry, and an actor hop for each of those cost more than the file operations themselves.
    // Only in-memory bookkeeping happens under the lock; fsyncs run on `BlockingIOPool`.
    private struct State: Sendable {
        var index: QueueIndex
        var nextSequence: UInt64
        var reservedSlots = 0
        var writesInFlight: [UUID: Int] = [:]
        var removedDuringWrite: Set<UUID> = []
    }

    private let state: Locked<State>
    private let directoryPath: String
    private let syncer: DirectorySyncer
    private let pool: BlockingIOPool

    /// Opens (creating if needed, mode 0700) the queue folder and loads every entry in it.
    ///
    /// - Parameter directory: the folder; by default `Application Support/Resilience/OfflineQueue`
    ///   (on Linux `~/.local/share/Resilience/OfflineQueue`).
    /// - Throws: `OfflineQueueError.storage` when the folder cannot be created or listed.
    public init(directory: URL? = nil) throws {
        let directory = try directory ?? Self.defaultDirectory()
        self.directory = directory
        directoryPath = directory.path
        quarantineDirectory = directory.appendingPathComponent("quarantine", isDirectory: true)
        deadLetterDirectory = directory.appendingPathComponent("dead-letter", isDirectory: true)
        pool = BlockingIOPool.shared
        syncer = DirectorySyncer(path: directory.path)
        try Self.makeDirectories(directory)
        try DurableFiles.makeDirectory(quarantineDirectory.path)
        try DurableFiles.makeDirectory(deadLetterDirectory.path)
        let loaded = try Self.load(directory: directory, quarantine: quarantineDirectory)
        let index = QueueIndex(loading: loaded.entries)
        state = Locked(State(index: index, nextSequence: index.maxSequence + 1))
        openReport = OpenReport(
            loaded: index.count,
            quarantined: loaded.quarantined,
            removedTemporaryFiles: loaded.removedTemporaryFiles,
            removedSupersededEntries: loaded.removedSuperseded
        )
    }

    /// A read-only look at a queue folder, for operators: nothing is moved, removed or locked.
    public struct Inspection: Sendable {
        /// Entries that would load, in replay order.
        public let entries: [QueueEntry]
        /// Entry files in the folder that would be quarantined at the next open, with the reason.
        public let unreadable: [QuarantinedFile]
        /// Names of files already in `quarantine/`.
        public let quarantined: [String]
        /// Entries in `dead-letter/`.
        public let deadLetters: Int
        /// Leftover temp files of interrupted writes.
        public let temporaryFiles: Int
    }

    /// Reads a queue folder without changing it (unlike `init(directory:)`, which removes temp files
    /// and quarantines unreadable ones).
    public static func inspect(directory: URL) throws -> Inspection {
        let names = try DurableFiles.listDirectory(directory.path)
        let candidates = names.filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }
        var entries: [QueueEntry] = []
        var unreadable: [QuarantinedFile] = []
        for (name, result) in zip(candidates, decodeAll(candidates, in: directory)) {
            switch result {
            case .entry(let entry): entries.append(entry)
            case .corrupt(let reason): unreadable.append(QuarantinedFile(name: name, reason: reason))
            }
        }
        let quarantine = directory.appendingPathComponent("quarantine").path
        let deadLetter = directory.appendingPathComponent("dead-letter").path
        return Inspection(
            entries: QueueIndex(loading: entries).ordered(),
            unreadable: unreadable.sorted { $0.name < $1.name },
            quarantined: ((try? DurableFiles.listDirectory(quarantine)) ?? []).sorted(),
            deadLetters: ((try? DurableFiles.listDirectory(deadLetter)) ?? []).filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }.count,
            temporaryFiles: names.filter { $0.hasPrefix(".") && $0.hasSuffix(".tmp") }.count
        )
    }

    // MARK: - Reading (from the index, never from the folder)

    /// Every entry in replay order: priority descending, then FIFO.
    public func load() async -> [QueueEntry] { orderedEntries() }

    /// The number of entries (expired ones included until they are swept).
    public func count() async -> Int { entryCount }

    /// Every entry in replay order, without suspending.
    public func orderedEntries() -> [QueueEntry] { state.withLock { $0.index.ordered() } }

    /// The number of entries, without suspending.
    public var entryCount: Int { state.withLock { $0.index.count } }

    /// The entry with this id, if queued.
    public func entry(id: UUID) -> QueueEntry? { state.withLock { $0.index[id] } }

    /// Whether any entry carries `orderingKey`.
    func hasEntries(orderingKey: String) -> Bool { state.withLock { $0.index.contains(orderingKey: orderingKey) } }

    /// The entry holding `coalescingKey`, if any.
    func entry(coalescingKey: String) -> QueueEntry? { state.withLock { $0.index.entry(coalescingKey: coalescingKey) } }

    /// Entries moved to `dead-letter/`, read from that folder (oldest first).
    public func deadLetters() -> [QueueEntry] {
        let names = (try? DurableFiles.listDirectory(deadLetterDirectory.path)) ?? []
        let decoder = QueueEntry.makeDecoder()
        return names.filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }
            .compactMap { name in
                try? decoder.decode(QueueEntry.self, from: DurableFiles.readFile(deadLetterDirectory.appendingPathComponent(name).path))
            }
            .sorted { $0.sequence < $1.sequence }
    }

    // MARK: - Writing

    /// Stores `entry` durably (insert or replace). Published-API spelling of an insert without a limit.
    public func save(_ entry: QueueEntry) async throws {
        try await insert(entry, limit: nil, replacing: nil)
    }

    /// Removes an entry (a no-op if it is not there).
    public func delete(id: UUID) async {
        try? remove(id: id)
    }

    /// Removes every entry that has expired at `now`; returns how many.
    @discardableResult
    public func deleteExpired(now: Date = Date()) async -> Int {
        let expired = orderedEntries().filter { $0.isExpired(at: now) }
        for entry in expired { await delete(id: entry.id) }
        return expired.count
    }

    /// The sequence number for a new entry.
    func makeSequence() -> UInt64 {
        state.withLock { state in
            defer { state.nextSequence += 1 }
            return state.nextSequence
        }
    }

    /// Durably inserts `entry`. With `limit`, throws `.full` when the store (counting inserts in
    /// progress) already holds that many entries — unless `replacing` names a live entry, which the
    /// new one replaces once it is safely on disk.
    func insert(_ entry: QueueEntry, limit: Int?, replacing old: UUID?) async throws {
        let needsSlot = try state.withLock { state -> Bool in
            let needsSlot = old.flatMap { state.index[$0] } == nil && state.index[entry.id] == nil
            if needsSlot, let limit, state.index.count + state.reservedSlots >= limit { throw OfflineQueueError.full }
            if needsSlot { state.reservedSlots += 1 }
            return needsSlot
        }
        defer { if needsSlot { state.withLock { $0.reservedSlots -= 1 } } }

        let data = try encode(entry)
        let path = filePath(entry.id)
        let syncer = self.syncer
        try await write(data, for: entry.id) {
            do {
                try syncer.sync()
            } catch {
                // Not known to be durable: do not report it as queued.
                try? DurableFiles.removeFile(path)
                throw error
            }
        }
        state.withLock { $0.index.upsert(entry) }
        if let old, old != entry.id { try? remove(id: old) }
    }

    /// Replaces a live entry's file (attempts, next attempt). A no-op for an entry no longer queued.
    func update(_ entry: QueueEntry) async throws {
        guard self.entry(id: entry.id) != nil else { return }
        let data = try encode(entry)
        try await write(data, for: entry.id)
        state.withLock { state in
            if state.index[entry.id] != nil { state.index.upsert(entry) }
        }
    }

    /// Removes an entry from the index and deletes its file. `unlink` is a metadata operation that
    /// does not wait for the disk (no fsync: see the durability notes), so it runs inline — and
    /// synchronously: an `async` function here would make the queue's actor hop off and back for
    /// every delivered entry.
    func remove(id: UUID) throws {
        let removed = state.withLock { state -> Bool in
            guard state.index.remove(id) != nil else { return false }
            if state.writesInFlight[id] != nil { state.removedDuringWrite.insert(id) }
            return true
        }
        guard removed else { return }
        try DurableFiles.removeFile(filePath(id))
    }

    /// Removes every entry.
    func removeAll() async throws {
        let ids = state.withLock { Array($0.index.entries.keys) }
        for id in ids { try remove(id: id) }
    }

    /// Moves an entry to `dead-letter/`, with its final attempt count and error.
    func moveToDeadLetter(_ entry: QueueEntry) async throws {
        let data = try encode(entry)
        let target = deadLetterDirectory.path + "/\(entry.id.uuidString).json"
        let temp = deadLetterDirectory.path + "/.\(entry.id.uuidString).json.tmp"
        let deadLetterPath = deadLetterDirectory.path
        try await pool.run {
            try DurableFiles.writeFile(data, to: target, via: temp)
            try DurableFiles.syncDirectory(deadLetterPath)
        }
        try remove(id: entry.id)
    }

    // MARK: - Internals

    /// Writes the entry's file (temp, fsync, rename) on the I/O pool, then runs `andThen` on the same
    /// pool thread (the directory fsync for inserts).
    private func write(_ data: Data, for id: UUID, andThen: @escaping @Sendable () throws -> Void = {}) async throws {
        let path = filePath(id)
        let temp = tempPath(id)
        state.withLock { $0.writesInFlight[id, default: 0] += 1 }
        defer {
            state.withLock { state in
                state.writesInFlight[id, default: 1] -= 1
                if state.writesInFlight[id] == 0 { state.writesInFlight[id] = nil }
            }
        }
        try await pool.run {
            try DurableFiles.writeFile(data, to: path, via: temp)
            try andThen()
        }
        // A remove that ran while this write was in flight must win over the rename.
        if state.withLock({ $0.removedDuringWrite.remove(id) != nil }) {
            try? DurableFiles.removeFile(path)
        }
    }

    private func encode(_ entry: QueueEntry) throws -> Data {
        do {
            return try QueueEntry.makeEncoder().encode(entry)
        } catch {
            throw OfflineQueueError.unstorable(reason: "encoding failed")
        }
    }

    // Paths are built as strings: `URL.appendingPathComponent` without a directory hint stats the
    // file system to decide on a trailing slash — two failed `stat` calls per enqueue.
    private func filePath(_ id: UUID) -> String { directoryPath + "/\(id.uuidString).json" }
    private func tempPath(_ id: UUID) -> String { directoryPath + "/.\(id.uuidString).json.tmp" }

    private static func defaultDirectory() throws -> URL {
        guard let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first else {
            throw OfflineQueueError.storage(operation: "locate Application Support", path: "~", errno: ENOENT)
        }
        return base.appendingPathComponent("Resilience", isDirectory: true)
            .appendingPathComponent("OfflineQueue", isDirectory: true)
    }

    private static func makeDirectories(_ directory: URL) throws {
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            let code = ((error as NSError).userInfo[NSUnderlyingErrorKey] as? NSError).map { Int32($0.code) } ?? EACCES
            throw OfflineQueueError.storage(operation: "create directory", path: directory.path, errno: code)
        }
        try DurableFiles.makeDirectory(directory.path)
    }

    // MARK: - Open

    private struct Loaded {
        var entries: [QueueEntry] = []
        var quarantined: [QuarantinedFile] = []
        var removedTemporaryFiles = 0
        var removedSuperseded = 0
    }

    private enum FileResult: Sendable {
        case entry(QueueEntry)
        case corrupt(String)
    }

    private static func load(directory: URL, quarantine: URL) throws -> Loaded {
        var loaded = Loaded()
        let names = try DurableFiles.listDirectory(directory.path)
        var candidates: [String] = []
        for name in names {
            if name.hasPrefix(".") && name.hasSuffix(".tmp") {
                try? DurableFiles.removeFile(directory.appendingPathComponent(name).path)
                loaded.removedTemporaryFiles += 1
            } else if name.hasSuffix(".json") && !name.hasPrefix(".") {
                candidates.append(name)
            }
        }
        let results = decodeAll(candidates, in: directory)
        var byCoalescingKey: [String: QueueEntry] = [:]
        for (name, result) in zip(candidates, results) {
            switch result {
            case .corrupt(let reason):
                moveToQuarantine(name, from: directory, to: quarantine)
                loaded.quarantined.append(QuarantinedFile(name: name, reason: reason))
            case .entry(let entry):
                guard let key = entry.coalescingKey else {
                    loaded.entries.append(entry)
                    continue
                }
                // A crash between writing a coalescing replacement and deleting its predecessor
                // leaves both: keep the newest revision.
                if let kept = byCoalescingKey[key] {
                    let (winner, loser) = kept.revision >= entry.revision ? (kept, entry) : (entry, kept)
                    byCoalescingKey[key] = winner
                    try? DurableFiles.removeFile(directory.appendingPathComponent("\(loser.id.uuidString).json").path)
                    loaded.removedSuperseded += 1
                } else {
                    byCoalescingKey[key] = entry
                }
            }
        }
        loaded.entries.append(contentsOf: byCoalescingKey.values)
        for name in (try? DurableFiles.listDirectory(quarantine.deletingLastPathComponent().appendingPathComponent("dead-letter").path)) ?? []
        where name.hasPrefix(".") && name.hasSuffix(".tmp") {
            try? DurableFiles.removeFile(directory.appendingPathComponent("dead-letter").appendingPathComponent(name).path)
        }
        return loaded
    }

    /// Reads and decodes every file, spread over the available cores. Files are opened relative to
    /// the folder's descriptor and read into one reusable buffer per worker.
    private static func decodeAll(_ names: [String], in directory: URL) -> [FileResult] {
        guard !names.isEmpty else { return [] }
        guard let directoryFD = try? DurableFiles.openDirectory(directory.path) else {
            return names.map { _ in .corrupt("folder could not be opened") }
        }
        defer { close(directoryFD) }
        let chunkCount = min(names.count, max(1, ProcessInfo.processInfo.activeProcessorCount) * 4)
        let chunkSize = (names.count + chunkCount - 1) / chunkCount
        let results = UnsafeMutableBufferPointer<FileResult>.allocate(capacity: names.count)
        results.initialize(repeating: .corrupt("unread"))
        defer {
            results.deinitialize()
            results.deallocate()
        }
        let base = UncheckedSendable(results)
        DispatchQueue.concurrentPerform(iterations: chunkCount) { chunk in
            let decoder = QueueEntry.makeDecoder()
            var buffer: [UInt8] = []
            let start = chunk * chunkSize
            let end = min(names.count, start + chunkSize)
            guard start < end else { return }
            for position in start..<end {
                // Each position is written by exactly one iteration.
                base.value[position] = decodeFile(names[position], directory: directoryFD, buffer: &buffer, decoder: decoder)
            }
        }
        return Array(results)
    }

    private static func decodeFile(_ name: String, directory: Int32, buffer: inout [UInt8], decoder: JSONDecoder) -> FileResult {
        let length: Int
        do {
            length = try DurableFiles.readFile(named: name, in: directory, into: &buffer)
        } catch {
            return .corrupt("unreadable: \(error)")
        }
        let fast = buffer.withUnsafeBufferPointer { QueueEntryDecoder.decode(UnsafeBufferPointer(rebasing: $0[0..<length])) }
        guard let entry = fast ?? (try? decoder.decode(QueueEntry.self, from: Data(buffer[0..<length]))) else {
            return .corrupt("not a valid queue entry (\(length) bytes)")
        }
        guard name.hasSuffix(".json"), QueueEntryDecoder.parseUUID(String(name.dropLast(5))) == entry.id else {
            return .corrupt("file name does not match entry id")
        }
        guard entry.formatVersion <= QueueEntry.currentFormatVersion else {
            return .corrupt("unsupported format version \(entry.formatVersion)")
        }
        guard entry.httpMethod != nil else { return .corrupt("unknown method \(entry.method)") }
        return .entry(entry)
    }

    private static func moveToQuarantine(_ name: String, from directory: URL, to quarantine: URL) {
        let source = directory.appendingPathComponent(name).path
        var target = quarantine.appendingPathComponent(name).path
        if FileManager.default.fileExists(atPath: target) {
            target = quarantine.appendingPathComponent("\(UUID().uuidString)-\(name)").path
        }
        if (try? DurableFiles.moveFile(source, to: target)) == nil {
            try? DurableFiles.removeFile(source)  // cannot move it aside: at least stop it blocking the queue
        }
    }
}

/// Wraps a value the compiler cannot prove Sendable, where the code using it guarantees
/// exclusive access (each buffer slot is written by one iteration only).
struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
