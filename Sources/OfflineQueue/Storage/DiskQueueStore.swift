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

/// The offline queue's storage: one JSON file per entry, written durably, indexed in memory.
///
/// **Layout** of the folder given to `init(directory:)`:
/// ```
/// <directory>/
///   <UUID>.json            one live entry per file (mode 0600)
///   .<UUID>.json.tmp       a write in progress (dot-prefixed; removed at open if a crash left it)
///   .sending               the entry a replay sends now, when a layer above observes the sends
///   quarantine/            files that could not be read or decoded, moved aside at open
///   dead-letter/           entries that used up `maxAttempts`
/// ```
///
/// **One owner**: the store holds an exclusive `flock` on the folder for its lifetime (released
/// when it is deinitialised or its process ends, even by SIGKILL). A second store on the same
/// folder, in this process or another, gets `OfflineQueueError.folderInUse` — or, opened with
/// `open(directory:lockTimeout:clock:)`, waits for the owner to go.
///
/// **Durability**: `save`/insert returns only after the entry's bytes were written to a temp
/// file, the file was fsynced, renamed to `<id>.json`, and the directory was fsynced — so an
/// acknowledged entry survives a crash or power loss. Concurrent inserts share directory fsyncs
/// (group commit). Deletions and attempt updates are not directory-fsynced: after a crash a
/// delivered entry may come back and be replayed once more, with the same `Idempotency-Key`
/// (at-least-once), and an attempt counter may read one lower.
///
/// **Open**: the folder is listed once and each file decoded once (in parallel); replay order and
/// counts come from the in-memory index afterwards. Only regular files are read (never through a
/// link, never blocking on a FIFO), at most `maximumEntrySize` bytes each. A file that is not a
/// regular file, is too large, is not valid JSON, has an unknown method or format version, a
/// counter out of range, or whose name does not match its id is moved to `quarantine/` and listed
/// in `openReport` — never counted, never fatal. A file that cannot be *read* (too many open
/// files, an I/O error, no permission) is not judged: the open throws
/// `OfflineQueueError.storage` and moves nothing.
///
/// **Errors**: a full disk, an unwritable folder or any failed file call is thrown as
/// `OfflineQueueError.storage(operation:path:errno:)`; the entry is then not stored and no partial
/// file is left.
public final class DiskQueueStore: Sendable {
    /// The largest entry file the store writes or reads (64 MiB). A larger request is refused at
    /// enqueue with `OfflineQueueError.unstorable`; a larger file found at open is quarantined.
    public static let maximumEntrySize = 64 * 1024 * 1024

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
    /// The entries that may have been in the server's state when the process that used the folder
    /// before ended — the one a replay was sending, and those sent before without an answer that
    /// says no — as its note says (`noteSending`), those still queued.
    package let sendingAtOpen: Set<UUID>

    // A lock rather than an actor: the replay loop reads and updates the index several times per
    // entry, and an actor hop for each of those cost more than the file operations themselves.
    // Only in-memory bookkeeping happens under the lock; fsyncs run on `BlockingIOPool`.
    private struct State: Sendable {
        var index: QueueIndex
        var nextSequence: UInt64
        /// Inserts in progress that will take a place of their own (by the entry's id): counted
        /// against the limit until the entry is in the index (or the insert failed).
        var reservedSlots: Set<UUID> = []
        /// Writes of entries' files in flight against the entries' removal (the lifecycle's store
        /// side: a removal wins over a write that began before it).
        var writes = QueueEntryLifecycle.FileWrites()
        /// Makes every temp file name unique, so two writes of one id never collide.
        var writeCounter: UInt64 = 0
    }

    private let state: Locked<State>
    /// Every change to the entries, published under the state lock in the step that makes it.
    public let changeFeed: QueueChangeFeed
    private let directoryPath: String
    private let syncer: DirectorySyncer
    private let pool: BlockingIOPool
    /// Deletes finished entries' files off the caller's thread (see `DeferredRemovals`).
    private let removals: DeferredRemovals
    /// One write of an id's file at a time, its clean-up included (see `write`).
    private let turns = WriteTurns()
    /// Deletions from the folder so far (`made`), and how many of them a directory fsync is known
    /// to have made durable (`durable`): see `makeDeletionsDurable()`.
    private let deletions = Locked(DeletionCount())
    /// The descriptor holding the folder's `flock`; nil once released.
    private let lock: Locked<Int32?>
    /// Admits each operation on the folder's files until `close()`, which waits for them.
    private let gate = ClosingGate()
    /// Entries claimed through `QueueStorage` (by id: the claim's token), and coalescing holders
    /// being replaced by an `add` (`nil` token): neither is offered by `claim`. In memory only: one
    /// engine uses a folder, and a crash drops its claims with it (see DiskQueueStore+QueueStorage.swift).
    let claims = Locked(DiskClaims())
    /// The notes of entries on the wire asked for (numbered in order) and the newest written.
    private let sendingNotes = Locked<(asked: UInt64, written: UInt64)>((0, 0))

