import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The disk of a ``Simulation``: while the simulation runs, every file operation of the package's
/// stores (`DiskQueueStore`, `DiskResponseCache`) goes here instead of the kernel. It keeps files
/// in memory, fails operations when its ``Faults`` say so, and loses what a power cut loses.
///
/// **What survives a crash.** The disk models a journaling file system with ordered metadata
/// (ext4's default, APFS): operations on names (a file created under a name, a rename, an unlink)
/// reach the disk in the order they were made, and a directory fsync makes every such operation
/// up to the last one in that directory durable. ``crash()`` keeps the durable ones and a prefix
/// of the rest, of a length drawn from the seed (none, some or all of them). A file's content
/// survives when it was fsynced; an unsynced file's content comes back whole, empty, or cut short.
/// Folders are durable from their creation.
///
/// **Faults.** Each write (of a whole file), fsync, rename, unlink and directory fsync fails with
/// the probability ``Faults`` gives, with `ENOSPC`, `EIO` or `EACCES` drawn from the seed.
/// Between ``crash()`` and ``restart()`` every operation fails with `EIO`: the crashed process's
/// objects may still run in the simulation, but nothing they do reaches the disk.
public final class SimulatedDisk: Sendable {
    /// The probability that one operation of each kind fails.
    public struct Faults: Sendable, Hashable {
        /// Writing a file's content.
        public var write: Double
        /// Syncing a file's content.
        public var fsync: Double
        /// Renaming a file (also the rename that publishes a newly written file).
        public var rename: Double
        /// Removing a file.
        public var unlink: Double
        /// Syncing a folder.
        public var directorySync: Double

        public init(write: Double = 0, fsync: Double = 0, rename: Double = 0, unlink: Double = 0, directorySync: Double = 0) {
            self.write = write
            self.fsync = fsync
            self.rename = rename
            self.unlink = unlink
            self.directorySync = directorySync
        }

        /// A disk that never fails.
        public static let none = Faults()
    }

    /// A name operation, in the order the journal applies it.
    private enum Change {
        case link(directory: String, name: String, file: Int)
        case unlink(directory: String, name: String)
        case move(directory: String, name: String, toDirectory: String, toName: String)
    }

    private struct File {
        var content: [UInt8]
        /// Whether `content` is on the disk (fsynced, or what a crash left).
        var synced: Bool
        var modified: Double
    }

    private typealias Tree = [String: [String: Int]]  // folder → name → file

    private struct State {
        var generator: SeededGenerator
        var faults = Faults.none
        var folders: Set<String> = ["/"]
        var tree: Tree = ["/": [:]]
        var durableTree: Tree = ["/": [:]]
        var journal: [Change] = []
        var files: [Int: File] = [:]
        var nextFile = 1
        var descriptors: [Int32: String] = [:]
        var locks: [String: Int32] = [:]
        var nextDescriptor = SimulatedDisk.firstDescriptor
        var down = false
        var failures = 0
        var crashes = 0
    }

    /// The first descriptor number it gives.
    static let firstDescriptor: Int32 = 1_000_000

    private let state: Locked<State>
    /// The simulation's recorder (in a `LockedFunction`: see why there).
    private let trace: Locked<LockedFunction<@Sendable (String) -> Void>?> = Locked(nil)

    init(seed: UInt64) {
        state = Locked(State(generator: SeededGenerator(seed: seed ^ 0xD15C_0FF1_CE00_0001)))
    }

    func attach(to simulation: Simulation) {
        trace.withLock { $0 = LockedFunction { [weak simulation] line in simulation?.record(line) } }
    }

    private func record(_ line: String) {
        trace.withLock { $0 }?.function(line)
    }

    /// How often operations fail from now on.
    public var faults: Faults {
        get { state.withLock { $0.faults } }
        set { state.withLock { $0.faults = newValue } }
    }

    /// Operations the faults (or a crash) made fail so far.
    public var failures: Int { state.withLock { $0.failures } }

    /// Crashes so far.
    public var crashes: Int { state.withLock { $0.crashes } }

    /// Whether the disk is down (after ``crash()``, until ``restart()``).
    public var isDown: Bool { state.withLock { $0.down } }

