import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

/// `DiskResponseCache.close()`: the folder is free at once (a user switch opens it without
/// `folderInUse`), every response stored before is in its file, nothing is read or written after.
@Suite("Closing a response cache: the folder is free at once, nothing written after", .timeLimit(.minutes(1)))
struct CacheCloseTests {
    @Test func aClosedCacheLetsAnotherOpenTheFolderAtOnceWithEveryStoredResponse() async throws {
        let directory = TemporaryDirectory()
        let first = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
        let feed = storedResponse("/feed", body: "[1]"), item = storedResponse("/items/1")
        first.store(feed)
        first.store(item)  // not waited for: close finishes the writes
        #expect(throws: ResponseCacheError.folderInUse(path: directory.url.path)) {
            try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        }
        await first.close()
        #expect(first.isClosed)
        let second = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(second.count == 2 && second.response(for: feed.key) == feed && second.response(for: item.key) == item)
        // The closed cache reads no file, stores nothing, clears nothing.
        #expect(first.response(for: feed.key) == nil)
        #expect(first.store(storedResponse("/late")) == .refused)
        #expect(throws: ResponseCacheError.closed) { try first.clear() }
        await first.close()  // twice is once
        #expect(second.count == 2 && directory.fileNames.filter { $0.hasSuffix(".rc") }.count == 2)
    }

    /// A `clear()` at log-out racing `close()`: either it was refused (`closed`) or it deleted
    /// every file — never half a clear whose responses the next user's cache would read back.
    @Test func aClearRacingCloseEitherDeletesEveryFileOrIsRefused() async throws {
        var generator = SplitMix64(seed: 46)
        var cleared = 0
        for round in 0..<40 {
            let directory = TemporaryDirectory()
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
            for index in 0..<8 { cache.store(storedResponse("/r/\(round)/\(index)")) }
            await cache.waitForWrites()
            let yields = Int.random(in: 0..<8, using: &generator)
            async let closing: Void = cache.close()
            for _ in 0..<yields { await Task.yield() }
            let clearing = Result { try cache.clear() }
            await closing
            let next = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
            switch clearing {
            case .success:
                cleared += 1
                #expect(next.count == 0, "round \(round)")
            case .failure(let error):
                #expect(error as? ResponseCacheError == .closed && next.count == 8, "round \(round)")
            }
        }
        #expect(cleared > 0 && cleared < 40, "cleared in \(cleared) of 40 rounds")
    }

    /// Stores racing `close()`: what the next owner finds when `close()` returns is exactly what
    /// was stored before it (every write finished), and no file appears after.
    @Test func storesRacingCloseAreAllInTheFolderWhenItIsFree() async throws {
        var generator = SplitMix64(seed: 45)
        var outcomes: [Int] = []
        for round in 0..<40 {
            let directory = TemporaryDirectory()
            let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
            let responses = (0..<16).map { storedResponse("/r/\(round)/\($0)") }
            let stored = Log<CacheDigest>()
            let yields = Int.random(in: 0..<16, using: &generator)
            let delays = responses.map { _ in Int.random(in: 0..<64, using: &generator) }
            let found = await withTaskGroup(of: Set<CacheDigest>?.self) { group in
                group.addTask {
                    for _ in 0..<yields { await Task.yield() }
                    await cache.close()
                    let next = try? DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
                    return Set(responses.map(\.key).filter { next?.response(for: $0) != nil })
                }
                for (response, delay) in zip(responses, delays) {
                    group.addTask {
                        for _ in 0..<delay { await Task.yield() }
                        if case .queued = cache.store(response) { stored.append(response.key) }
                        return nil
                    }
                }
                var found: Set<CacheDigest> = []
                for await result in group { if let result { found = result } }
                return found
            }
            #expect(found == Set(stored.values), "round \(round)")
            #expect(directory.fileNames.filter { $0.hasSuffix(".rc") }.count == stored.values.count, "round \(round)")
            outcomes.append(stored.values.count)
        }
        #expect(outcomes.contains { $0 < 16 }, "\(outcomes)")
    }
}