    /// Opens (creating if needed, mode 0700) the queue folder, takes its lock, and loads every
    /// entry in it.
    ///
    /// - Parameter directory: the folder; by default `Application Support/Resilience/OfflineQueue`
    ///   (on Linux `~/.local/share/Resilience/OfflineQueue`).
    /// Opening reads the whole folder and may wait briefly for the lock, blocking the calling
    /// thread: from async code with a large folder, prefer `open(directory:lockTimeout:clock:)`
    /// (which waits for the lock without blocking) or open the store before the app gets busy.
    ///
    /// - Throws: `OfflineQueueError.folderInUse` when another store (in this process or another)
    ///   owns the folder (after at most 200 ms: a process being spawned holds copies of the
    ///   owner's descriptors for a moment) — `open(directory:lockTimeout:clock:)` waits instead;
    ///   `OfflineQueueError.storage` when the folder cannot be created, locked, listed or read
    ///   (nothing is moved or removed then).
    public convenience init(directory: URL? = nil) throws {
        try self.init(directory: directory, pool: .shared)
    }

    /// `init(directory:)` with its own I/O threads (tests hold them to order a write against a
    /// removal): `pool` for writes, `removalPool` for the deferred deletions of finished entries.
    convenience init(directory: URL?, pool: BlockingIOPool, removalPool: BlockingIOPool = .background) throws {
        let directory = try directory ?? Self.defaultDirectory()
        try Self.makeDirectories(directory)
        try self.init(directory: directory, lockedWith: try DurableFiles.lockDirectory(directory.path), pool: pool, removalPool: removalPool)
    }

    /// Like `init(directory:)`, but while another store owns the folder it waits — polling every
    /// 10 ms on `clock`, without blocking a thread — for up to `lockTimeout`, then throws
    /// `OfflineQueueError.folderInUse`. Use it where two processes share one folder (an app and
    /// its extension): the second waits for the first to let go. Throws `CancellationError` if
    /// the calling task is cancelled while it waits.
    public static func open(
        directory: URL? = nil,
        lockTimeout: Duration,
        clock: some Clock<Duration> = ContinuousClock()
    ) async throws -> DiskQueueStore {
        let directory = try directory ?? defaultDirectory()
        try makeDirectories(directory)
        let deadline = clock.now.advanced(by: max(.zero, lockTimeout))
        while true {
            do {
                return try DiskQueueStore(directory: directory, lockedWith: try DurableFiles.lockDirectory(directory.path, patience: .zero))
            } catch OfflineQueueError.folderInUse(let path) {
                let remaining = clock.now.duration(to: deadline)
                guard remaining > .zero else { throw OfflineQueueError.folderInUse(path: path) }
                try await clock.sleep(for: min(.milliseconds(10), remaining))
            }
        }
    }

    /// Loads the folder whose lock `lockDescriptor` holds (and keeps it; closed on failure).
    private init(directory: URL, lockedWith lockDescriptor: Int32, pool: BlockingIOPool = .shared, removalPool: BlockingIOPool = .background) throws {
        self.directory = directory
        directoryPath = directory.path
        quarantineDirectory = directory.appendingPathComponent("quarantine", isDirectory: true)
        deadLetterDirectory = directory.appendingPathComponent("dead-letter", isDirectory: true)
        self.pool = pool
        removals = DeferredRemovals(pool: removalPool)
        syncer = DirectorySyncer(path: directory.path)
        lock = Locked(lockDescriptor)
        let loaded: Loaded
        do {
            try Self.makeSubdirectory(quarantineDirectory.path)
            try Self.makeSubdirectory(deadLetterDirectory.path)
            loaded = try Self.load(directory: directory, quarantine: quarantineDirectory)
        } catch {
            FileSystem.closeDescriptor(lockDescriptor)
            throw error
        }
        let index = QueueIndex(loading: loaded.entries)
        let counters = max(index.maxSequence, UInt64(clamping: loaded.entries.map(\.revision).max() ?? 0))
        state = Locked(State(index: index, nextSequence: counters + 1))
        openReport = OpenReport(
            loaded: index.count,
            quarantined: loaded.quarantined,
            removedTemporaryFiles: loaded.removedTemporaryFiles,
            removedSupersededEntries: loaded.removedSuperseded
        )
        let sendingAtOpen = Self.readSendingNote(directory.path).filter { index[$0] != nil }
        self.sendingAtOpen = sendingAtOpen
        changeFeed = QueueChangeFeed(entries: index.ordered(), sendingAtOpen: sendingAtOpen)
        for path in loaded.supersededFiles {
            removals.deleteNow(path)
            noteDeletion()
        }
    }

    /// The name of the note of the entry on the wire (dot-prefixed: never read as an entry).
    static let sendingNoteName = ".sending"