    /// The power goes: what was not durable is lost (see the type's description), every descriptor
    /// and folder lock is gone, and every operation fails with `EIO` until ``restart()``.
    public func crash() {
        let line = state.withLock { state -> String in
            let kept = Int.random(in: 0...state.journal.count, using: &state.generator)
            for change in state.journal.prefix(kept) { Self.apply(change, to: &state.durableTree) }
            let lost = state.journal.count - kept
            state.journal = []
            state.tree = state.durableTree
            var cut = 0
            let live = Set(state.tree.values.flatMap(\.values))
            for id in live.sorted() where state.files[id]?.synced == false {
                guard var file = state.files[id] else { continue }
                switch Int.random(in: 0...2, using: &state.generator) {
                case 0: break
                case 1: file.content = []
                default: file.content = Array(file.content.prefix(Int.random(in: 0...file.content.count, using: &state.generator)))
                }
                file.synced = true
                state.files[id] = file
                cut += 1
            }
            state.files = state.files.filter { live.contains($0.key) }
            state.descriptors = [:]
            state.locks = [:]
            state.down = true
            state.crashes += 1
            return "disk crash: \(kept) name changes kept, \(lost) lost, \(cut) unsynced files cut"
        }
        record(line)
    }

    /// The disk answers again (the device rebooted): open the stores afresh.
    public func restart() {
        state.withLock { $0.down = false }
        record("disk restart")
    }

    // MARK: - Paths

    private static func normalized(_ path: String) -> String {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        return "/" + parts.joined(separator: "/")
    }

    private static func split(_ path: String) -> (folder: String, name: String) {
        let path = normalized(path)
        guard let slash = path.lastIndex(of: "/") else { return ("/", path) }
        let folder = String(path[..<slash])
        return (folder.isEmpty ? "/" : folder, String(path[path.index(after: slash)...]))
    }

    private static func apply(_ change: Change, to tree: inout Tree) {
        switch change {
        case .link(let directory, let name, let file):
            tree[directory, default: [:]][name] = file
        case .unlink(let directory, let name):
            tree[directory]?[name] = nil
        case .move(let directory, let name, let toDirectory, let toName):
            guard let file = tree[directory]?[name] else { return }
            tree[directory]?[name] = nil
            tree[toDirectory, default: [:]][toName] = file
        }
    }

    // MARK: - Operations (called through `FileSystem` while the simulation runs)

    /// Throws `EIO` while the disk is down, and a drawn fault with probability `probability`.
    private static func check(_ state: inout State, _ probability: Double, _ operation: String, _ path: String) throws(FileSystemError) {
        if state.down {
            state.failures += 1
            throw FileSystemError(operation: operation, path: path, errno: EIO)
        }
        if probability > 0, Double.random(in: 0..<1, using: &state.generator) < probability {
            state.failures += 1
            let code = [ENOSPC, EIO, EACCES][Int.random(in: 0...2, using: &state.generator)]
            throw FileSystemError(operation: operation, path: path, errno: code)
        }
    }

    private func change(_ body: (inout State) throws(FileSystemError) -> Void) throws(FileSystemError) {
        var failure: FileSystemError?
        state.withLock { state in
            do throws(FileSystemError) { try body(&state) } catch { failure = error }
        }
        if let failure {
            record("disk \(failure.operation) \(Self.split(failure.path).name) failed: errno \(failure.errno)")
            throw failure
        }
    }
}

extension SimulatedDisk: FileSystemStandIn {
    package func writeFile(_ data: Data, to path: String, via tempPath: String, sync: Bool) throws(FileSystemError) {
        let now = SimulationPoints.date().timeIntervalSince1970
        try change { state throws(FileSystemError) in
            let (folder, name) = Self.split(path)
            let (tempFolder, tempName) = Self.split(tempPath)
            try Self.check(&state, 0, "create", tempPath)
            guard state.folders.contains(tempFolder), state.folders.contains(folder) else {
                throw FileSystemError(operation: "create", path: tempPath, errno: ENOENT)
            }
            guard state.tree[tempFolder]?[tempName] == nil else { throw FileSystemError(operation: "create", path: tempPath, errno: EEXIST) }
            // The temp file exists (empty) from here on; a failure below removes it again.
            let id = state.nextFile
            state.nextFile += 1
            state.files[id] = File(content: [], synced: false, modified: now)
            state.tree[tempFolder, default: [:]][tempName] = id
            state.journal.append(.link(directory: tempFolder, name: tempName, file: id))
            do throws(FileSystemError) {
                try Self.check(&state, state.faults.write, "write", tempPath)
                state.files[id]?.content = [UInt8](data)
                if sync {
                    try Self.check(&state, state.faults.fsync, "fsync", tempPath)
                    state.files[id]?.synced = true
                }
                try Self.check(&state, state.faults.rename, "rename", path)
            } catch {
                if !state.down {
                    state.tree[tempFolder]?[tempName] = nil
                    state.journal.append(.unlink(directory: tempFolder, name: tempName))
                }
                throw error
            }
            state.tree[tempFolder]?[tempName] = nil
            state.tree[folder, default: [:]][name] = id
            state.journal.append(.move(directory: tempFolder, name: tempName, toDirectory: folder, toName: name))
        }
    }

