import Foundation
import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

/// Marking stale without rewriting the responses' files (issue 49): the marks live in memory and
/// in one small file, `stale-marks`, and behave as the flag in each file did.
@Suite("DiskResponseCache: stale marks in one file, not in each response's", .timeLimit(.minutes(1)))
struct StaleMarksTests {
    private func fileBytes(_ directory: TemporaryDirectory, _ response: StoredResponse) throws -> Data {
        try Data(contentsOf: directory.url.appendingPathComponent(response.key.hex + ".rc"))
    }

    private var marksPath: (TemporaryDirectory) -> String { { $0.url.appendingPathComponent("stale-marks").path } }

    /// A cache on `directory` with `responses` stored and written.
    private func cache(storing responses: [StoredResponse], in directory: TemporaryDirectory) async throws -> DiskResponseCache {
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        for response in responses { cache.store(response) }
        await cache.waitForWrites()
        return cache
    }

    @Test func aMarkingRewritesNoResponseFileAndSurvivesAKilledProcess() async throws {
        let directory = TemporaryDirectory()
        let responses = (0..<20).map { storedResponse("/items/\($0)") }
        var before: [Data] = []
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
            for response in responses { cache.store(response) }
            await cache.waitForWrites()
            before = try responses.map { try fileBytes(directory, $0) }
            let stored = cache.statistics.stored
            #expect(cache.markStale { _, url in url.path.hasSuffix("/3") || url.path.hasSuffix("/7") } == 2)
            #expect(cache.response(for: responses[3].key)?.isInvalidated == true)
            #expect(cache.response(for: responses[4].key)?.isInvalidated == false)
            await cache.waitForWrites()
            #expect(cache.statistics.stored == stored)  // no file written again
            #expect(try responses.map { try fileBytes(directory, $0) } == before)
            #expect(FileManager.default.fileExists(atPath: marksPath(directory)))
            // No close(): the process "dies" with the cache (deinit only lets the folder go).
        }
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
        let stale = responses.indices.filter { reopened.response(for: responses[$0].key)?.isInvalidated == true }
        #expect(stale == [3, 7])
    }

    @Test func markingAllOfFiveThousandIsOneSmallFileAndEveryOneReadsStale() async throws {
        let directory = TemporaryDirectory()
        let responses = (0..<5_000).map { storedResponse("/list/\($0)") }
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 64 << 20, memoryBytes: 0)
        for response in responses { cache.store(response) }
        await cache.waitForWrites()
        let stored = cache.statistics.stored
        #expect(cache.markStale { method, url in method == .get && url.path.hasPrefix("/list/") } == 5_000)
        await cache.waitForWrites()
        #expect(cache.statistics.stored == stored)
        let size = try FileManager.default.attributesOfItem(atPath: marksPath(directory))[.size] as? NSNumber
        #expect(size?.intValue == StaleMarksFile.headerSize + 5_000 * StaleMarksFile.recordSize)
        await cache.close()
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 64 << 20, memoryBytes: 0)
        #expect(responses.allSatisfy { reopened.response(for: $0.key)?.isInvalidated == true })
    }

    @Test func aResponseStoredAgainEndsItsMarkAndCloseWritesThatDown() async throws {
        let directory = TemporaryDirectory()
        let feed = storedResponse("/feed", body: "old"), other = storedResponse("/other")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            cache.store(feed)
            cache.store(other)
            await cache.waitForWrites()
            #expect(cache.markStale { _, _ in true } == 2)
            cache.store(storedResponse("/feed", body: "revalidated"))  // a 200 or a 304, say
            #expect(cache.response(for: feed.key)?.isInvalidated == false)
            await cache.waitForWrites()
            await cache.close()
        }
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let read = try #require(reopened.response(for: feed.key))
        #expect(read.body == Data("revalidated".utf8) && !read.isInvalidated)
        #expect(reopened.response(for: other.key)?.isInvalidated == true)
    }

    @Test func afterAKillAResponseStoredAgainSinceTheLastMarkingIsAtWorstRevalidatedOnceMore() async throws {
        let directory = TemporaryDirectory()
        let feed = storedResponse("/feed", body: "old")
        do {
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            cache.store(feed)
            await cache.waitForWrites()
            cache.markStale([feed.primaryKey])
            cache.store(storedResponse("/feed", body: "revalidated"))
            await cache.waitForWrites()
        }
        // The marks file still lists it (only the next marking, many ended marks or close() rewrite
        // it): stale, so revalidated once more — never the other way round.
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let read = try #require(reopened.response(for: feed.key))
        #expect(read.body == Data("revalidated".utf8) && read.isInvalidated)
    }

    @Test func aMarkingBetweenAnUpdatesReadAndItsStoreOvertakesTheUpdate() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let feed = storedResponse("/feed")
        cache.store(feed)
        let outcome = cache.update(feed.key) { current in
            cache.markStale([feed.primaryKey])  // a delivered write, while a 304 was being applied
            var refreshed = current
            refreshed.isInvalidated = false
            return refreshed
        }
        #expect(outcome == .overtaken)
        #expect(cache.response(for: feed.key)?.isInvalidated == true)
    }

    @Test func aDamagedMarksFileMarksEveryResponseStale() async throws {
        let directory = TemporaryDirectory()
        let responses = (0..<3).map { storedResponse("/\($0)") }
        do {
            let cache = try await cache(storing: responses, in: directory)
            cache.markStale([responses[0].primaryKey])
            await cache.close()
        }
        var bytes = try Data(contentsOf: URL(fileURLWithPath: marksPath(directory)))
        bytes[bytes.count - 1] ^= 0xFF
        try bytes.write(to: URL(fileURLWithPath: marksPath(directory)))
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(responses.allSatisfy { reopened.response(for: $0.key)?.isInvalidated == true })
        // The file was written afresh at the open, so this marking appends to a sound file.
        reopened.markStale([responses[1].primaryKey])
        let rewritten = try Data(contentsOf: URL(fileURLWithPath: marksPath(directory)))
        guard case .keys(let keys, cut: false) = rewritten.withUnsafeBytes({ StaleMarksFile.decode($0) }) else {
            Issue.record("the marks file was not written afresh")
            return
        }
        #expect(Set(keys) == Set(responses.map(\.key)))
    }

    @Test func anAppendCutByAPowerLossLosesOnlyItselfAndTheFileIsWrittenAfresh() async throws {
        let directory = TemporaryDirectory()
        let responses = (0..<3).map { storedResponse("/\($0)") }
        do {
            let cache = try await cache(storing: responses, in: directory)
            cache.markStale([responses[0].primaryKey])
            cache.markStale([responses[1].primaryKey])  // appended
            await cache.waitForWrites()
        }
        // The second append, cut: only part of its record reached the disk.
        let url = URL(fileURLWithPath: marksPath(directory))
        let bytes = try Data(contentsOf: url)
        #expect(bytes.count == StaleMarksFile.headerSize + 2 * StaleMarksFile.recordSize)
        try bytes.prefix(bytes.count - 7).write(to: url)
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(responses.map { reopened.response(for: $0.key)?.isInvalidated } == [true, false, false])
        #expect(try Data(contentsOf: url).count == StaleMarksFile.headerSize + StaleMarksFile.recordSize)  // afresh, whole
        reopened.markStale([responses[2].primaryKey])
        await reopened.close()
        let again = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(responses.map { again.response(for: $0.key)?.isInvalidated } == [true, false, true])
    }

    @Test func theMarksFileIsRewrittenWhenMostOfItsRecordsNoLongerHold() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 16 << 20)
        let responses = (0..<600).map { storedResponse("/items/\($0)") }
        for response in responses { cache.store(response) }
        await cache.waitForWrites()
        let url = URL(fileURLWithPath: marksPath(directory))
        // Each round marks all 600 and then stores them again (revalidated): the marks end, the
        // records stay until the file holds more than twice the marks that hold (1 024 at least).
        for _ in 0..<3 {
            #expect(cache.markStale { _, url in url.path.hasPrefix("/items/") } == 600)
            for response in responses { cache.store(response) }
            await cache.waitForWrites()
        }
        // 1 800 appended; never more than twice the 600 that held at an append (the third round's
        // append is rewritten at once unless a background rewrite shrank the file before it). A
        // background rewrite after the last stores, when no mark holds, removes it: no records.
        let size = (try? Data(contentsOf: url))?.count ?? 0
        #expect(size <= StaleMarksFile.headerSize + 1_200 * StaleMarksFile.recordSize)
        #expect(responses.allSatisfy { cache.response(for: $0.key)?.isInvalidated == false })
        // No mark holds any more: close() leaves no marks file behind.
        await cache.close()
        #expect(!FileManager.default.fileExists(atPath: url.path))
    }

    @Test func whenTheMarksFileCannotBeWrittenTheMatchesAreRemovedNotLeftFresh() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let feed = storedResponse("/feed"), other = storedResponse("/other")
        cache.store(feed)
        cache.store(other)
        await cache.waitForWrites()
        // A folder where the marks file's temp file goes: its O_EXCL create fails.
        try FileManager.default.createDirectory(at: directory.url.appendingPathComponent(".stale-marks.tmp"), withIntermediateDirectories: false)
        #expect(cache.markStale { _, url in url.path == "/feed" } == 1)
        #expect(cache.response(for: feed.key) == nil)
        #expect(cache.response(for: other.key)?.isInvalidated == false)
        #expect(cache.statistics.storeFailures == 1)
        #expect(cache.statistics.lastStoreFailure?.isStorage(operation: "create") == true)
        await cache.waitForWrites()
        #expect(!directory.fileNames.contains(feed.key.hex + ".rc"))
    }

    @Test func clearRemovesTheMarksFile() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let feed = storedResponse("/feed")
        cache.store(feed)
        await cache.waitForWrites()
        cache.markStale([feed.primaryKey])
        #expect(FileManager.default.fileExists(atPath: marksPath(directory)))
        try cache.clear()
        #expect(!FileManager.default.fileExists(atPath: marksPath(directory)))
        cache.store(feed)
        #expect(cache.response(for: feed.key)?.isInvalidated == false)
    }

    @Test func aClosedCacheMarksOnlyInMemoryAndNeverWritesToTheNextUsersFolder() async throws {
        let directory = TemporaryDirectory()
        let feed = storedResponse("/feed")
        let first = try await cache(storing: [feed], in: directory)
        await first.close()
        let next = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)  // a user switch
        #expect(first.markStale { _, _ in true } == 1)  // the closed cache still holds it in memory
        #expect(!FileManager.default.fileExists(atPath: marksPath(directory)))
        #expect(next.response(for: feed.key)?.isInvalidated == false)
    }

    @Test func theMarksFileFormatRoundTripsReadsACutTailAndRejectsAFlippedByte() {
        let keys = (0..<5).map { CacheDigest("key \($0)") }
        var data = StaleMarksFile.encode(keys.prefix(3))
        data += StaleMarksFile.records(keys.suffix(2))  // an append
        #expect(data.withUnsafeBytes { StaleMarksFile.decode($0) } == .keys(keys, cut: false))
        for length in 0..<data.count {
            let whole = max(0, length - StaleMarksFile.headerSize) / StaleMarksFile.recordSize
            let expected: StaleMarksFile.Contents =
                length < StaleMarksFile.headerSize
                ? .damaged : .keys(Array(keys.prefix(whole)), cut: (length - StaleMarksFile.headerSize) % StaleMarksFile.recordSize != 0)
            #expect(data.prefix(length).withUnsafeBytes { StaleMarksFile.decode($0) } == expected, "length \(length)")
        }
        for position in 0..<data.count {
            var flipped = data
            flipped[position] ^= 0x01
            #expect(flipped.withUnsafeBytes { StaleMarksFile.decode($0) } == .damaged, "byte \(position)")
        }
        #expect(StaleMarksFile.encode([]).withUnsafeBytes { StaleMarksFile.decode($0) } == .keys([], cut: false))
    }
}