    /// Notes, on the I/O pool, which entries may be in the server's state — the one a replay is
    /// about to send and those sent before without an answer that says no — for the next launch
    /// should this process die now (`sendingAtOpen`): one id per line, in a file written and
    /// renamed into place, not fsynced (a kill keeps it, a power loss may not). Only an engine
    /// whose sends a layer above observes (OfflineFirst) notes them. A failure to write it is
    /// ignored: the next launch then knows less (an entry with a counted attempt is known anyway).
    ///
    /// Notes may be asked for concurrently (a queue with `maxConcurrentDeliveries` > 1): each is
    /// numbered on the caller's executor (the engine's actor), in the order asked, and they are
    /// written one at a time, a note older than the one already written dropped, so the newest set
    /// stands.
    nonisolated(nonsending) package func noteSending(_ ids: Set<UUID>) async {
        guard gate.enter() else { return }
        defer { gate.leave() }
        let path = directoryPath + "/" + Self.sendingNoteName
        let text = ids.map(\.uuidString).sorted().joined(separator: "\n")
        let notes = sendingNotes
        let number = notes.withLock { notes -> UInt64 in
            notes.asked += 1
            return notes.asked
        }
        try? await pool.run {
            // Held while writing, on a pool thread: the note's temporary file is one name.
            try notes.withLock { notes in
                guard notes.written < number else { return }
                try FileSystem.writeFile(Data(text.utf8), to: path, via: path + ".tmp", sync: false)
                notes.written = number
            }
        }
    }

    private static func readSendingNote(_ directory: String) -> Set<UUID> {
        guard let folder = try? FileSystem.openDirectory(directory) else { return [] }
        defer { FileSystem.closeDescriptor(folder) }
        var buffer: [UInt8] = []
        var info = stat()
        let limit = 64 * 1024
        guard case .bytes(let count) = FileSystem.readRegularFile(named: sendingNoteName, in: folder, maximumSize: limit, into: &buffer, info: &info) else { return [] }
        return Set(String(decoding: buffer[0..<count], as: UTF8.self).split(separator: "\n").compactMap { UUID(uuidString: String($0)) })
    }

    deinit {
        releaseLock()
    }

    /// Lets go of the folder, so that another store (another user's, after a switch) can open it
    /// at once: writes and deletions in progress finish first, then the lock is released. From the
    /// call on, the store writes and deletes nothing: an insert, update or removal throws
    /// `OfflineQueueError.closed` (a discard is dropped: its entry stays queued on disk, for the
    /// next owner). Its entries in memory stay readable. Stop the queue that uses the store first
    /// (`OfflineQueueEngine.close()` does both). Closing twice is closing once. Returns when the
    /// folder is free, whether or not the calling task is cancelled.
    nonisolated(nonsending) public func close() async {
        await gate.close()
        releaseLock()
    }

    /// Whether `close()` was called.
    public var isClosed: Bool { gate.isClosed }

    /// Gives up the folder's lock (another store may then open it) — what the end of the process
    /// does. For tests that simulate a crash and a restart in one process; the store must not be
    /// used afterwards.
    func releaseLock() {
        removals.finish()  // whoever opens the folder next must not find a finished entry
        if let descriptor = lock.withLock({ lock -> Int32? in
            defer { lock = nil }; return lock
        }) {
            FileSystem.closeDescriptor(descriptor)
        }
    }

    // MARK: - Reading (from the index, never from the folder)

    /// The entries that have not expired by the system clock, in replay order.
    ///
    /// The compatibility spelling (SwiftResilience's `load()`, and what it returned): the
    /// canonical reading is `orderedEntries()`, which does not suspend and lists expired entries
    /// too. Expired entries stay in the store (and in `entryCount`) until a pass or
    /// `deleteExpired()` sweeps them.
    public func load() async -> [QueueEntry] {
        let now = Date()
        return orderedEntries().filter { !$0.isExpired(at: now) }
    }

    /// The number of entries (expired ones included until they are swept). The compatibility
    /// spelling (SwiftResilience) of the canonical `entryCount`.
    public func count() async -> Int { entryCount }

    /// Every entry, expired or not, in replay order (priority descending, then FIFO), without
    /// suspending: the order a pass replays in. Canonical; `load()` is the compatibility spelling
    /// that leaves out expired entries.
    public func orderedEntries() -> [QueueEntry] { state.withLock { $0.index.ordered() } }

    /// The number of entries, without suspending. Canonical; `count()` is the compatibility spelling.
    public var entryCount: Int { state.withLock { $0.index.count } }

    /// A new stream for each access: the number of entries at once, then every change (a slow
    /// consumer sees the latest count, never a stale one last). For a "N pending" indicator.
    public var entryCounts: AsyncStream<Int> { changeFeed.counts }

    /// `entryCounts` with another buffering (tests keep every value).
    func entryCounts(bufferingPolicy: AsyncStream<Int>.Continuation.BufferingPolicy) -> AsyncStream<Int> {
        changeFeed.counts(bufferingPolicy: bufferingPolicy)
    }

