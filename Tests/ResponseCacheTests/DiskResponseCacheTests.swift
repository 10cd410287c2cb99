import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func storedResponse(_ path: String, body: String = "body", storedAt: Date = Date(timeIntervalSinceReferenceDate: 800_000_000)) -> StoredResponse {
    let url = "https://example.test" + path
    return StoredResponse(
        key: CacheDigest("GET\n" + url + "\n"), primaryKey: CacheDigest("GET\n" + url + "\n"),
        method: "GET", url: url, partition: nil, storedAt: storedAt, initialAge: 0, statusCode: 200,
        headers: ["Content-Type": "text/plain"], varyNames: [], varyDigest: nil, body: Data(body.utf8)
    )
}

@Suite("DiskResponseCache: files, eviction, corruption, restart", .timeLimit(.minutes(1)))
struct DiskResponseCacheTests {
    private func cacheFiles(_ directory: TemporaryDirectory) -> [String] {
        directory.fileNames.filter { $0.hasSuffix(".rc") }
    }

    @Test func aStoredResponseIsReadBackFromMemoryAndAfterAReopenFromItsFile() async throws {
        let directory = TemporaryDirectory()
        let response = storedResponse("/feed", body: "[1,2,3]")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            cache.store(response)
            #expect(cache.response(for: response.key) == response)  // before the write finished
            await cache.waitForWrites()
            #expect(cache.count == 1)
            #expect(cache.statistics.stored == 1)
        }
        #expect(cacheFiles(directory) == [response.key.hex + ".rc"])
        let path = directory.url.appendingPathComponent(response.key.hex + ".rc").path
        let mode = ((try FileManager.default.attributesOfItem(atPath: path))[.posixPermissions] as? NSNumber)?.intValue
        #expect(mode == 0o600)
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(reopened.count == 1)
        #expect(reopened.response(for: response.key) == response)
        #expect(reopened.response(for: CacheDigest("nothing")) == nil)
        #expect(reopened.statistics.hits == 1 && reopened.statistics.misses == 1)
    }

    @Test func theFilesNeverTakeMoreThanMaxBytesAndTheLeastRecentlyUsedGoFirst() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 4_000, memoryBytes: 0)
        let responses = (0..<5).map { storedResponse("/\($0)", body: String(repeating: "x", count: 700)) }
        for response in responses.prefix(4) {
            cache.store(response)
            await cache.waitForWrites()
        }
        let size = cache.totalBytes / 4
        #expect(cache.count == 4)
        _ = cache.response(for: responses[0].key)  // now the most recently used
        cache.store(responses[4])
        await cache.waitForWrites()
        // 5 files would not fit in 4 000 bytes: the least recently used (/1) went.
        #expect(cache.totalBytes <= 4_000 && cache.totalBytes == size * 4)
        #expect(cache.response(for: responses[1].key) == nil)
        #expect(cache.response(for: responses[0].key) != nil)
        #expect(Set(cacheFiles(directory)) == Set([0, 2, 3, 4].map { responses[$0].key.hex + ".rc" }))
        #expect(cache.statistics.evicted == 1)
        // Larger than the whole cache: never stored.
        cache.store(storedResponse("/huge", body: String(repeating: "y", count: 5_000)))
        await cache.waitForWrites()
        #expect(cache.statistics.tooLargeToStore == 1)
        #expect(cache.count == 4)
    }

    @Test func randomSizesNeverPushTheFolderOverMaxBytes() async throws {
        let directory = TemporaryDirectory()
        let maxBytes = 200_000
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: maxBytes, memoryBytes: 0)
        var generator = SplitMix64(seed: 7)
        for index in 0..<2_000 {
            let size = Int.random(in: 0..<20_000, using: &generator)
            cache.store(storedResponse("/\(index % 300)", body: String(repeating: "z", count: size)))
            if index % 50 == 0 {
                await cache.waitForWrites()
                let onDisk = try folderBytes(directory)
                #expect(onDisk <= maxBytes, "after \(index) stores: \(onDisk) bytes on disk")
                #expect(onDisk == cache.totalBytes)
            }
        }
        await cache.waitForWrites()
        #expect(try folderBytes(directory) <= maxBytes)
        #expect(try folderBytes(directory) == cache.totalBytes)
    }

    private func folderBytes(_ directory: TemporaryDirectory) throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: directory.url.path).reduce(0) { total, name in
            let attributes = try FileManager.default.attributesOfItem(atPath: directory.url.appendingPathComponent(name).path)
            return total + ((attributes[.size] as? NSNumber)?.intValue ?? 0)
        }
    }

    @Test func aTornOrCorruptFileIsNeverServedAndIsDeletedAndCounted() async throws {
        let directory = TemporaryDirectory()
        let good = storedResponse("/good"), torn = storedResponse("/torn"), flipped = storedResponse("/flipped", body: String(repeating: "f", count: 100))
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            for response in [good, torn, flipped] { cache.store(response) }
            await cache.waitForWrites()
        }
        // A power loss can leave a renamed file short, or with wrong bytes.
        let tornPath = directory.url.appendingPathComponent(torn.key.hex + ".rc")
        let tornData = try Data(contentsOf: tornPath)
        try tornData.prefix(tornData.count - 3).write(to: tornPath)
        let flippedPath = directory.url.appendingPathComponent(flipped.key.hex + ".rc")
        var flippedData = try Data(contentsOf: flippedPath)
        flippedData[flippedData.count - 10] ^= 0xFF  // in the body: only the checksum sees it
        try flippedData.write(to: flippedPath)
        try Data("garbage".utf8).write(to: directory.url.appendingPathComponent(CacheDigest("x").hex + ".rc"))
        #expect(mkfifo(directory.url.appendingPathComponent(CacheDigest("fifo").hex + ".rc").path, 0o600) == 0)

        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        // The torn file's size does not match its header: gone at open, with the garbage and the FIFO.
        #expect(cache.statistics.corruptRemoved == 3)
        #expect(cache.count == 2)
        #expect(cache.response(for: torn.key) == nil)
        // The flipped byte is only seen when the body is read: a miss, deleted, counted.
        #expect(cache.response(for: flipped.key) == nil)
        #expect(cache.statistics.corruptRemoved == 4)
        #expect(cache.count == 1)
        #expect(cache.response(for: good.key) == good)
        #expect(cacheFiles(directory) == [good.key.hex + ".rc"])
    }

    @Test func aFileOfTheOlderFormatIsDroppedAtOpenWithoutCountingAsCorrupt() async throws {
        let directory = TemporaryDirectory()
        let current = storedResponse("/current")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            cache.store(current)
            await cache.waitForWrites()
        }
        var old = try CacheFileFormat.encode(storedResponse("/old"))
        old.replaceSubrange(0..<4, with: Array("RCv1".utf8))
        try old.write(to: directory.url.appendingPathComponent(CacheDigest("old").hex + ".rc"))
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(cache.count == 1 && cache.statistics.corruptRemoved == 0)
        #expect(cacheFiles(directory) == [current.key.hex + ".rc"])
    }

    @Test func variantsOfOneURLAreIndexedTogetherAndSurviveAReopen() async throws {
        let directory = TemporaryDirectory()
        let primary = CacheDigest("GET\nhttps://example.test/doc\n")
        func variant(_ language: String) -> StoredResponse {
            var response = storedResponse("/doc", body: language)
            let digest = HTTPCachePolicy.varyDigest(names: ["accept-language"], requestHeaders: ["Accept-Language": language])
            response.key = StoredResponse.variantKey(primary: primary, varyNames: ["accept-language"], varyDigest: digest)
            response.primaryKey = primary
            response.varyNames = ["accept-language"]
            response.varyDigest = digest
            return response
        }
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            for language in ["en", "fr", "de"] { cache.store(variant(language)) }
            #expect(Set(cache.variants(for: [primary]).map(\.body)) == Set(["en", "fr", "de"].map { Data($0.utf8) }))
            await cache.waitForWrites()
        }
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
        #expect(Set(cache.variants(for: [primary]).map(\.body)) == Set(["en", "fr", "de"].map { Data($0.utf8) }))
        #expect(cache.remove(method: .get, url: URL(string: "https://example.test/doc")!) == 3)
        #expect(cache.variants(for: [primary]).isEmpty && cacheFiles(directory).isEmpty)
    }

    @Test func aResponseIsReadAsStoredBeforeItsFileIsWrittenEvenWithoutAMemoryLayer() async throws {
        let directory = TemporaryDirectory()
        let first = storedResponse("/feed", body: "first")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
            cache.store(first)
            await cache.waitForWrites()
            var second = first
            second.body = Data("second".utf8)
            cache.store(second)
            #expect(cache.response(for: first.key)?.body == Data("second".utf8))  // not the file of "first"
            cache.markStale([first.primaryKey])
            #expect(cache.variants(for: [first.primaryKey]).map(\.isInvalidated) == [true])
            await cache.waitForWrites()
        }
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
        let stored = try #require(reopened.response(for: first.key))
        #expect(stored.body == Data("second".utf8) && stored.isInvalidated)
    }

    @Test func aChangeMadeFromAnOlderResponseNeverOverwritesANewerOne() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let old = storedResponse("/feed", body: "old")
        cache.store(old)
        var newer = old
        newer.body = Data("newer".utf8)
        cache.update(old.key) { current in
            cache.store(newer)  // stored while the change was being made
            var changed = current
            changed.isInvalidated = true
            return changed
        }
        let kept = try #require(cache.response(for: old.key))
        #expect(kept.body == Data("newer".utf8) && !kept.isInvalidated)
        cache.update(storedResponse("/absent").key) { _ in storedResponse("/absent") }
        #expect(cache.response(for: storedResponse("/absent").key) == nil)  // nothing stored: nothing made up
        try cache.clear()
        cache.update(old.key) { $0 }
        #expect(cache.count == 0)
    }

    @Test func aHugeMaxBytesNeverOverflows() async throws {
        let directory = TemporaryDirectory()
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: .max, memoryBytes: 0)
            cache.store(storedResponse("/feed"))
            await cache.waitForWrites()
        }
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: .max, memoryBytes: .max)
        #expect(cache.response(for: storedResponse("/feed").key)?.body == Data("body".utf8))
    }

    @Test func clearAndInvalidateRemoveFromMemoryAndDisk() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let feed = storedResponse("/feed"), item = storedResponse("/items/1"), other = storedResponse("/items/2")
        for response in [feed, item, other] { cache.store(response) }
        await cache.waitForWrites()
        let removed = cache.invalidate { method, url in method == .get && url.path.hasPrefix("/items/") }
        #expect(removed == 2)
        #expect(cache.response(for: item.key) == nil && cache.response(for: other.key) == nil)
        #expect(cacheFiles(directory) == [feed.key.hex + ".rc"])
        cache.store(item)
        try cache.clear()  // also the write still in flight
        await cache.waitForWrites()
        #expect(cache.count == 0)
        #expect(cache.response(for: feed.key) == nil && cache.response(for: item.key) == nil)
        #expect(cacheFiles(directory).isEmpty)
    }

    @Test func removeDeletesOneURLsResponsesAndNothingElse() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let feed = storedResponse("/feed"), item = storedResponse("/items/1")
        for response in [feed, item] { cache.store(response) }
        await cache.waitForWrites()
        #expect(cache.remove(url: try #require(URL(string: "https://example.test/items/1"))) == 1)
        #expect(cache.remove(method: .head, url: try #require(URL(string: "https://example.test/feed"))) == 0)
        #expect(cache.response(for: item.key) == nil && cache.response(for: feed.key) == feed)
        #expect(cacheFiles(directory) == [feed.key.hex + ".rc"])
    }

    @Test func aSecondCacheOnTheSameFolderIsRefused() throws {
        let directory = TemporaryDirectory()
        let first = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(throws: ResponseCacheError.folderInUse(path: directory.url.path)) {
            try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        }
        #expect(first.count == 0)
    }

    /// A folder that cannot be created because the file system has no inode left says so
    /// (`ENOSPC`, on the first folder it could not create), not `EACCES`.
    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func aCacheFolderThatCannotBeCreatedForWantOfInodesIsADiskFullError() throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 1024, inodes: 8))
        defer { mounted.unmount() }
        #expect(mounted.useUpInodes() > 0)
        let caches = mountPoint.url.appendingPathComponent("Caches")
        #expect(throws: ResponseCacheError.storage(operation: "mkdir", path: caches.path, errno: ENOSPC)) {
            try DiskResponseCache(directory: caches.appendingPathComponent("Resilience/Responses"), maxBytes: 1 << 20)
        }
    }

    @Test(.enabled(if: SmallFileSystem.isAvailable, "cannot mount a tmpfs here (needs Linux, root and mount(2))"))
    func aFullDiskFailsTheWriteNotTheReadAndIsCounted() async throws {
        let mountPoint = TemporaryDirectory()
        try FileManager.default.createDirectory(at: mountPoint.url, withIntermediateDirectories: true)
        let mounted = try #require(SmallFileSystem(at: mountPoint.url.path, kilobytes: 64))
        defer { mounted.unmount() }
        let cache = try DiskResponseCache(directory: mountPoint.url.appendingPathComponent("cache"), maxBytes: 10 << 20, memoryBytes: 0)
        _ = mounted.fill()
        let response = storedResponse("/feed", body: String(repeating: "a", count: 8_000))
        cache.store(response)
        await cache.waitForWrites()
        #expect(cache.statistics.storeFailures == 1)
        if case .storage(_, _, let code)? = cache.statistics.lastStoreFailure {
            #expect(code == ENOSPC)
        } else {
            Issue.record("no store failure recorded")
        }
        #expect(cache.count == 0)
    }

    /// A file the disk refuses to delete (a non-empty directory stands in its name: `unlink`
    /// fails with `EISDIR`) is counted and never served; once the disk lets it, it goes — after
    /// the next file written, or before the next note is recorded — so a relaunch does not read
    /// back a response the cache had removed.
    @Test(arguments: ["after a file written", "before a note recorded"])
    func aFileTheDiskRefusedToDeleteGoesOnceItCan(retry: String) async throws {
        let directory = TemporaryDirectory()
        let removed = storedResponse("/feed", body: "before the write")
        let file = directory.url.appendingPathComponent(removed.key.hex + ".rc")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            cache.store(removed)
            await cache.waitForWrites()
            let bytes = try Data(contentsOf: file)
            try FileManager.default.removeItem(at: file)
            try FileManager.default.createDirectory(at: file, withIntermediateDirectories: false)
            try Data("x".utf8).write(to: file.appendingPathComponent("x"))
            cache.remove([removed.key])
            #expect(cache.statistics.undeletedFiles == 1 && cache.count == 0)
            #expect(cache.response(for: removed.key) == nil)
            // The disk lets go again, the old file still in place.
            try FileManager.default.removeItem(at: file)
            try bytes.write(to: file)
            if retry == "after a file written" {
                cache.store(storedResponse("/other"))
                await cache.waitForWrites()
            } else {
                #expect(await cache.annotate(where: { _, _ in true }, { $0 }) == 0)
            }
            #expect(cache.statistics.undeletedFiles == 0)
        }
        #expect(!FileManager.default.fileExists(atPath: file.path))
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(reopened.response(for: removed.key) == nil)
    }
}