    package func appendFile(_ data: Data, to path: String) throws(FileSystemError) {
        let now = SimulationPoints.date().timeIntervalSince1970
        try change { state throws(FileSystemError) in
            let (folder, name) = Self.split(path)
            try Self.check(&state, 0, "open", path)
            guard let id = state.tree[folder]?[name], state.files[id] != nil else {
                throw FileSystemError(operation: "open", path: path, errno: ENOENT)
            }
            try Self.check(&state, state.faults.write, "write", path)
            // Unsynced from here: a crash may leave the file whole, empty or cut short.
            state.files[id]?.content += [UInt8](data)
            state.files[id]?.synced = false
            state.files[id]?.modified = now
        }
    }

    package func syncDirectory(_ path: String) throws(FileSystemError) {
        try change { state throws(FileSystemError) in
            let folder = Self.normalized(path)
            try Self.check(&state, 0, "open directory", path)
            guard state.folders.contains(folder) else { throw FileSystemError(operation: "open directory", path: path, errno: ENOENT) }
            try Self.check(&state, state.faults.directorySync, "fsync directory", path)
            // The journal reaches the disk in order, up to the last change in this folder.
            guard
                let last = state.journal.lastIndex(where: { change in
                    switch change {
                    case .link(let directory, _, _), .unlink(let directory, _): directory == folder
                    case .move(let directory, _, let toDirectory, _): directory == folder || toDirectory == folder
                    }
                })
            else { return }
            for change in state.journal[...last] { Self.apply(change, to: &state.durableTree) }
            state.journal.removeFirst(last + 1)
        }
    }

    package func removeFile(_ path: String) throws(FileSystemError) {
        try change { state throws(FileSystemError) in
            let (folder, name) = Self.split(path)
            try Self.check(&state, 0, "unlink", path)
            guard state.tree[folder]?[name] != nil else { return }  // already gone: not an error
            try Self.check(&state, state.faults.unlink, "unlink", path)
            state.tree[folder]?[name] = nil
            state.journal.append(.unlink(directory: folder, name: name))
        }
    }

    package func moveFile(_ from: String, to: String) throws(FileSystemError) {
        try change { state throws(FileSystemError) in
            let (folder, name) = Self.split(from)
            let (toFolder, toName) = Self.split(to)
            try Self.check(&state, 0, "rename", from)
            guard let id = state.tree[folder]?[name], state.folders.contains(toFolder) else {
                throw FileSystemError(operation: "rename", path: from, errno: ENOENT)
            }
            try Self.check(&state, state.faults.rename, "rename", from)
            state.tree[folder]?[name] = nil
            state.tree[toFolder, default: [:]][toName] = id
            state.journal.append(.move(directory: folder, name: name, toDirectory: toFolder, toName: toName))
        }
    }

    package func makeDirectory(_ path: String) throws(FileSystemError) {
        try change { state throws(FileSystemError) in
            try Self.check(&state, 0, "mkdir", path)
            var current = ""
            for part in Self.normalized(path).split(separator: "/") {
                let parent = current.isEmpty ? "/" : current
                current += "/" + part
                if state.folders.contains(current) { continue }
                if state.tree[parent]?[String(part)] != nil { throw FileSystemError(operation: "mkdir", path: path, errno: ENOTDIR) }
                state.folders.insert(current)
                state.tree[current] = [:]
                state.durableTree[current] = [:]
            }
        }
    }

    package func kind(of path: String) -> FileSystemEntryKind? {
        state.withLock { state in
            let path = Self.normalized(path)
            if state.down { return nil }
            if state.folders.contains(path) { return .directory }
            let (folder, name) = Self.split(path)
            return state.tree[folder]?[name] == nil ? nil : .file
        }
    }

    package func openDirectory(_ path: String) throws(FileSystemError) -> Int32 {
        var descriptor: Int32 = -1
        try change { state throws(FileSystemError) in
            let folder = Self.normalized(path)
            try Self.check(&state, 0, "open directory", path)
            guard state.folders.contains(folder) else { throw FileSystemError(operation: "open directory", path: path, errno: ENOENT) }
            descriptor = state.nextDescriptor
            state.nextDescriptor += 1
            state.descriptors[descriptor] = folder
        }
        return descriptor
    }