    /// A new stream for each access: every change to the entries from now on (stored, updated,
    /// sent, removed and why), in the order they happened (`changeFeed.changes`). Nothing is
    /// dropped: read it promptly. `orderedEntries()` gives the state the changes start from.
    public var changes: AsyncStream<QueueChange> { changeFeed.changes }

    /// Publishes a change, under the state lock: the feed and the index never disagree.
    private func publish(_ change: QueueChange, _ state: inout State) {
        changeFeed.publish(change)
    }

    /// Marks claimed (in `claims`) and returns up to `limit` entries that may be sent at `now`:
    /// unclaimed, due, alive, and the head of their keys, in replay order.
    func markClaims(upTo limit: Int, now: Date) -> [QueueClaim] {
        state.withLock { state in
            claims.withLock { claims in
                var claimed: [QueueClaim] = []
                state.index.forEachInOrder { entry, isHead in
                    guard claims.isFree(entry.id), !entry.isExpired(at: now) else { return true }
                    if let next = entry.nextAttemptAt, next > now { return true }
                    guard isHead else { return true }
                    claimed.append(QueueClaim(entry: entry, token: claims.claim(entry.id), leaseEnds: nil))
                    return claimed.count < limit
                }
                return claimed
            }
        }
    }

    /// The entry with this id, if queued.
    public func entry(id: UUID) -> QueueEntry? { state.withLock { $0.index[id] } }

    /// Whether any entry carries `orderingKey`.
    func hasEntries(orderingKey: String) -> Bool { state.withLock { $0.index.contains(orderingKey: orderingKey) } }

    /// The entry holding `coalescingKey`, if any.
    func entry(coalescingKey: String) -> QueueEntry? { state.withLock { $0.index.entry(coalescingKey: coalescingKey) } }

