import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A failed system call on a file or folder: which call, on which path, and its `errno`. Each
/// layer maps it onto its own typed error (`OfflineQueueError.storage`, …).
package struct FileSystemError: Error, Equatable, Sendable {
    package let operation: String
    package let path: String
    package let errno: Int32

    package init(operation: String, path: String, errno: Int32) {
        self.operation = operation
        self.path = path
        self.errno = errno
    }

    /// Out of descriptors or memory, or interrupted: may clear up on its own.
    package var isTransient: Bool {
        errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EAGAIN || errno == EINTR || errno == ENOBUFS
    }
}

/// What is at a path, for `FileSystemStandIn.kind(of:)`.
package enum FileSystemEntryKind: Sendable, Equatable {
    case file
    case directory
}

/// A stand-in for the kernel's file system: while a deterministic simulation runs with one
/// (ResilienceSimulation's `SimulatedDisk`, installed through `SimulationPoints`), every
/// `FileSystem` operation goes to it, with the same meaning and errors as the POSIX call it
/// replaces. Descriptors it returns are its own numbers, closed with `FileSystem.closeDescriptor`.
package protocol FileSystemStandIn: AnyObject, Sendable {
    func writeFile(_ data: Data, to path: String, via tempPath: String, sync: Bool) throws(FileSystemError)
    /// Appends to an existing file (`ENOENT` when there is none), without syncing it.
    func appendFile(_ data: Data, to path: String) throws(FileSystemError)
    func syncDirectory(_ path: String) throws(FileSystemError)
    func removeFile(_ path: String) throws(FileSystemError)
    func moveFile(_ from: String, to: String) throws(FileSystemError)
    /// Creates `path`, and any folder missing above it.
    func makeDirectory(_ path: String) throws(FileSystemError)
    /// What is at `path`, or nil when nothing is.
    func kind(of path: String) -> FileSystemEntryKind?
    func openDirectory(_ path: String) throws(FileSystemError) -> Int32
    func listDirectoryEntries(_ path: String) throws(FileSystemError) -> [FileSystem.DirectoryEntry]
    /// `.busy` at once while another descriptor holds the lock (a simulation has no other process
    /// to wait for).
    func lockDirectory(_ path: String) throws(FileSystemError) -> FileSystem.LockResult
    func readRegularFile(named name: String, in directory: Int32, maximumSize: Int, prefix: Int?, into buffer: inout [UInt8], info: inout stat) -> FileSystem.Read
    func touch(named name: String, in directory: Int32)
    /// Closes one of its descriptors; false for a descriptor it never gave (one the kernel gave
    /// before the simulation began), which the kernel then closes.
    func closeDescriptor(_ descriptor: Int32) -> Bool
}