    package func listDirectoryEntries(_ path: String) throws(FileSystemError) -> [FileSystem.DirectoryEntry] {
        var entries: [FileSystem.DirectoryEntry] = []
        try change { state throws(FileSystemError) in
            let folder = Self.normalized(path)
            try Self.check(&state, 0, "opendir", path)
            guard state.folders.contains(folder) else { throw FileSystemError(operation: "opendir", path: path, errno: ENOENT) }
            let prefix = folder == "/" ? "/" : folder + "/"
            let subfolders = state.folders.filter { $0.hasPrefix(prefix) && !$0.dropFirst(prefix.count).contains("/") && $0 != folder }
            entries =
                (state.tree[folder] ?? [:]).keys.map { FileSystem.DirectoryEntry(name: $0, isRegularFile: true) }
                + subfolders.map { FileSystem.DirectoryEntry(name: String($0.dropFirst(prefix.count)), isRegularFile: false) }
            entries.sort { $0.name < $1.name }
        }
        return entries
    }

    package func lockDirectory(_ path: String) throws(FileSystemError) -> FileSystem.LockResult {
        var result = FileSystem.LockResult.busy
        try change { state throws(FileSystemError) in
            let folder = Self.normalized(path)
            try Self.check(&state, 0, "open directory", path)
            guard state.folders.contains(folder) else { throw FileSystemError(operation: "open directory", path: path, errno: ENOENT) }
            guard state.locks[folder] == nil else { return }
            let descriptor = state.nextDescriptor
            state.nextDescriptor += 1
            state.descriptors[descriptor] = folder
            state.locks[folder] = descriptor
            result = .locked(descriptor)
        }
        return result
    }

    package func readRegularFile(
        named name: String,
        in directory: Int32,
        maximumSize: Int,
        prefix: Int?,
        into buffer: inout [UInt8],
        info: inout stat
    ) -> FileSystem.Read {
        // One look under the lock: the file's content, or what reading it finds instead.
        enum Lookup {
            case file(content: [UInt8], modified: Double)
            case not(FileSystem.Read)
        }
        let found = state.withLock { state -> Lookup in
            guard !state.down else { return .not(.failed(FileSystemError(operation: "open", path: name, errno: EIO))) }
            guard let folder = state.descriptors[directory] else { return .not(.failed(FileSystemError(operation: "open", path: name, errno: EBADF))) }
            if state.folders.contains((folder == "/" ? "" : folder) + "/" + name) { return .not(.notRegular("directory")) }
            guard let id = state.tree[folder]?[name], let file = state.files[id] else { return .not(.vanished) }
            return .file(content: file.content, modified: file.modified)
        }
        let file: (content: [UInt8], modified: Double)
        switch found {
        case .not(let outcome): return outcome
        case .file(let content, let modified): file = (content, modified)
        }
        info = stat()
        info.st_mode = S_IFREG | 0o600
        info.st_size = off_t(file.content.count)
        #if canImport(Darwin)
        info.st_mtimespec.tv_sec = Int(file.modified)
        info.st_mtimespec.tv_nsec = Int((file.modified - file.modified.rounded(.down)) * 1e9)
        #else
        info.st_mtim.tv_sec = Int(file.modified)
        info.st_mtim.tv_nsec = Int((file.modified - file.modified.rounded(.down)) * 1e9)
        #endif
        if prefix == nil, file.content.count > maximumSize { return .tooLarge(file.content.count) }
        let length = min(file.content.count, prefix.map { min($0, maximumSize) } ?? maximumSize)
        if buffer.count < length { buffer = [UInt8](repeating: 0, count: length) }
        buffer.replaceSubrange(0..<length, with: file.content[0..<length])
        return .bytes(length)
    }

    package func touch(named name: String, in directory: Int32) {
        let now = SimulationPoints.date().timeIntervalSince1970
        state.withLock { state in
            guard !state.down, let folder = state.descriptors[directory], let id = state.tree[folder]?[name] else { return }
            state.files[id]?.modified = now
        }
    }

    package func closeDescriptor(_ descriptor: Int32) -> Bool {
        state.withLock { state in
            // Its numbers start at 1 000 000, above any the kernel gives this process; one given
            // before a crash is gone already.
            guard descriptor >= Self.firstDescriptor else { return false }
            guard let folder = state.descriptors.removeValue(forKey: descriptor) else { return true }
            if state.locks[folder] == descriptor { state.locks[folder] = nil }
            return true
        }
    }
}
