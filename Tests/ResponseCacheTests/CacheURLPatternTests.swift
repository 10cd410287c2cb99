import Foundation
import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

/// `markStale(matching:)`: rules the cache answers from its index of stored paths (issue 49), the
/// same as `markStale(where:)` with the pattern's own test, without running code per stored URL.
@Suite("DiskResponseCache: markStale(matching:) from the index of stored paths", .timeLimit(.minutes(1)))
struct CacheURLPatternTests {
    @Test func aStoredURLIsReadAsItsHostAndNormalizedPath() {
        let parts = StoredURLParts("https://user@API.Example.test:8443/items/42/?page#top")
        #expect(parts.host == "api.example.test")
        #expect(parts.path == "/items/42")
        #expect(StoredURLParts("https://example.test").path == "/")
        #expect(StoredURLParts("https://example.test?q").path == "/")
        #expect(StoredURLParts("https://[::1]:8080/a").host == "[::1]")
        #expect(StoredURLParts("https://example.test/a/b").enclosingPaths == ["/", "/a", "/a/b"])
        #expect(StoredURLParts("https://example.test/").enclosingPaths == ["/"])
    }

    @Test func aPrefixCoversItsPathAndWhatIsUnderItOnSegmentBoundaries() throws {
        let notes = CacheURLPattern.pathPrefix("/notes/")
        #expect(notes.path == "/notes")
        for (url, expected) in [
            ("https://h.test/notes", true), ("https://h.test/notes/", true), ("https://h.test/notes/42?x", true),
            ("https://h.test/notes/42/tags", true), ("https://h.test/notesX", false), ("https://h.test/note", false), ("https://h.test/", false),
        ] {
            #expect(notes.matches(try #require(URL(string: url))) == expected, "\(url)")
        }
        let exact = CacheURLPattern.path("/notes")
        #expect(exact.matches(try #require(URL(string: "https://h.test/notes/?q"))))
        #expect(!exact.matches(try #require(URL(string: "https://h.test/notes/1"))))
        let everything = CacheURLPattern.pathPrefix("/")
        #expect(everything.matches(try #require(URL(string: "https://h.test/"))))
        #expect(everything.matches(try #require(URL(string: "https://h.test/a/b"))))
        let onHost = CacheURLPattern.pathPrefix("/a", host: "H.test")
        #expect(onHost.matches(try #require(URL(string: "https://h.TEST:444/a/1"))))
        #expect(!onHost.matches(try #require(URL(string: "https://other.test/a/1"))))
    }

    @Test func aMarkingByPatternMarksWhatTheSameRuleAsAClosureWouldAndSurvivesAReopen() async throws {
        let paths = ["/notes", "/notes/1", "/notes/1/tags", "/notes/2", "/notesX", "/me", "/list?page", "/", "/other/notes"]
        let patterns: [[CacheURLPattern]] = [
            [.pathPrefix("/notes")], [.path("/notes")], [.path("/me"), .pathPrefix("/notes/1")], [.pathPrefix("/")], [.path("/list")],
            [.pathPrefix("/notes", host: "elsewhere.test")], [.path("/missing")],
        ]
        for rule in patterns {
            let byIndex = TemporaryDirectory(), byClosure = TemporaryDirectory()
            let responses = paths.map { storedResponse($0) }
            let indexed = try DiskResponseCache(directory: byIndex.url, maxBytes: 1 << 20)
            let scanned = try DiskResponseCache(directory: byClosure.url, maxBytes: 1 << 20)
            for response in responses {
                indexed.store(response)
                scanned.store(response)
            }
            await indexed.waitForWrites()
            await scanned.waitForWrites()
            let count = indexed.markStale(matching: rule)
            #expect(count == scanned.markStale { _, url in rule.contains { $0.matches(url) } }, "\(rule)")
            let stale = responses.filter { indexed.response(for: $0.key)?.isInvalidated == true }.map(\.url)
            #expect(stale == responses.filter { scanned.response(for: $0.key)?.isInvalidated == true }.map(\.url), "\(rule)")
            #expect(stale.count == count)
            await indexed.close()
            let reopened = try DiskResponseCache(directory: byIndex.url, maxBytes: 1 << 20)
            #expect(responses.filter { reopened.response(for: $0.key)?.isInvalidated == true }.map(\.url) == stale, "\(rule)")
        }
    }

