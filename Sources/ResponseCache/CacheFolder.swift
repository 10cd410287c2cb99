import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Opening a cache folder: list it once, read each file's summary (in parallel), delete what is
/// torn, corrupt, of an older format or not ours to read, and return what the index needs in least-recently-used order.
enum CacheFolder {
    /// `<32 hex digits of the key digest>.rc`.
    static func fileName(_ key: CacheDigest) -> String { key.hex + ".rc" }

    /// The key a cache file's name (`<hex>.rc`, or a write's `.<hex>.rc.tmp`) carries, if any.
    static func key(ofFileNamed name: String) -> CacheDigest? {
        var stem = Substring(name)
        if stem.hasPrefix("."), stem.hasSuffix(".tmp") { stem = stem.dropFirst().dropLast(4) }
        guard stem.hasSuffix(".rc"), stem.utf8.count == 35 else { return nil }
        return CacheDigest(hex: stem.dropLast(3))
    }

    static func isCacheFile(_ name: String) -> Bool {
        name.hasSuffix(".rc") || (name.hasPrefix(".") && name.hasSuffix(".tmp"))
    }

    struct Entry: Sendable {
        let summary: StoredResponseSummary
        let size: Int
        /// Last use, from the file's modification time (a hit touches it).
        let lastUsed: Double
    }

    struct Opened: Sendable {
        var entries: [Entry] = []
        var corruptRemoved = 0
    }

    private enum Found: Sendable {
        case entry(Entry)
        case corrupt
        /// A file of an older format version: deleted, not counted as corrupt.
        case obsolete
        case vanished
        case unreadable(FileSystemError)
    }

    /// Reads the folder open as `folder` (at `path`). Throws `ResponseCacheError.storage`, having
    /// deleted nothing, when a file cannot be read (a system call failed): an I/O error is never a
    /// verdict on a file.
    static func open(folder: Int32, path: String) throws -> Opened {
        let listed: [FileSystem.DirectoryEntry]
        do {
            listed = try FileSystem.listDirectoryEntries(path)
        } catch {
            throw ResponseCacheError.storage(operation: error.operation, path: error.path, errno: error.errno)
        }
        var candidates: [FileSystem.DirectoryEntry] = []
        for entry in listed {
            if entry.name.hasPrefix(".") && entry.name.hasSuffix(".tmp") {
                try? FileSystem.removeFile(path + "/" + entry.name)  // an interrupted write; the folder is ours
            } else if entry.name.hasSuffix(".rc") {
                candidates.append(entry)
            }
        }
        var results = readAll(candidates, folder: folder)
        // A starved descriptor table or memory may free up: retry those reads one by one.
        for position in results.indices {
            var delay: UInt32 = 1_000
            for _ in 0..<6 {
                guard case .unreadable(let error) = results[position], error.isTransient else { break }
                usleep(delay)
                delay *= 2
                var buffer: [UInt8] = []
                results[position] = read(candidates[position], folder: folder, buffer: &buffer)
            }
            if case .unreadable(let error) = results[position] {
                throw ResponseCacheError.storage(operation: error.operation, path: path + "/" + candidates[position].name, errno: error.errno)
            }
        }
        var opened = Opened()
        for (name, result) in zip(candidates.map(\.name), results) {
            switch result {
            case .entry(let entry): opened.entries.append(entry)
            case .corrupt:
                try? FileSystem.removeFile(path + "/" + name)
                opened.corruptRemoved += 1
            case .obsolete:
                try? FileSystem.removeFile(path + "/" + name)
            case .vanished, .unreadable: break
            }
        }
        opened.entries.sort { $0.lastUsed < $1.lastUsed }
        return opened
    }

    private static func readAll(_ names: [FileSystem.DirectoryEntry], folder: Int32) -> [Found] {
        guard !names.isEmpty else { return [] }
        let chunkCount = min(names.count, max(1, ProcessInfo.processInfo.activeProcessorCount) * 4)
        let chunkSize = (names.count + chunkCount - 1) / chunkCount
        let results = UnsafeMutableBufferPointer<Found>.allocate(capacity: names.count)
        results.initialize(repeating: .vanished)
        defer {
            results.deinitialize()
            results.deallocate()
        }
        let base = UncheckedSendable(results)
        DispatchQueue.concurrentPerform(iterations: chunkCount) { chunk in
            var buffer: [UInt8] = []
            let start = chunk * chunkSize
            let end = min(names.count, start + chunkSize)
            guard start < end else { return }
            for position in start..<end {
                base.value[position] = read(names[position], folder: folder, buffer: &buffer)
            }
        }
        return Array(results)
    }

    /// Reads and checks one file's summary (not its body): four system calls for a file the
    /// listing says is regular (open, fstat, read, close).
    private static func read(_ entry: FileSystem.DirectoryEntry, folder: Int32, buffer: inout [UInt8]) -> Found {
        let name = entry.name
        guard entry.isRegularFile != false else { return .corrupt }  // a FIFO, link or device: never opened
        guard name.utf8.count == 35, let key = CacheDigest(hex: name.dropLast(3)) else { return .corrupt }
        var info = stat()
        let listedAsRegular = entry.isRegularFile == true
        let first = FileSystem.readRegularFile(named: name, in: folder, maximumSize: .max - 1, prefix: 4096, listedAsRegular: listedAsRegular, into: &buffer, info: &info)
        var length: Int
        switch first {
        case .bytes(let count): length = count
        case .notRegular, .tooLarge: return .corrupt
        case .vanished: return .vanished
        case .failed(let error): return .unreadable(error)
        }
        let needed: Int
        do {
            needed = try buffer.withUnsafeBytes { try CacheFileFormat.prefix(UnsafeRawBufferPointer(rebasing: $0[0..<length])).summaryEnd }
        } catch CacheFileFormat.Problem.obsoleteVersion {
            return .obsolete
        } catch {
            return .corrupt
        }
        if needed > length {
            switch FileSystem.readRegularFile(named: name, in: folder, maximumSize: .max - 1, prefix: needed, listedAsRegular: listedAsRegular, into: &buffer, info: &info) {
            case .bytes(let count): length = count
            case .notRegular, .tooLarge: return .corrupt
            case .vanished: return .vanished
            case .failed(let error): return .unreadable(error)
            }
        }
        let decoded = buffer.withUnsafeBytes { bytes in
            try? CacheFileFormat.decodeSummary(UnsafeRawBufferPointer(rebasing: bytes[0..<length]))
        }
        guard let decoded, decoded.summary.key == key, decoded.fileSize == Int(info.st_size) else { return .corrupt }
        #if canImport(Darwin)
        let modified = Double(info.st_mtimespec.tv_sec) + Double(info.st_mtimespec.tv_nsec) / 1e9
        #else
        let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
        #endif
        return .entry(Entry(summary: decoded.summary, size: decoded.fileSize, lastUsed: modified))
    }
}
