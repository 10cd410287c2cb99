import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

/// Legal responses the file format cannot hold (a very long URL, a very long `Vary` list, a
/// header value over 1 MiB, more than 10 000 header fields): the limits the reader enforces are
/// enforced before storing, so such a response is returned to its caller and not stored — never
/// served in one launch and found "corrupt" in the next.
@Suite("ResponseCache: nothing is stored that cannot be read back", .timeLimit(.minutes(1)))
struct FormatLimitTests {
    /// The four shapes, each just past its limit, as `(name, path, headers)`.
    static let oddResponses: [(name: String, path: String, headers: [String: String])] = {
        let longVary = (0...CacheFileFormat.maximumVaryNames).map { "x-vary-\($0)" }.joined(separator: ", ")
        var manyHeaders = ["Cache-Control": "max-age=60"]
        for number in 0..<CacheFileFormat.maximumHeaderCount { manyHeaders["X-Field-\(number)"] = "v" }
        return [
            ("a very long URL", "/" + String(repeating: "p", count: CacheFileFormat.maximumSummaryLength), ["Cache-Control": "max-age=60"]),
            ("a very long Vary list", "/vary", ["Cache-Control": "max-age=60", "Vary": longVary]),
            ("a header value over 1 MiB", "/big", ["Cache-Control": "max-age=60", "X-Big": String(repeating: "b", count: CacheFileFormat.maximumDetailLength)]),
            ("more than 10 000 header fields", "/many", manyHeaders),
        ]
    }()

    @Test(arguments: 0..<4)
    func aResponseBeyondTheFormatsLimitsIsReturnedNotStoredAndNothingIsCorruptAfterAReopen(_ which: Int) async throws {
        let (name, path, headers) = Self.oddResponses[which]
        let directory = TemporaryDirectory()
        do {
            let h = try CacheHarness([.ok("first", headers: headers), .ok("second", headers: headers)], cache: DiskResponseCache(directory: directory.url, maxBytes: 16 << 20))
            let first = try await h.engine.response(for: Read(path), mode: .online, staleTime: .http)
            let second = try await h.engine.response(for: Read(path), mode: .online, staleTime: .http)
            await h.cache.waitForWrites()
            // The caller got each response; neither was kept, and the cache says why.
            #expect(h.body(first) == "first" && first.source == .network, "\(name)")
            #expect(h.body(second) == "second" && second.source == .network, "\(name)")
            #expect(h.cache.count == 0 && h.cache.statistics.stored == 0, "\(name)")
            #expect(h.cache.statistics.beyondFormatLimits == 2, "\(name)")
        }
        let reopened = try DiskResponseCache(directory: directory.url, maxBytes: 16 << 20)
        #expect(reopened.statistics.corruptRemoved == 0 && reopened.count == 0, "\(name)")
    }

    @Test func theFormatRefusesExactlyWhatTheReaderWouldRefuse() throws {
        let base = storedResponse("/feed")
        var atLimits = base
        atLimits.varyNames = (0..<CacheFileFormat.maximumVaryNames).map { "v\($0)" }
        for number in 0..<(CacheFileFormat.maximumHeaderCount - 1) { atLimits.headers["h\(number)"] = "" }
        // At every count limit: written and read back as it was.
        #expect(try CacheFileFormat.decode(try CacheFileFormat.encode(atLimits)) == atLimits)
        var tooManyHeaders = atLimits
        tooManyHeaders.headers["one-more"] = "x"
        tooManyHeaders.headers["and-another"] = "x"
        #expect(throws: CacheFileFormat.Unstorable.tooManyHeaders) { try CacheFileFormat.encode(tooManyHeaders) }
        var tooManyVaryNames = base
        tooManyVaryNames.varyNames = (0...CacheFileFormat.maximumVaryNames).map { "v\($0)" }
        #expect(throws: CacheFileFormat.Unstorable.tooManyVaryNames) { try CacheFileFormat.encode(tooManyVaryNames) }
        var longURL = base
        longURL.url = "https://example.test/" + String(repeating: "u", count: CacheFileFormat.maximumSummaryLength)
        #expect(throws: CacheFileFormat.Unstorable.summaryTooLong) { try CacheFileFormat.encode(longURL) }
        var bigHeader = base
        bigHeader.headers["X-Big"] = String(repeating: "b", count: CacheFileFormat.maximumDetailLength)
        #expect(throws: CacheFileFormat.Unstorable.detailTooLong) { try CacheFileFormat.encode(bigHeader) }
        var oddStatus = base
        oddStatus.statusCode = 70_000
        #expect(throws: CacheFileFormat.Unstorable.fieldOutOfRange) { try CacheFileFormat.encode(oddStatus) }
        var infiniteAge = base
        infiniteAge.initialAge = .infinity
        #expect(throws: CacheFileFormat.Unstorable.fieldOutOfRange) { try CacheFileFormat.encode(infiniteAge) }
    }
}