extension ResponseCacheError {
    fileprivate func isStorage(operation expected: String) -> Bool {
        if case .storage(let operation, _, _) = self { return operation == expected }
        return false
    }
}

/// The cache index's table of stored URLs (what marking rules run on) against a model.
@Suite("CacheIndex: the stored URLs' table")
struct CacheIndexURLTests {
    @Test func theURLTableMatchesAModelUnderRandomInsertsAndRemovals() {
        var generator = SeededGenerator(seed: 49)
        var index = CacheIndex()
        var model: [CacheDigest: CacheIndex.StoredURL] = [:]
        for step in 0..<4_000 {
            if step == 500 { index.indexURLs() }  // built late: from what is there, then kept
            let key = CacheDigest("k\(Int.random(in: 0..<60, using: &generator))")
            if Bool.random(using: &generator) {
                // Six URLs, two methods: many keys share a URL (query or Vary variants).
                let url = CacheIndex.StoredURL(
                    method: Bool.random(using: &generator) ? "GET" : "HEAD", url: "https://example.test/list\(Int.random(in: 0..<6, using: &generator))")
                index.insert(StoredResponseSummary(key: key, primaryKey: key, method: url.method, url: url.url, partition: nil, storedAt: Date()), size: 1)
                model[key] = url
            } else {
                index.remove(key)
                model[key] = nil
            }
            guard index.indexesURLs else { continue }
            var expected: [CacheIndex.StoredURL: Set<CacheDigest>] = [:]
            for (key, url) in model { expected[url, default: []].insert(key) }
            var actual: [CacheIndex.StoredURL: Set<CacheDigest>] = [:]
            for (url, entry) in index.urls {
                var keys = Set<CacheDigest>()
                entry.keys.forEach { keys.insert($0) }
                if case .many(let set) = entry.keys { #expect(set.count > 1, "a set of one at step \(step)") }
                actual[url] = keys
            }
            #expect(actual == expected, "step \(step)")
            if actual != expected { return }
        }
    }
}
