import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The queue's file operations: `FileSystem` (ResilienceCore) with every failure mapped onto
/// `OfflineQueueError.storage`, and durable writes (temp file, fsync, rename; the directory fsync
/// is `syncDirectory`, shared by concurrent writers through `DirectorySyncer`). Foundation's
/// `.atomic` write does the rename but not the fsyncs.
enum DurableFiles {
    /// Writes `data` to `path` durably except for the directory entry (see `syncDirectory`):
    /// `tempPath` is created with mode 0600 (O_EXCL), written fully, fsynced, then renamed onto
    /// `path`. On any failure the temp file is removed and `OfflineQueueError.storage` is thrown.
    static func writeFile(_ data: Data, to path: String, via tempPath: String) throws {
        do { try FileSystem.writeFile(data, to: path, via: tempPath, sync: true) } catch { throw storage(error) }
    }

    /// fsyncs a directory so that renames and unlinks in it survive a crash.
    static func syncDirectory(_ path: String) throws {
        do { try FileSystem.syncDirectory(path) } catch { throw storage(error) }
    }

    /// Removes a file; a file that is already gone is not an error.
    static func removeFile(_ path: String) throws {
        do { try FileSystem.removeFile(path) } catch { throw storage(error) }
    }

    /// Renames a file (same file system).
    static func moveFile(_ from: String, to: String) throws {
        do { try FileSystem.moveFile(from, to: to) } catch { throw storage(error) }
    }

    /// Creates a directory with mode 0700 if it does not exist.
    static func makeDirectory(_ path: String) throws {
        do { try FileSystem.makeDirectory(path) } catch { throw storage(error) }
    }

    /// What reading one entry file found (see `FileSystem.Read`).
    typealias EntryRead = FileSystem.Read

    /// Reads the entry file `name` in the directory open as `directory` into `buffer`: a regular
    /// file only, never through a link, never blocking on a FIFO, at most `maximumSize` bytes.
    static func readEntryFile(named name: String, in directory: Int32, maximumSize: Int, into buffer: inout [UInt8]) -> EntryRead {
        var info = stat()
        return FileSystem.readRegularFile(named: name, in: directory, maximumSize: maximumSize, into: &buffer, info: &info)
    }

    /// Opens `path` (a directory) and takes an exclusive `flock` on it (see
    /// `FileSystem.lockDirectory`); throws `OfflineQueueError.folderInUse` while another holds it.
    static func lockDirectory(_ path: String, patience: Duration = .milliseconds(200)) throws -> Int32 {
        let result: FileSystem.LockResult
        do { result = try FileSystem.lockDirectory(path, patience: patience) } catch { throw storage(error) }
        switch result {
        case .locked(let fd): return fd
        case .busy: throw OfflineQueueError.folderInUse(path: path)
        }
    }

    /// Opens a directory for `readEntryFile(named:in:maximumSize:into:)`; close it with `close(_:)`.
    static func openDirectory(_ path: String) throws -> Int32 {
        do { return try FileSystem.openDirectory(path) } catch { throw storage(error) }
    }

    /// Names in a directory (without "." and "..").
    static func listDirectory(_ path: String) throws -> [String] {
        do { return try FileSystem.listDirectory(path) } catch { throw storage(error) }
    }

    private static func storage(_ error: FileSystemError) -> OfflineQueueError {
        .storage(operation: error.operation, path: error.path, errno: error.errno)
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

    /// Directory fsyncs completed so far (for tests).
    var completedRounds: Int {
        condition.lock()
        defer { condition.unlock() }
        return state.completedRounds
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