    @Test func theIndexFollowsWhatIsStoredAndRemovedAfterTheFirstMarking() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        cache.store(storedResponse("/notes/1"))
        await cache.waitForWrites()
        #expect(cache.markStale(matching: [.pathPrefix("/notes")]) == 1)  // builds the index
        cache.store(storedResponse("/notes/2"))
        cache.store(storedResponse("/notes/3"))
        await cache.waitForWrites()
        #expect(cache.remove(url: try #require(URL(string: "https://example.test/notes/1"))) == 1)
        #expect(cache.markStale(matching: [.pathPrefix("/notes")]) == 2)
        #expect(cache.markStale(matching: [.path("/notes/1")]) == 0)
        #expect(cache.markStale(matching: []) == 0)
    }

    @Test func preparingBuildsThePathTablesWithoutAMarkingAndChangesMeanwhileAreKept() async throws {
        let directory = TemporaryDirectory()
        let first = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        let responses = (0..<50).map { storedResponse("/notes/\($0)") }
        for response in responses { first.store(response) }
        await first.waitForWrites()
        await first.close()

        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20)
        #expect(!reopened.indexesStoredPaths)  // not unasked: they take memory
        reopened.prepareMarkingByPattern()
        // Whether or not the build has run yet, changes made now are in the tables.
        #expect(reopened.remove(url: try #require(URL(string: "https://example.test/notes/0"))) == 1)
        reopened.store(storedResponse("/notes/new"))
        await reopened.pathsIndexed()
        #expect(reopened.indexesStoredPaths)
        #expect(reopened.markStale(matching: [.pathPrefix("/notes")]) == 50)
        #expect(reopened.markStale(matching: [.path("/notes/0")]) == 0)
        #expect(reopened.markStale(matching: [.path("/notes/new")]) == 1)
    }

    @Test func aResponseWaitingToBeWrittenIsReachedToo() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 20, memoryBytes: 0)
        let response = storedResponse("/notes/9")
        cache.store(response)  // not waited for: it may still be pending
        #expect(cache.markStale(matching: [.pathPrefix("/notes")]) == 1)
        #expect(cache.response(for: response.key)?.isInvalidated == true)
        await cache.waitForWrites()
        #expect(cache.response(for: response.key)?.isInvalidated == true)
    }
}

@Suite("CacheIndex: the stored paths' tables")
struct CacheIndexPathTests {
    /// Built late, from what is there, then kept: by the index itself, or (as a cache does after
    /// `prepareMarkingByPattern()`) from a copy of its URLs, installed 300 changes later.
    @Test(arguments: [false, true])
    func thePathTablesMatchAModelUnderRandomInsertsAndRemovals(builtFromACopy: Bool) {
        var generator = SeededGenerator(seed: 4_949)
        var index = CacheIndex()
        var model: [CacheDigest: CacheIndex.StoredURL] = [:]
        let paths = ["/", "/a", "/a/1", "/a/1/x", "/a/2", "/aa", "/b/1", "/b/1?q"]
        let patterns: [CacheURLPattern] = paths.flatMap { [.path($0), .pathPrefix($0)] } + [.pathPrefix("/a", host: "other.test")]
        var parts: [String: StoredURLParts] = [:]
        var copy: CacheIndex.PathTables?
        for step in 0..<2_000 {
            if step == 400 {
                index.indexURLs()
                if builtFromACopy { copy = CacheIndex.PathTables(index.urls.keys) } else { index.indexPaths() }
            }
            if step == 700, let copy { index.install(copy) }
            let key = CacheDigest("k\(Int.random(in: 0..<40, using: &generator))")
            if Bool.random(using: &generator) {
                let host = Bool.random(using: &generator) ? "example.test" : "other.test"
                let url = CacheIndex.StoredURL(method: "GET", url: "https://\(host)" + paths.randomElement(using: &generator)!)
                parts[url.url] = StoredURLParts(url.url)
                index.insert(StoredResponseSummary(key: key, primaryKey: key, method: url.method, url: url.url, partition: nil, storedAt: Date()), size: 1)
                model[key] = url
            } else {
                index.remove(key)
                model[key] = nil
            }
            guard index.indexesPaths else { continue }
            for pattern in patterns {
                let expected = Set(model.values.filter { pattern.matches(parts[$0.url]!) })
                let actual = Set(index.urls(matching: pattern))
                #expect(actual == expected, "step \(step), \(pattern)")
                if actual != expected { return }
            }
        }
    }
}