/// The POSIX file operations the storage layers share: writes that become visible atomically (temp
/// file, optional fsync, rename), reads that only ever read a regular file and never more than a
/// limit, directory listing and an exclusive `flock` on a folder.
package enum FileSystem {
    /// Writes `data` to `tempPath` (created `O_EXCL`, mode 0600), fsyncs it when `sync` is true, and
    /// renames it onto `path`: a reader sees the old file or the complete new one, never a part.
    /// Without `sync` a power loss may leave the new name with incomplete content (readers must
    /// check), a crash of the process may not. On any failure the temp file is removed.
    package static func writeFile(_ data: Data, to path: String, via tempPath: String, sync: Bool) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.writeFile(data, to: path, via: tempPath, sync: sync) }
        let fd = open(tempPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("create", tempPath) }
        var failed = writeAll(data, to: fd, path: tempPath)
        if sync, failed == nil, fsync(fd) != 0 { failed = failure("fsync", tempPath) }
        if close(fd) != 0, failed == nil { failed = failure("close", tempPath) }
        if failed == nil, rename(tempPath, path) != 0 { failed = failure("rename", path) }
        if let failed {
            unlink(tempPath)
            throw failed
        }
    }

    /// Appends `data` to the existing regular file at `path` (never creating it: `ENOENT` when it
    /// is missing, `ELOOP` for a symbolic link) in one `write` where the kernel allows, without
    /// syncing it. A crash of the process leaves the whole append or none of it in practice; a
    /// power loss may leave part of it (readers must check).
    package static func appendFile(_ data: Data, to path: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.appendFile(data, to: path) }
        let fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open", path) }
        var failed: FileSystemError?
        var info = stat()
        if fstat(fd, &info) != 0 {
            failed = failure("fstat", path)
        } else if info.st_mode & S_IFMT != S_IFREG {
            failed = FileSystemError(operation: "open", path: path, errno: EINVAL)
        }
        if failed == nil { failed = writeAll(data, to: fd, path: path) }
        if close(fd) != 0, failed == nil { failed = failure("close", path) }
        if let failed { throw failed }
    }

    /// Writes all of `data` to `fd` (again after a short write or `EINTR`); the failure, if any.
    private static func writeAll(_ data: Data, to fd: Int32, path: String) -> FileSystemError? {
        data.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) -> FileSystemError? in
            var offset = 0
            while offset < buffer.count, let base = buffer.baseAddress {
                let written = write(fd, base + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return failure("write", path)
                }
                offset += written
            }
            return nil
        }
    }

    /// fsyncs a directory so that renames and unlinks in it survive a crash.
    package static func syncDirectory(_ path: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.syncDirectory(path) }
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open directory", path) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure("fsync directory", path) }
    }

    /// Removes a file; a file that is already gone is not an error.
    package static func removeFile(_ path: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.removeFile(path) }
        guard unlink(path) == 0 || errno == ENOENT else { throw failure("unlink", path) }
    }

    /// Renames a file (same file system).
    package static func moveFile(_ from: String, to: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.moveFile(from, to: to) }
        guard rename(from, to) == 0 else { throw failure("rename", from) }
    }

    /// Creates a directory with mode 0700 if it does not exist; something else under the name is
    /// an `ENOTDIR` error.
    package static func makeDirectory(_ path: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.makeDirectory(path) }
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw failure("mkdir", path) }
        var info = stat()
        guard stat(path, &info) == 0 else { throw failure("stat", path) }
        guard (info.st_mode & S_IFMT) == S_IFDIR else {
            throw FileSystemError(operation: "mkdir", path: path, errno: ENOTDIR)
        }
    }

    /// Creates `path` and any folder missing above it (mode 0700 for those it creates), one
    /// `mkdir(2)` per missing folder; a folder that exists already (made meanwhile by another
    /// process, say) is fine, and so is a link to one. Throws the `mkdir` that failed, with the
    /// folder it named and its exact `errno` (`ENOSPC` when the disk has no block or inode left,
    /// `EACCES` only when permission was denied); something other than a folder under one of the
    /// names is `ENOTDIR`.
    package static func makeDirectoryTree(_ path: String) throws(FileSystemError) {
        if let disk = SimulationPoints.fileSystem { return try disk.makeDirectory(path) }
        var folder = Substring(path)
        while folder.count > 1, folder.hasSuffix("/") { folder = folder.dropLast() }
        try makeDirectoryTree(String(folder), depth: 0)
    }

    /// `path` has no trailing slash. The depth bounds the recursion on a name that keeps failing
    /// with `ENOENT` (a folder removed as fast as it is made).
    private static func makeDirectoryTree(_ path: String, depth: Int) throws(FileSystemError) {
        if mkdir(path, 0o700) == 0 { return }
        let code = errno
        if code == ENOENT, depth < 4_096, let slash = path.lastIndex(of: "/"), slash != path.startIndex {
            // A folder above is missing: make it, then this one.
            var parent = path[..<slash]
            while parent.count > 1, parent.hasSuffix("/") { parent = parent.dropLast() }
            try makeDirectoryTree(String(parent), depth: depth + 1)
            return try makeDirectoryTree(path, depth: depth + 1)
        }
        // A folder there already is success, whatever mkdir said of it (EEXIST; EISDIR for "/"
        // on Darwin; a read-only volume may say EROFS first).
        var info = stat()
        if stat(path, &info) == 0 {
            if (info.st_mode & S_IFMT) == S_IFDIR { return }
            if code == EEXIST { throw FileSystemError(operation: "mkdir", path: path, errno: ENOTDIR) }
        }
        throw FileSystemError(operation: "mkdir", path: path, errno: code)
    }

    /// Whether `path` names something other than a directory (a file, a link), without following links.
    package static func isNonDirectory(_ path: String) -> Bool {
        if let disk = SimulationPoints.fileSystem { return disk.kind(of: path).map { $0 != .directory } ?? false }
        var info = stat()
        return lstat(path, &info) == 0 && (info.st_mode & S_IFMT) != S_IFDIR
    }

    /// Whether anything exists at `path` (a dangling link counts).
    package static func exists(_ path: String) -> Bool {
        if let disk = SimulationPoints.fileSystem { return disk.kind(of: path) != nil }
        var info = stat()
        return lstat(path, &info) == 0
    }

    /// Opens a directory for the `…(named:in:)` reads; close it with `close(_:)`.
    package static func openDirectory(_ path: String) throws(FileSystemError) -> Int32 {
        if let disk = SimulationPoints.fileSystem { return try disk.openDirectory(path) }
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open directory", path) }
        return fd
    }

    /// Names in a directory (without "." and "..").
    package static func listDirectory(_ path: String) throws(FileSystemError) -> [String] {
        try listDirectoryEntries(path).map(\.name)
    }

    /// A name in a directory, and what the listing says it is.
    package struct DirectoryEntry: Sendable, Equatable {
        package let name: String
        /// From the listing's `d_type`: true for a regular file, false for anything else, nil when
        /// the file system does not say (then only a `stat` tells).
        package let isRegularFile: Bool?

        package init(name: String, isRegularFile: Bool?) {
            self.name = name
            self.isRegularFile = isRegularFile
        }
    }

    /// The entries of `path` (without `.` and `..`), with the type the listing gives for each, so
    /// that reading every file of a folder need not `stat` each name first.
    package static func listDirectoryEntries(_ path: String) throws(FileSystemError) -> [DirectoryEntry] {
        if let disk = SimulationPoints.fileSystem { return try disk.listDirectoryEntries(path) }
        guard let dir = opendir(path) else { throw failure("opendir", path) }
        defer { closedir(dir) }
        var entries: [DirectoryEntry] = []
        // `d_name` is read in place, up to its NUL: the record `readdir` returns is only as long as
        // its name (`d_reclen`), so copying the declared 256-byte array read past it — past the
        // end of the listing's buffer, for the last record of a full one (a SIGSEGV, seen once
        // in a benchmark's replay of a folder being opened).
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        while let entry = readdir(dir) {
            let name = String(cString: UnsafeRawPointer(entry).advanced(by: nameOffset).assumingMemoryBound(to: CChar.self))
            guard name != "." && name != ".." else { continue }
            let type = entry.pointee.d_type
            entries.append(DirectoryEntry(name: name, isRegularFile: type == UInt8(DT_UNKNOWN) ? nil : type == UInt8(DT_REG)))
        }
        return entries
    }

    /// What locking a folder found.
    package enum LockResult {
        /// The folder is ours while this descriptor stays open.
        case locked(Int32)
        /// Another descriptor holds it.
        case busy
    }

    /// Opens `path` (a directory) and takes an exclusive `flock` on it, held until the descriptor
    /// is closed (or the process ends, however it ends). While another descriptor holds it, tries
    /// again every 5 ms for up to `patience` (a child process being spawned briefly holds a copy
    /// of every descriptor, close-on-exec ones included, until its `exec`), then returns `.busy`.
    package static func lockDirectory(_ path: String, patience: Duration) throws(FileSystemError) -> LockResult {
        if let disk = SimulationPoints.fileSystem { return try disk.lockDirectory(path) }
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
            if code == EWOULDBLOCK { return .busy }
            throw FileSystemError(operation: "flock", path: path, errno: code)
        }
        return .locked(fd)
    }

    /// What reading one file found.
    package enum Read: Equatable {
        /// The file's bytes are in the buffer, this many.
        case bytes(Int)
        /// Not a regular file (a symbolic link, FIFO, socket, device or directory): never read.
        /// A verdict on the file, not an I/O error.
        case notRegular(String)
        /// A regular file larger than the limit: not read (its size).
        case tooLarge(Int)
        /// The name no longer exists (removed between the listing and the read).
        case vanished
        /// A system call failed: a fact about the process or the disk (EMFILE, EIO, EACCES…),
        /// never a verdict on the file's content.
        case failed(FileSystemError)
    }

    /// Reads the file `name` in the directory open as `directory` into `buffer` (grown as needed,
    /// reused across calls), at most `maximumSize` bytes — or only the first `prefix` bytes when
    /// given (then `tooLarge` is never returned for a file longer than `prefix`).
    ///
    /// Only a regular file is read: the name is checked with `fstatat` without following links
    /// (unless `listedAsRegular`: a directory listing's `d_type` already said so, and the check
    /// would cost a system call per file), opened with `O_NOFOLLOW | O_NONBLOCK` (a FIFO planted
    /// under the name can neither block the open nor the read) and checked again with `fstat`.
    /// `info` receives the file's `stat`. A prefix read stops at the size `fstat` reported.
    package static func readRegularFile(
        named name: String,
        in directory: Int32,
        maximumSize: Int,
        prefix: Int? = nil,
        listedAsRegular: Bool = false,
        into buffer: inout [UInt8],
        info: inout stat
    ) -> Read {
        if let disk = SimulationPoints.fileSystem {
            return disk.readRegularFile(named: name, in: directory, maximumSize: maximumSize, prefix: prefix, into: &buffer, info: &info)
        }
        if !listedAsRegular {
            guard fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
                let code = errno
                return code == ENOENT ? .vanished : .failed(FileSystemError(operation: "stat", path: name, errno: code))
            }
            if let kind = nonRegularKind(info.st_mode) { return .notRegular(kind) }
            if prefix == nil, Int(info.st_size) > maximumSize { return .tooLarge(Int(info.st_size)) }
        }
        let fd = openat(directory, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            switch code {
            case ENOENT: return .vanished
            case ELOOP: return .notRegular("symbolic link")  // replaced by a link since the stat
            case ENXIO: return .notRegular("socket")
            default: return .failed(FileSystemError(operation: "open", path: name, errno: code))
            }
        }
        defer { close(fd) }
        guard fstat(fd, &info) == 0 else { return .failed(FileSystemError(operation: "fstat", path: name, errno: errno)) }
        if let kind = nonRegularKind(info.st_mode) { return .notRegular(kind) }
        if prefix == nil, Int(info.st_size) > maximumSize { return .tooLarge(Int(info.st_size)) }
        // One byte more than the limit tells a file that grew past it.
        let limit = prefix.map { min($0, maximumSize) } ?? (maximumSize + 1)
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
                return .failed(FileSystemError(operation: "read", path: name, errno: errno))
            }
            if got == 0 { break }
            length += got
            // A prefix read needs no read that finds the end: the caller checks the size it got.
            if length == limit || (prefix != nil && length >= Int(info.st_size)) { break }
        }
        if prefix == nil, length > maximumSize { return .tooLarge(length) }
        return .bytes(length)
    }

    /// Closes a descriptor that `openDirectory` or `lockDirectory` returned (giving up the lock).
    package static func closeDescriptor(_ descriptor: Int32) {
        if let disk = SimulationPoints.fileSystem, disk.closeDescriptor(descriptor) { return }
        close(descriptor)
    }

    /// Sets the modification time of the file `name` in the directory open as `directory` to now
    /// (what the cache keeps recency in); a file that is gone is no error.
    package static func touch(named name: String, in directory: Int32) {
        if let disk = SimulationPoints.fileSystem { return disk.touch(named: name, in: directory) }
        _ = utimensat(directory, name, nil, 0)
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

    private static func failure(_ operation: String, _ path: String) -> FileSystemError {
        FileSystemError(operation: operation, path: path, errno: errno)
    }
}