    /// Entries moved to `dead-letter/`, read from that folder (oldest first). Files that are not
    /// regular files or not valid entries are skipped.
    public func deadLetters() -> [QueueEntry] {
        let names = ((try? DurableFiles.listDirectory(deadLetterDirectory.path)) ?? []).filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }
        guard !names.isEmpty, let folder = try? DurableFiles.openDirectory(deadLetterDirectory.path) else { return [] }
        defer { FileSystem.closeDescriptor(folder) }
        let decoder = QueueEntry.makeDecoder()
        var buffer: [UInt8] = []
        return names.compactMap { name -> QueueEntry? in
            guard case .entry(let entry) = Self.decodeFile(name, directory: folder, buffer: &buffer, decoder: decoder) else { return nil }
            return entry
        }
        .sorted { $0.sequence < $1.sequence }
    }

    // MARK: - Writing

    /// Stores `entry` durably, adding it or replacing the entry with the same id (SwiftResilience's
    /// `save`). Returns once the file is durable, like an enqueue.
    ///
    /// Its place in line: an entry made with `QueueEntry(_:id:enqueuedAt:)` goes to the back of
    /// its priority's line if its id is new — FIFO is save order, not `enqueuedAt` order — and
    /// keeps its place if its id is already queued, in the line of its new priority if that
    /// changed. An entry read from a store (`load()`, `items`) keeps the place it had. No
    /// `maxQueueSize` applies here. `Authorization`, `Proxy-Authorization`, `Cookie` and
    /// `Idempotency-Key` headers are never written, however the entry was made.
    ///
    /// An entry with a `coalescingKey` is a new edit of that key: it replaces the entry holding the
    /// key (if that is another id) once it is durable, and it is numbered from the store's counter,
    /// so that after a crash the open keeps it rather than an older edit.
    ///
    /// The public spelling (SwiftResilience's); the queue itself calls the internal
    /// `insert(_:limit:replacing:)`, which adds the queue's size limit and the coalescing
    /// replacement it decided.
    ///
    /// - Throws: `OfflineQueueError.storage` (a full disk, an unwritable folder),
    ///   `.unstorable` (an entry too large to store, or whose `sequence` is out of range).
    public func save(_ entry: QueueEntry) async throws {
        var entry = try placed(entry.withStorableHeaders())
        var replacing: UUID?
        if let key = entry.coalescingKey {
            entry = entry.revised(Int(makeSequence()))
            if let holder = self.entry(coalescingKey: key), holder.id != entry.id { replacing = holder.id }
        }
        try await insert(entry, limit: nil, replacing: replacing)
    }

    /// `entry` with its place in line (see `save(_:)`); keeps the store's counter above every
    /// sequence it holds, so a number it hands out later is never one already in use.
    private func placed(_ entry: QueueEntry) throws -> QueueEntry {
        guard entry.sequence <= QueueEntry.maximumCounter else {
            throw OfflineQueueError.unstorable(reason: "sequence \(entry.sequence) exceeds \(QueueEntry.maximumCounter)")
        }
        return state.withLock { state in
            guard entry.sequence == QueueEntry.unplacedSequence else {
                state.nextSequence = max(state.nextSequence, entry.sequence + 1)
                return entry
            }
            if let queued = state.index[entry.id] { return entry.placed(at: queued.sequence) }
            defer { state.nextSequence += 1 }
            return entry.placed(at: state.nextSequence)
        }
    }

    /// Removes an entry (a no-op if it is not there, or if its file cannot be deleted: it then
    /// stays queued). The public spelling (SwiftResilience's); the queue itself calls the
    /// internal, throwing `remove(id:)`, which reports a file that could not be deleted.
    public func delete(id: UUID) async {
        try? remove(id: id)
    }

    /// Removes every entry that has expired at `now`; returns how many.
    @discardableResult
    public func deleteExpired(now: Date = Date()) async -> Int {
        let expired = orderedEntries().filter { $0.isExpired(at: now) }
        for entry in expired { discard(id: entry.id, reason: .expired) }
        finishRemovals()
        return expired.count
    }

    /// A fresh number from the store's counter: increasing, never reused within the folder. New
    /// entries take one as their `sequence`; coalescing replacements as their `revision`, so the
    /// newest write of a key always has the highest revision.
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
        let data = try encode(entry)
        let (needsSlot, wasQueued) = try state.withLock { state -> (Bool, Bool) in
            let wasQueued = state.index[entry.id] != nil
            let needsSlot = old.flatMap { state.index[$0] } == nil && !wasQueued
            if needsSlot, let limit, state.index.count + state.reservedSlots.count >= limit { throw OfflineQueueError.full }
            if needsSlot { state.reservedSlots.insert(entry.id) }
            return (needsSlot, wasQueued)
        }
        defer { if needsSlot { state.withLock { _ = $0.reservedSlots.remove(entry.id) } } }

        let path = filePath(entry.id)
        let syncer = self.syncer
        let stands = try await write(
            data, for: entry.id,
            andThen: { [self] in
                do {
                    try syncer.sync()
                } catch {
                    // Not known to be durable: not reported as queued, and a new entry's file goes
                    // again. An entry already queued under this id keeps its file: the rename
                    // replaced its older state, either state is the entry, and deleting the file
                    // would lose a queued entry at the next open (found by the simulation's disk
                    // faults).
                    if !wasQueued { deleteLeftover(path) }
                    throw error
                }
            },
            commit: { [self] state in
                // In the step that checks no removal overtook the write: a removal after it finds
                // the entry (and deletes the file just written), never a file without its entry.
                // The replacement and its predecessor's departure are one change: the count never
                // blips. The predecessor's deletion is registered and counted before any pass can
                // see the new edit, so the pass makes it durable first (`makeDeletionsDurable`).
                state.index.upsert(entry)
                state.reservedSlots.remove(entry.id)  // counted in the index from now on
                let replaced = old.flatMap { $0 == entry.id ? nil : Self.forget($0, in: &state) } != nil
                if replaced, let old {
                    removals.register(filePath(old))
                    noteDeletion()
                }
                publish(.stored(entry, replacing: replaced ? old : nil), &state)
            })
        guard stands else { return }  // removed while it was written (a `save` raced a `delete`)
        if let old, old != entry.id { removals.removeNow(filePath(old)) }  // a failure is tried again before the edit is sent
    }

    /// Replaces a live entry's file (attempts, next attempt). A no-op for an entry no longer
    /// queued. The in-memory entry is updated even when the write fails (a full disk), so this
    /// process still honours the new attempt count and backoff; the error is then thrown, and the
    /// file keeps its older state until a later write succeeds.
    func update(_ entry: QueueEntry) async throws {
        let apply = { [self] in
            state.withLock { state in
                guard state.index[entry.id] != nil else { return }
                state.index.upsert(entry)
                publish(.updated(entry), &state)
            }
        }
        do {
            let data = try encode(entry)
            // Checked and registered in one step: a removal can no longer slip in before the write
            // is known, and a write of an entry removed meanwhile is deleted again.
            guard try await write(data, for: entry.id, onlyIfQueued: true) else { return }
        } catch {
            apply()
            throw error
        }
        apply()
    }

    /// Removes an entry: deletes its file, then forgets it. When the file cannot be deleted (a
    /// read-only folder) the entry stays queued, in memory as on disk, and the error is thrown.
    /// `unlink` is a metadata operation that does not wait for the disk (no fsync: see the
    /// durability notes), so it runs inline — and synchronously: an `async` function here would
    /// make the queue's actor hop off and back for every delivered entry.
    func remove(id: UUID) throws {
        guard gate.enter() else { throw OfflineQueueError.closed }
        defer { gate.leave() }
        guard let removed = forget(id, reason: .cancelled) else { return }
        do {
            try removals.runNow(filePath(id))
            noteDeletion()
        } catch {
            state.withLock { state in
                state.writes.removalUndone(id)  // not removed after all: a write in flight stands
                if state.index[id] == nil {
                    state.index.upsert(removed)
                    publish(.stored(removed, replacing: nil), &state)
                }
            }
            throw error
        }
    }

    /// Forgets an entry whose work is done (delivered, failed for good, expired, superseded) and
    /// queues its file's deletion on a pool thread (`DeferredRemovals`: the replay pass goes on to
    /// its next entry meanwhile). A file that cannot be deleted, or whose deletion a crash
    /// overtakes, is left for the next open, which may replay it once more with the same
    /// `Idempotency-Key` (at-least-once).
    func discard(id: UUID, reason: QueueRemovalReason) {
        guard gate.enter() else { return }
        defer { gate.leave() }
        let path = filePath(id)
        guard forget(id, reason: reason, path: path) != nil else { return }
        noteDeletion()
        removals.remove(path)
    }

    /// `discard`, returning once the file is deleted (on the I/O pool, not in a batch).
    func discardPromptly(id: UUID, reason: QueueRemovalReason) async {
        guard gate.enter() else { return }
        defer { gate.leave() }
        guard forget(id, reason: reason) != nil else { return }
        noteDeletion()
        let (removals, path) = (self.removals, filePath(id))
        try? await pool.run { removals.removeNow(path) }
    }

    /// Runs the deletions queued so far on the I/O pool and returns once they are done (not
    /// fsynced: see `makeDeletionsDurable()`).
    func settleRemovals() async {
        guard gate.enter() else { return }
        defer { gate.leave() }
        let removals = self.removals
        try? await pool.run { _ = removals.finish() }
    }

    /// Makes every deletion from the folder so far durable — the queued ones are run, then the
    /// directory is fsynced — unless a fsync already did. The queue calls it before it sends an
    /// edit of a coalescing key: deletions are not fsynced as they happen (an unlink does not wait
    /// for the disk), and a crash may undo any of them, so without this an older edit's file
    /// could come back alone after this edit was delivered and deleted, and the older edit be sent
    /// last (found by Models/QueueCoalescing.pml). Costs one directory fsync when anything was
    /// deleted since the last one, nothing otherwise.
    ///
    /// A deletion that failed (a full or read-only disk) is tried again here; while one still
    /// fails this throws its error, and the edit must wait: the file it could not delete may be
    /// an older edit of the same key, which the next open would otherwise send after this one.
    func makeDeletionsDurable() async throws {
        let made = deletions.withLock { $0.made > $0.durable ? $0.made : nil }
        guard let made else { return }
        let removals = self.removals
        let syncer = self.syncer
        try await pool.run {
            if let failure = removals.finish() { throw failure }
            try syncer.sync()
        }
        deletions.withLock { $0.durable = max($0.durable, made) }
    }

    /// Directory fsyncs of the queue's folder so far (for tests).
    var directorySyncs: Int { syncer.completedRounds }

    private func noteDeletion() {
        deletions.withLock { $0.made &+= 1 }
    }

    /// When the earliest backoff that holds a send back ends, for the queue's timer: each entry's
    /// own `nextAttemptAt`, except that an entry behind the first of its ordering key does not
    /// count, since it waits for that one whatever its own date says. Counted, it fired the timer
    /// into a pass that could send nothing, again and again while the clock stood still, until
    /// the first entry's backoff ended (the simulation found it: a later entry of a key, attempted
    /// before an earlier one was stored, with a backoff ending before the earlier one's).
    ///
    /// With `coalescingFollowers: false` (the `QueueStorage` conformance, whose `claim` offers
    /// only the first entry of each coalescing key too), an entry behind an earlier one of its
    /// coalescing key does not count either.
    func earliestBackoffEnd(coalescingFollowers: Bool = true) -> Date? {
        // A claimed entry (being sent, or its conflict resolved in a task of its own) is not
        // waiting for a time: whoever holds it settles it, and a date it still carries from an
        // earlier backoff would arm a timer for a pass that finds nothing to claim, again and again.
        let claimed = claims.withLock { $0.busyIDs }
        return state.withLock { state in
            var heads: [String: QueueEntry] = [:]
            var earliest: Date?
            var coalescingHeads: [String: UInt64] = [:]
            if !coalescingFollowers {
                for entry in state.index.ordered() {
                    if let key = entry.coalescingKey { coalescingHeads[key] = min(coalescingHeads[key] ?? .max, entry.sequence) }
                }
            }
            for entry in state.index.ordered() {
                if let key = entry.coalescingKey, let head = coalescingHeads[key], head != entry.sequence { continue }
                if let key = entry.orderingKey {
                    if let head = heads[key], head.sequence <= entry.sequence { continue }
                    heads[key] = entry
                } else if let next = entry.nextAttemptAt, !claimed.contains(entry.id) {
                    earliest = min(earliest ?? next, next)
                }
            }
            // A head's expiry ends its wait too: the pass then sweeps it and its key moves on.
            for head in heads.values where !claimed.contains(head.id) {
                guard let next = head.nextAttemptAt.map({ min($0, head.expiresAt) }) else { continue }
                earliest = min(earliest ?? next, next)
            }
            return earliest
        }
    }

    /// From now until `stopBatchingRemovals()` (a replay pass), `discard`'s deletions go to the
    /// pool thread a batch at a time (`DeferredRemovals.batchSize`) instead of one by one.
    func startBatchingRemovals() {
        removals.startBatching()
    }

    /// Ends a `startBatchingRemovals()`: deletions still queued start at once.
    func stopBatchingRemovals() {
        removals.stopBatching()
    }

    /// Runs the file deletions `discard` queued and waits for any in progress: afterwards no
    /// discarded entry's file is left in the folder (but one that could not be deleted).
    func finishRemovals() {
        removals.finish()
    }

    /// File deletions queued by `discard` and not yet done (for tests).
    var outstandingRemovals: Int { removals.outstanding }

    /// Takes an entry out of the index, registers its file's deletion (in the same step, so no
    /// later write of the id can begin before the deletion is known: `DeferredRemovals`), and says
    /// why on `changes`; a write of it still in flight deletes the file it wrote.
    private func forget(_ id: UUID, reason: QueueRemovalReason, path: String? = nil) -> QueueEntry? {
        state.withLock { state -> QueueEntry? in
            let removed = Self.forget(id, in: &state)
            if let removed {
                removals.register(path ?? filePath(id))
                publish(.removed(removed, reason: reason), &state)
            }
            return removed
        }
    }

    private static func forget(_ id: UUID, in state: inout State) -> QueueEntry? {
        guard let removed = state.index.remove(id) else { return nil }
        state.writes.removed(id)
        return removed
    }

    /// Removes every entry (stopping at the first file that cannot be deleted).
    nonisolated(nonsending) public func removeAll() async throws {
        let ids = state.withLock { Array($0.index.entries.keys) }
        for id in ids {
            try remove(id: id)
            claims.withLock { $0.end(id) }
        }
    }

    /// Moves an entry to `dead-letter/`, with its final attempt count and error. Returns false,
    /// leaving no dead letter, when the entry was removed (cancelled) before or while it moved.
    @discardableResult
    func moveToDeadLetter(_ entry: QueueEntry) async throws -> Bool {
        guard gate.enter() else { throw OfflineQueueError.closed }
        defer { gate.leave() }
        guard self.entry(id: entry.id) != nil else { return false }
        let data = try encode(entry)
        let target = deadLetterDirectory.path + "/\(entry.id.uuidString).json"
        let temp = deadLetterDirectory.path + "/.\(entry.id.uuidString).json.tmp"
        let deadLetterPath = deadLetterDirectory.path
        try await pool.run {
            try DurableFiles.writeFile(data, to: target, via: temp)
            try DurableFiles.syncDirectory(deadLetterPath)
        }
        guard forget(entry.id, reason: .deadLettered(attempts: entry.attempts)) != nil else {
            try? DurableFiles.removeFile(target)  // cancelled meanwhile: it was not given up on
            return false
        }
        removals.removeNow(filePath(entry.id))  // registered by `forget`; tried again if it fails
        noteDeletion()
        return true
    }

    /// Deletes the file of a write that did not stand (a refused insert, a write a removal
    /// overtook), from within that write's turn. A deletion that fails is kept and tried again, and
    /// counted like any other: until it succeeds no edit of a coalescing key is sent
    /// (`makeDeletionsDurable` throws), since the file left behind may be an older edit the next
    /// open would send after it. (Dropped, such a failure let a refused edit's file come back and
    /// overwrite the newer one delivered meanwhile: simulation, queue seed 725.)
    private func deleteLeftover(_ path: String) {
        removals.deleteNow(path)
        noteDeletion()
    }

    // MARK: - Internals

    /// Writes the entry's file (temp, fsync, rename) on the I/O pool, then runs `andThen` on the same
    /// pool thread (the directory fsync for inserts). With `onlyIfQueued`, writes nothing (returns
    /// false) for an entry not in the index. Returns false too when the entry was removed while the
    /// write was in flight: that removal wins, and the file just written is deleted again. A write
    /// that stands runs `commit` under the store's lock in the step that decides it stands.
    ///
    /// The writes of one id take turns (`WriteTurns`), each with its clean-up: the deletion
    /// registered for the id's earlier file runs first (`settle`), and the file of a write whose
    /// entry was removed meanwhile is deleted before the next write of that id begins. So no
    /// deletion ever removes a file written after it was decided, and two writes of one id never
    /// rename over each other out of order.
    private func write(
        _ data: Data,
        for id: UUID,
        onlyIfQueued: Bool = false,
        andThen: @escaping @Sendable () throws -> Void = {},
        commit: @escaping @Sendable (inout State) -> Void = { _ in }
    ) async throws -> Bool {
        guard gate.enter() else { throw OfflineQueueError.closed }
        defer { gate.leave() }
        let started = state.withLock { state -> (ticket: QueueEntryLifecycle.FileWrites.Ticket, counter: UInt64, turn: UInt64)? in
            if onlyIfQueued, state.index[id] == nil { return nil }
            state.writeCounter += 1
            return (state.writes.writeStarted(id), state.writeCounter, turns.issue(id))
        }
        guard let started else { return false }
        let path = filePath(id)
        let temp = directoryPath + "/.\(id.uuidString).\(started.counter).json.tmp"
        return try await pool.run { [self] in
            turns.take(id, started.turn)
            defer { turns.give(id) }
            removals.settle(path)  // a deletion registered for this id's earlier file goes first
            var failure: (any Error)?
            do {
                try DurableFiles.writeFile(data, to: path, via: temp)
                try andThen()
            } catch {
                failure = error
            }
            let removedMeanwhile = state.withLock { state -> Bool in
                let removed = state.writes.writeEnded(id, started.ticket)
                if failure == nil, !removed { commit(&state) }
                return removed
            }
            if let failure { throw failure }
            if removedMeanwhile {
                deleteLeftover(path)
                return false
            }
            return true
        }
    }

    private func encode(_ entry: QueueEntry) throws -> Data {
        let data: Data
        do {
            data = try QueueEntry.makeEncoder().encode(entry)
        } catch {
            throw OfflineQueueError.unstorable(reason: "encoding failed")
        }
        guard data.count <= Self.maximumEntrySize else {
            throw OfflineQueueError.unstorable(reason: "entry of \(data.count) bytes exceeds the \(Self.maximumEntrySize)-byte limit")
        }
        return data
    }

    // Paths are built as strings: `URL.appendingPathComponent` without a directory hint stats the
    // file system to decide on a trailing slash — two failed `stat` calls per enqueue.
    private func filePath(_ id: UUID) -> String { directoryPath + "/" + EntryFileName.of(id) }

    private static func defaultDirectory() throws -> URL {
        guard let base = FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first else {
            throw OfflineQueueError.storage(operation: "locate Application Support", path: "~", errno: ENOENT)
        }
        return base.appendingPathComponent("Resilience", isDirectory: true)
            .appendingPathComponent("OfflineQueue", isDirectory: true)
    }

    private static func makeDirectories(_ directory: URL) throws {
        do {
            try FileSystem.makeDirectoryTree(directory.path)
        } catch {
            throw OfflineQueueError.storage(operation: error.operation, path: error.path, errno: error.errno)
        }
        try DurableFiles.makeDirectory(directory.path)
    }

    /// Creates `quarantine/` or `dead-letter/`. Something else under that name (a stray file, a
    /// link) is moved aside to `.<name>.displaced-<UUID>` first, so it can never make the queue
    /// unopenable; nothing is deleted.
    private static func makeSubdirectory(_ path: String) throws {
        if FileSystem.isNonDirectory(path) {
            let url = URL(fileURLWithPath: path)
            let aside = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).displaced-\(UUID().uuidString)").path
            try DurableFiles.moveFile(path, to: aside)
        }
        try DurableFiles.makeDirectory(path)
    }
}

