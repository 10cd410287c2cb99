import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// Opening a queue folder: listing it once, reading and judging every entry file, and the
// read-only `inspect`. The rule throughout: only content that was read and found invalid — or a
// file this process may not read (EACCES, EPERM: its owner or mode) — is a verdict on a file
// (quarantine); any other failed system call is a fact about the process or the disk and is
// thrown, with nothing moved.
extension DiskQueueStore {
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
    /// and quarantines invalid ones). Files are read exactly as the store reads them (regular files
    /// only, size-capped), so a planted FIFO or device cannot hang or exhaust it.
    ///
    /// - Throws: `OfflineQueueError.storage` when the folder or one of its entry files cannot be
    ///   read (too many open files, an I/O error, no permission).
    public static func inspect(directory: URL) throws -> Inspection {
        let names = try DurableFiles.listDirectory(directory.path)
        let candidates = names.filter { $0.hasSuffix(".json") && !$0.hasPrefix(".") }
        var entries: [QueueEntry] = []
        var unreadable: [QuarantinedFile] = []
        for (name, result) in zip(candidates, try readAll(candidates, in: directory)) {
            switch result {
            case .entry(let entry): entries.append(entry)
            case .corrupt(let reason): unreadable.append(QuarantinedFile(name: name, reason: reason))
            case .vanished, .unreadable: break  // `readAll` threw for the latter
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

    // MARK: - Open

    struct Loaded {
        var entries: [QueueEntry] = []
        var quarantined: [QuarantinedFile] = []
        var removedTemporaryFiles = 0
        var removedSuperseded = 0
        /// Files of older coalesced edits that a newer one superseded: the store deletes them as
        /// it opens, and makes those deletions durable before it sends any edit.
        var supersededFiles: [String] = []
    }

    /// What reading one candidate file found.
    enum FileResult: Sendable {
        case entry(QueueEntry)
        /// Read and found invalid (or not a regular file): quarantined at open.
        case corrupt(String)
        /// Gone between the listing and the read.
        case vanished
        /// A system call failed: never a verdict on the file.
        case unreadable(operation: String, errno: Int32)
    }

    /// Lists the folder, reads every entry file, and only then acts: canonical names, superseded
    /// coalesced revisions removed, invalid files moved to `quarantine/`. Throws (having moved
    /// nothing) if any file could not be read.
    static func load(directory: URL, quarantine: URL) throws -> Loaded {
        var loaded = Loaded()
        let names = try DurableFiles.listDirectory(directory.path)
        var candidates: [String] = []
        for name in names {
            if name.hasPrefix(".") && name.hasSuffix(".tmp") {
                // The folder is locked, so this is no live writer's file: a crash left it.
                try? DurableFiles.removeFile(directory.appendingPathComponent(name).path)
                loaded.removedTemporaryFiles += 1
            } else if name.hasSuffix(".json") && !name.hasPrefix(".") {
                candidates.append(name)
            }
        }
        let results = try readAll(candidates, in: directory)

        // Judge everything first.
        let present = Set(candidates)
        var renames: [(from: String, to: String)] = []
        var corrupt: [QuarantinedFile] = []
        var byCoalescingKey: [String: QueueEntry] = [:]
        var superseded: [QueueEntry] = []
        for (name, result) in zip(candidates, results) {
            guard case .entry(let entry) = result else {
                if case .corrupt(let reason) = result { corrupt.append(QuarantinedFile(name: name, reason: reason)) }
                continue
            }
            let canonical = EntryFileName.of(entry.id)
            if name != canonical {
                // Same id in another letter case (a hand-copied file): keep one file per id, under
                // the name removal deletes.
                if present.contains(canonical) {
                    corrupt.append(QuarantinedFile(name: name, reason: "duplicate of \(canonical)"))
                    continue
                }
                renames.append((name, canonical))
            }
            guard let key = entry.coalescingKey else {
                loaded.entries.append(entry)
                continue
            }
            // A crash between writing a coalescing replacement and deleting its predecessor (or
            // a delivered revision whose deletion was lost) leaves two: keep the newest write.
            if let kept = byCoalescingKey[key] {
                let keepNew = Self.isNewerRevision(entry, than: kept)
                byCoalescingKey[key] = keepNew ? entry : kept
                superseded.append(keepNew ? kept : entry)
            } else {
                byCoalescingKey[key] = entry
            }
        }
        loaded.entries.append(contentsOf: byCoalescingKey.values)

        // Then act. A failed rename is thrown before anything is removed or moved.
        for rename in renames {
            try DurableFiles.moveFile(directory.appendingPathComponent(rename.from).path, to: directory.appendingPathComponent(rename.to).path)
        }
        // Deleted by the store as it opens, as deletions it must make durable (retrying any that
        // fails) before it sends an edit: else the older edit could come back alone after the
        // newer one was delivered (see `makeDeletionsDurable`).
        loaded.supersededFiles = superseded.map { directory.appendingPathComponent(EntryFileName.of($0.id)).path }.sorted()
        loaded.removedSuperseded = superseded.count
        for file in corrupt {
            loaded.quarantined.append(moveToQuarantine(file, from: directory, to: quarantine))
        }
        let deadLetter = directory.appendingPathComponent("dead-letter")
        for name in (try? DurableFiles.listDirectory(deadLetter.path)) ?? [] where name.hasPrefix(".") && name.hasSuffix(".tmp") {
            try? DurableFiles.removeFile(deadLetter.appendingPathComponent(name).path)
        }
        return loaded
    }

    /// Which of two entries with one coalescing key was written last: the higher revision (taken
    /// from the store's counter at each replacement), then the later enqueue, then the later sequence.
    static func isNewerRevision(_ candidate: QueueEntry, than kept: QueueEntry) -> Bool {
        if candidate.revision != kept.revision { return candidate.revision > kept.revision }
        if candidate.enqueuedAt != kept.enqueuedAt { return candidate.enqueuedAt > kept.enqueuedAt }
        return candidate.sequence > kept.sequence
    }

    /// Reads every file (in parallel), then retries the ones a system call failed for: a starved
    /// descriptor table or memory may free up. Throws `OfflineQueueError.storage` for the first
    /// file that still cannot be read.
    static func readAll(_ names: [String], in directory: URL) throws -> [FileResult] {
        guard !names.isEmpty else { return [] }
        var results = try decodeAll(names, in: directory)
        guard results.contains(where: { if case .unreadable = $0 { true } else { false } }) else { return results }
        let folder = try openDirectoryRetrying(directory.path)
        defer { FileSystem.closeDescriptor(folder) }
        let decoder = QueueEntry.makeDecoder()
        var buffer: [UInt8] = []
        for position in results.indices {
            guard case .unreadable = results[position] else { continue }
            var delay: UInt32 = 1_000
            for _ in 0..<6 {
                guard case .unreadable(_, let code) = results[position], isTransient(code) else { break }
                usleep(delay)
                delay *= 2
                results[position] = decodeFile(names[position], directory: folder, buffer: &buffer, decoder: decoder)
            }
            if case .unreadable(let operation, let code) = results[position] {
                throw OfflineQueueError.storage(operation: "\(operation) entry", path: directory.appendingPathComponent(names[position]).path, errno: code)
            }
        }
        return results
    }

    /// Errors that may clear up on their own: out of descriptors or memory, interrupted.
    private static func isTransient(_ code: Int32) -> Bool {
        code == EMFILE || code == ENFILE || code == ENOMEM || code == EAGAIN || code == EINTR || code == ENOBUFS
    }

    private static func openDirectoryRetrying(_ path: String) throws -> Int32 {
        var delay: UInt32 = 1_000
        for _ in 0..<6 {
            do {
                return try DurableFiles.openDirectory(path)
            } catch OfflineQueueError.storage(_, _, let code) where isTransient(code) {
                usleep(delay)
                delay *= 2
            }
        }
        return try DurableFiles.openDirectory(path)
    }

    /// Reads and decodes every file, spread over the available cores. Files are opened relative to
    /// the folder's descriptor and read into one reusable buffer per worker.
    private static func decodeAll(_ names: [String], in directory: URL) throws -> [FileResult] {
        let directoryFD = try openDirectoryRetrying(directory.path)
        defer { FileSystem.closeDescriptor(directoryFD) }
        let chunkCount = min(names.count, max(1, ProcessInfo.processInfo.activeProcessorCount) * 4)
        let chunkSize = (names.count + chunkCount - 1) / chunkCount
        let results = UnsafeMutableBufferPointer<FileResult>.allocate(capacity: names.count)
        results.initialize(repeating: .vanished)
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

    static func decodeFile(_ name: String, directory: Int32, buffer: inout [UInt8], decoder: JSONDecoder) -> FileResult {
        let length: Int
        switch DurableFiles.readEntryFile(named: name, in: directory, maximumSize: maximumEntrySize, into: &buffer) {
        case .bytes(let count): length = count
        case .notRegular(let kind): return .corrupt("not a regular file (\(kind))")
        case .tooLarge(let size): return .corrupt("larger than \(maximumEntrySize) bytes (\(size))")
        case .vanished: return .vanished
        case .failed(let error) where error.errno == EACCES || error.errno == EPERM:
            // The file's owner or mode shuts this process out (a file left by another user, say):
            // a verdict on this one file, which is moved aside, not on the folder or the disk.
            return .corrupt("not readable by this process (\(error.operation): permission denied)")
        case .failed(let error): return .unreadable(operation: error.operation, errno: error.errno)
        }
        let fast = buffer.withUnsafeBufferPointer { QueueEntryDecoder.decode(UnsafeBufferPointer(rebasing: $0[0..<length])) }
        guard let decoded = fast ?? (try? decoder.decode(QueueEntry.self, from: Data(buffer[0..<length]))) else {
            return .corrupt("not a valid queue entry (\(length) bytes)")
        }
        guard name.hasSuffix(".json"), QueueEntryDecoder.parseUUID(String(name.dropLast(5))) == decoded.id else {
            return .corrupt("file name does not match entry id")
        }
        guard decoded.formatVersion <= QueueEntry.currentFormatVersion else {
            return .corrupt("unsupported format version \(decoded.formatVersion)")
        }
        guard decoded.httpMethod != nil else { return .corrupt("unknown method \(decoded.method)") }
        guard decoded.sequence <= QueueEntry.maximumCounter else {
            return .corrupt("sequence \(decoded.sequence) out of range")
        }
        return .entry(decoded.withCountersInRange())
    }

    /// Moves an invalid file aside (never deletes it). If it cannot be moved it stays where it is,
    /// still not loaded; the reason says so.
    private static func moveToQuarantine(_ file: QuarantinedFile, from directory: URL, to quarantine: URL) -> QuarantinedFile {
        let source = directory.appendingPathComponent(file.name).path
        var target = quarantine.appendingPathComponent(file.name).path
        if FileSystem.exists(target) {
            target = quarantine.appendingPathComponent("\(UUID().uuidString)-\(file.name)").path
        }
        do {
            try DurableFiles.moveFile(source, to: target)
            return file
        } catch {
            return QuarantinedFile(name: file.name, reason: file.reason + "; left in place: \(error)")
        }
    }
}
