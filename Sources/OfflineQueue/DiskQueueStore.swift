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
public actor DiskQueueStore {
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
    public nonisolated let directory: URL
    /// `<directory>/quarantine`.
    public nonisolated let quarantineDirectory: URL
    /// `<directory>/dead-letter`.
    public nonisolated let deadLetterDirectory: URL
    /// What the open found (entries loaded, files quarantined, temp files removed).
    public nonisolated let openReport: OpenReport

    private var index: QueueIndex
    private var nextSequence: UInt64
    private var reservedSlots = 0
    private var writesInFlight: [UUID: Int] = [:]
    private var removedDuringWrite: Set<UUID> = []
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
        quarantineDirectory = directory.appendingPathComponent("quarantine", isDirectory: true)
        deadLetterDirectory = directory.appendingPathComponent("dead-letter", isDirectory: true)
        pool = BlockingIOPool.shared
        syncer = DirectorySyncer(path: directory.path, pool: pool)
        try Self.makeDirectories(directory)
        try DurableFiles.makeDirectory(quarantineDirectory.path)
        try DurableFiles.makeDirectory(deadLetterDirectory.path)
        let loaded = try Self.load(directory: directory, quarantine: quarantineDirectory)
        index = QueueIndex(loading: loaded.entries)
        nextSequence = index.maxSequence + 1
        openReport = OpenReport(
            loaded: index.count,
            quarantined: loaded.quarantined,
            removedTemporaryFiles: loaded.removedTemporaryFiles,
            removedSupersededEntries: loaded.removedSuperseded
        )
    }

    // MARK: - Reading (from the index, never from the folder)

    /// Every entry in replay order: priority descending, then FIFO.
    public func load() -> [QueueEntry] { index.ordered() }

    /// The number of entries (expired ones included until they are swept).
    public func count() -> Int { index.count }

    /// The entry with this id, if queued.
    public func entry(id: UUID) -> QueueEntry? { index[id] }

    /// Whether any entry carries `orderingKey`.
    func hasEntries(orderingKey: String) -> Bool { index.contains(orderingKey: orderingKey) }

    /// The entry holding `coalescingKey`, if any.
    func entry(coalescingKey: String) -> QueueEntry? { index.entry(coalescingKey: coalescingKey) }

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
        try? await remove(id: id)
    }

    /// Removes every entry that has expired at `now`; returns how many.
    @discardableResult
    public func deleteExpired(now: Date = Date()) async -> Int {
        let expired = index.ordered().filter { $0.isExpired(at: now) }
        for entry in expired { await delete(id: entry.id) }
        return expired.count
    }

    /// Nearest `nextSequence` for a new entry.
    func makeSequence() -> UInt64 {
        defer { nextSequence += 1 }
        return nextSequence
    }

    /// Durably inserts `entry`. With `limit`, throws `.full` when the store (counting inserts in
    /// progress) already holds that many entries — unless `replacing` names a live entry, which the
    /// new one replaces once it is safely on disk.
    func insert(_ entry: QueueEntry, limit: Int?, replacing old: UUID?) async throws {
        let needsSlot = old.flatMap { index[$0] } == nil && index[entry.id] == nil
        if needsSlot, let limit, index.count + reservedSlots >= limit { throw OfflineQueueError.full }
        if needsSlot { reservedSlots += 1 }
        defer { if needsSlot { reservedSlots -= 1 } }

        let data = try encode(entry)
        try await write(data, for: entry.id)
        do {
            try await syncer.sync()
        } catch {
            // Not known to be durable: do not report it as queued.
            try? DurableFiles.removeFile(fileURL(entry.id).path)
            throw error
        }
        index.upsert(entry)
        if let old, old != entry.id { try? await remove(id: old) }
    }

    /// Replaces a live entry's file (attempts, next attempt). A no-op for an entry no longer queued.
    func update(_ entry: QueueEntry) async throws {
        guard index[entry.id] != nil else { return }
        let data = try encode(entry)
        try await write(data, for: entry.id)
        if index[entry.id] != nil { index.upsert(entry) }
    }

    /// Removes an entry from the index and deletes its file.
    func remove(id: UUID) async throws {
        guard index.remove(id) != nil else { return }
        if writesInFlight[id] != nil { removedDuringWrite.insert(id) }
        let path = fileURL(id).path
        try await pool.run { try DurableFiles.removeFile(path) }
    }

    /// Removes every entry.
    func removeAll() async throws {
        let ids = index.entries.keys
        for id in ids { try await remove(id: id) }
    }

    /// Moves an entry to `dead-letter/`, with its final attempt count and error.
    func moveToDeadLetter(_ entry: QueueEntry) async throws {
        let data = try encode(entry)
        let target = deadLetterDirectory.appendingPathComponent("\(entry.id.uuidString).json").path
        let temp = deadLetterDirectory.appendingPathComponent(".\(entry.id.uuidString).json.tmp").path
        let deadLetterPath = deadLetterDirectory.path
        try await pool.run {
            try DurableFiles.writeFile(data, to: target, via: temp)
            try DurableFiles.syncDirectory(deadLetterPath)
        }
        try await remove(id: entry.id)
    }

    // MARK: - Internals

    private func write(_ data: Data, for id: UUID) async throws {
        let path = fileURL(id).path
        let temp = tempURL(id).path
        writesInFlight[id, default: 0] += 1
        defer {
            writesInFlight[id, default: 1] -= 1
            if writesInFlight[id] == 0 { writesInFlight[id] = nil }
        }
        try await pool.run { try DurableFiles.writeFile(data, to: path, via: temp) }
        // A remove that ran while this write was in flight must win over the rename.
        if removedDuringWrite.remove(id) != nil {
            try? await pool.run { try DurableFiles.removeFile(path) }
        }
    }

    private func encode(_ entry: QueueEntry) throws -> Data {
        do {
            return try QueueEntry.makeEncoder().encode(entry)
        } catch {
            throw OfflineQueueError.unstorable(reason: "encoding failed")
        }
    }

    private func fileURL(_ id: UUID) -> URL { directory.appendingPathComponent("\(id.uuidString).json") }
    private func tempURL(_ id: UUID) -> URL { directory.appendingPathComponent(".\(id.uuidString).json.tmp") }

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

    /// Reads and decodes every file, spread over the available cores.
    private static func decodeAll(_ names: [String], in directory: URL) -> [FileResult] {
        guard !names.isEmpty else { return [] }
        let chunkCount = min(names.count, max(1, ProcessInfo.processInfo.activeProcessorCount) * 4)
        let chunkSize = (names.count + chunkCount - 1) / chunkCount
        let results = UnsafeMutableBufferPointer<FileResult>.allocate(capacity: names.count)
        results.initialize(repeating: .corrupt("unread"))
        defer { results.deallocate() }
        let base = UncheckedSendable(results)
        let directoryPath = directory.path
        DispatchQueue.concurrentPerform(iterations: chunkCount) { chunk in
            let decoder = QueueEntry.makeDecoder()
            let start = chunk * chunkSize
            let end = min(names.count, start + chunkSize)
            guard start < end else { return }
            for position in start..<end {
                // Each position is written by exactly one iteration.
                base.value[position] = decodeFile(names[position], directoryPath: directoryPath, decoder: decoder)
            }
        }
        return Array(results)
    }

    private static func decodeFile(_ name: String, directoryPath: String, decoder: JSONDecoder) -> FileResult {
        let data: Data
        do {
            data = try DurableFiles.readFile(directoryPath + "/" + name)
        } catch {
            return .corrupt("unreadable: \(error)")
        }
        guard let entry = try? decoder.decode(QueueEntry.self, from: data) else {
            return .corrupt("not a valid queue entry (\(data.count) bytes)")
        }
        guard name == "\(entry.id.uuidString).json" else { return .corrupt("file name does not match entry id") }
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