/// The writes of each id, in the order they began: a write waits (on its pool thread) until every
/// write of its id that began before it, clean-up included, is done. In that order, because a
/// write that began before a removal must not run after a write that began after it (it would
/// write its older state over the newer one's file, or delete that file as its own leftover).
/// Contention is rare (an attempt update against an app's `save` of the same id, say) and short:
/// the write ahead is always running or about to.
private final class WriteTurns: Sendable {
    private struct Line {
        var issued: UInt64 = 0
        var served: UInt64 = 0
    }

    private let condition = NSCondition()
    private let lines = Locked([UUID: Line]())

    /// A write of `id` begins (under the store's lock, in the step that registers the write):
    /// its place in `id`'s line.
    func issue(_ id: UUID) -> UInt64 {
        lines.withLock { lines in
            defer { lines[id, default: Line()].issued += 1 }
            return lines[id, default: Line()].issued
        }
    }

    /// Waits until the writes of `id` before `turn` are done.
    func take(_ id: UUID, _ turn: UInt64) {
        condition.lock()
        while lines.withLock({ $0[id]?.served ?? 0 }) != turn { condition.wait() }
        condition.unlock()
    }

    /// The write whose turn it was is done.
    func give(_ id: UUID) {
        condition.lock()
        lines.withLock { lines in
            lines[id]?.served += 1
            if let line = lines[id], line.served == line.issued { lines[id] = nil }
        }
        condition.broadcast()
        condition.unlock()
    }
}

/// Deletions from a store's folder: made, and known to be durable (a directory fsync after them).
private struct DeletionCount: Sendable {
    var made: UInt64 = 0
    var durable: UInt64 = 0
}
