import Foundation
import Retry
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The POSIX steps that make a write survive a crash or power loss: write a temp file, fsync it,
/// rename it over the final name, fsync the directory. Foundation's `.atomic` write does the
/// rename but not the fsyncs.
enum DurableFiles {
    /// Writes `data` to `path` durably except for the directory entry (see `syncDirectory`):
    /// `tempPath` is created with mode 0600 (O_EXCL), written fully, fsynced, then renamed onto
    /// `path`. On any failure the temp file is removed and `OfflineQueueError.storage` is thrown.
    static func writeFile(_ data: Data, to path: String, via tempPath: String) throws {
        let fd = open(tempPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("create", tempPath) }
        var failed: OfflineQueueError?
        data.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) in
            var offset = 0
            while offset < buffer.count, let base = buffer.baseAddress {
                let written = write(fd, base + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    failed = failure("write", tempPath)
                    return
                }
                offset += written
            }
        }
        if failed == nil, fsync(fd) != 0 { failed = failure("fsync", tempPath) }
        if close(fd) != 0, failed == nil { failed = failure("close", tempPath) }
        if failed == nil, rename(tempPath, path) != 0 { failed = failure("rename", path) }
        if let failed {
            unlink(tempPath)
            throw failed
        }
    }

    /// fsyncs a directory so that renames and unlinks in it survive a crash.
    static func syncDirectory(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open directory", path) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure("fsync directory", path) }
    }

    /// Removes a file; a file that is already gone is not an error.
    static func removeFile(_ path: String) throws {
        guard unlink(path) == 0 || errno == ENOENT else { throw failure("unlink", path) }
    }

    /// Renames a file (same file system).
    static func moveFile(_ from: String, to: String) throws {
        guard rename(from, to) == 0 else { throw failure("rename", from) }
    }

    /// Creates a directory with mode 0700 if it does not exist.
    static func makeDirectory(_ path: String) throws {
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw failure("mkdir", path) }
        var info = stat()
        guard stat(path, &info) == 0 else { throw failure("stat", path) }
        guard (info.st_mode & S_IFMT) == S_IFDIR else {
            throw OfflineQueueError.storage(operation: "mkdir", path: path, errno: ENOTDIR)
        }
    }

    /// Reads a whole file.
    static func readFile(_ path: String) throws -> Data {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open", path) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw failure("fstat", path) }
        let size = Int(info.st_size)
        var data = Data(count: size)
        var offset = 0
        let ok = data.withUnsafeMutableBytes { (buffer: UnsafeMutableRawBufferPointer) -> Bool in
            guard let base = buffer.baseAddress else { return size == 0 }
            while offset < size {
                let got = read(fd, base + offset, size - offset)
                if got < 0 { if errno == EINTR { continue }; return false }
                if got == 0 { break }
                offset += got
            }
            return true
        }
        guard ok else { throw failure("read", path) }
        if offset < size { data.count = offset }
        return data
    }

    /// What reading one entry file found.
    enum EntryRead: Equatable {
        /// The file's bytes are in the buffer, this many.
        case bytes(Int)
        /// Not a regular file (a symbolic link, FIFO, socket, device or directory): never opened
        /// for reading, or closed again before reading. A verdict on the file, not an I/O error.
        case notRegular(String)
        /// A regular file larger than the limit: not read.
        case tooLarge(Int)
        /// The name no longer exists (removed between the listing and the read).
        case vanished
        /// A system call failed: a fact about the process or the disk (EMFILE, EIO, EACCES…),
        /// never a verdict on the file's content.
        case failed(operation: String, errno: Int32)
    }

    /// Reads the entry file `name` in the directory open as `directory` into `buffer` (grown as
    /// needed, reused across calls so a large open allocates almost nothing per file).
    ///
    /// Only a regular file is read: the name is checked with `fstatat` without following links,
    /// opened with `O_NOFOLLOW | O_NONBLOCK` (a FIFO planted under the name can neither block
    /// the open nor the read) and checked again with `fstat`. At most `maximumSize` bytes are read,
    /// so a file that grows while being read cannot exhaust memory.
    static func readEntryFile(named name: String, in directory: Int32, maximumSize: Int, into buffer: inout [UInt8]) -> EntryRead {
        var info = stat()
        guard fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            let code = errno
            return code == ENOENT ? .vanished : .failed(operation: "stat", errno: code)
        }
        if let kind = nonRegularKind(info.st_mode) { return .notRegular(kind) }
        if Int(info.st_size) > maximumSize { return .tooLarge(Int(info.st_size)) }
        let fd = openat(directory, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            switch code {
            case ENOENT: return .vanished
            case ELOOP: return .notRegular("symbolic link")  // replaced by a link since the stat
            case ENXIO: return .notRegular("socket")
            default: return .failed(operation: "open", errno: code)
            }
        }
        defer { close(fd) }
        guard fstat(fd, &info) == 0 else { return .failed(operation: "fstat", errno: errno) }
        if let kind = nonRegularKind(info.st_mode) { return .notRegular(kind) }
        let limit = maximumSize + 1  // one byte more tells a file that grew past the limit
        let wanted = min(limit, max(4096, Int(info.st_size) + 1))
        if buffer.count < wanted { buffer = [UInt8](repeating: 0, count: wanted) }
        var length = 0
        while true {
            if length == buffer.count {
                guard buffer.count < limit else { break }
                buffer.append(contentsOf: [UInt8](repeating: 0, count: min(buffer.count, limit - buffer.count)))
            }
            let got = buffer.withUnsafeMutableBytes { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                return read(fd, base + length, min(raw.count, limit) - length)
            }
            if got < 0 {
                if errno == EINTR { continue }
                return .failed(operation: "read", errno: errno)
            }
            if got == 0 { break }
            length += got
        }
        return length > maximumSize ? .tooLarge(length) : .bytes(length)
    }

    /// The kind of a non-regular file, or nil for a regular one.
    private static func nonRegularKind(_ mode: mode_t) -> String? {
        switch mode & S_IFMT {
        case S_IFREG: return nil
        case S_IFLNK: return "symbolic link"
        case S_IFIFO: return "FIFO"
        case S_IFSOCK: return "socket"
        case S_IFCHR, S_IFBLK: return "device"
        case S_IFDIR: return "directory"
        default: return "special file"
        }
    }

    /// Opens `path` (a directory) and takes an exclusive `flock` on it, held until the descriptor
    /// is closed (or the process ends, however it ends). While another descriptor holds it, tries
    /// again every 5 ms for up to `patience` (a child process being spawned briefly holds a copy
    /// of every descriptor, close-on-exec ones included, until its `exec`), then throws
    /// `OfflineQueueError.folderInUse`.
    static func lockDirectory(_ path: String, patience: Duration = .milliseconds(200)) throws -> Int32 {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open directory", path) }
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: patience)
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            if code == EWOULDBLOCK, clock.now < deadline {
                usleep(5_000)
                continue
            }
            close(fd)
            if code == EWOULDBLOCK { throw OfflineQueueError.folderInUse(path: path) }
            throw OfflineQueueError.storage(operation: "flock", path: path, errno: code)
        }
        return fd
    }

    /// Opens a directory for `readEntryFile(named:in:maximumSize:into:)`; close it with `close(_:)`.
    static func openDirectory(_ path: String) throws -> Int32 {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open directory", path) }
        return fd
    }

    /// Names in a directory (without "." and "..").
    static func listDirectory(_ path: String) throws -> [String] {
        guard let dir = opendir(path) else { throw failure("opendir", path) }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafePointer(to: entry.pointee.d_name) { pointer in
                pointer.withMemoryRebound(to: CChar.self, capacity: Int(NAME_MAX) + 1) { String(cString: $0) }
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    private static func failure(_ operation: String, _ path: String) -> OfflineQueueError {
        .storage(operation: operation, path: path, errno: errno)
    }
}

/// Group commit for directory fsyncs, run on the I/O pool's threads: a writer whose rename is done
/// calls `sync()`, which returns once a directory fsync that *started after the call* has finished.
/// If none is running, the caller runs one itself (leader); otherwise it waits, and when the running
/// one ends, one of the waiters leads the next round for all of them. N concurrent enqueues cost
/// about two directory fsyncs instead of N, with no extra thread hand-off for a lone writer.
final class DirectorySyncer: Sendable {
    private struct State {
        var startedRounds = 0
        var completedRounds = 0
        var running = false
        var lastFailure: (round: Int, error: OfflineQueueError)?
    }

    private let path: String
    private let condition = NSCondition()
    // Guarded by `condition`, which waiters also sleep on.
    private nonisolated(unsafe) var state = State()

    init(path: String) {
        self.path = path
    }

    /// Blocks until a directory fsync that started after this call has completed; throws its error.
    func sync() throws {
        condition.lock()
        defer { condition.unlock() }
        let needed = state.startedRounds + 1
        while state.completedRounds < needed {
            if state.running {
                condition.wait()
                continue
            }
            state.running = true
            state.startedRounds += 1
            let round = state.startedRounds
            condition.unlock()
            var failure: OfflineQueueError?
            do {
                try DurableFiles.syncDirectory(path)
            } catch let error as OfflineQueueError {
                failure = error
            } catch {
                failure = .storage(operation: "fsync directory", path: path, errno: EIO)
            }
            condition.lock()
            state.running = false
            state.completedRounds = round
            if let failure { state.lastFailure = (round, failure) }
            condition.broadcast()
        }
        if let last = state.lastFailure, last.round >= needed { throw last.error }
    }
}
