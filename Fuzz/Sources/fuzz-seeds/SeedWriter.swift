import Foundation

@testable import OfflineQueue
@testable import ResponseCache

/// Writes the seed corpora (`Corpus/<target>/`): small, real examples of what each parser reads,
/// the same bytes on every run. `swift run --package-path Fuzz fuzz-seeds Fuzz/Corpus` rewrites them.
@main
enum SeedWriter {
    static func main() throws {
        let root = URL(fileURLWithPath: CommandLine.arguments.dropFirst().first ?? "Corpus")
        try write(queueEntries(), to: root.appendingPathComponent("queue-entry"))
        try write(cacheFiles(), to: root.appendingPathComponent("cache-file"))
        try write(staleMarks(), to: root.appendingPathComponent("stale-marks"))
        try write(cacheHeaders.map { Data($0.utf8) }, to: root.appendingPathComponent("cache-headers"))
        try write(httpDates.map { Data($0.utf8) }, to: root.appendingPathComponent("http-date"))
        try write(loopbackRequests.map { Data([$0.mode]) + Data($0.bytes.utf8) }, to: root.appendingPathComponent("loopback-request"))
    }

    /// Replaces the folder's seeds with `seeds`, named `seed-NN`.
    static func write(_ seeds: [Data], to folder: URL) throws {
        try? FileManager.default.removeItem(at: folder)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        for (index, seed) in seeds.enumerated() {
            try seed.write(to: folder.appendingPathComponent(String(format: "seed-%02d", index)))
        }
        print("\(folder.lastPathComponent): \(seeds.count) seeds, \(seeds.reduce(0) { $0 + $1.count }) bytes")
    }

    // MARK: - The cache's stale marks

    /// A file of no marks, of three, one an append cut short, and one with a record damaged.
    static func staleMarks() -> [Data] {
        let keys = ["GET\nhttps://example.test/a\n", "GET\nhttps://example.test/list?page\n", "HEAD\nhttps://example.test/a\n"].map { CacheDigest($0) }
        let three = StaleMarksFile.encode(keys)
        var damaged = three
        damaged[StaleMarksFile.headerSize + 3] ^= 0xFF
        return [StaleMarksFile.encode([CacheDigest]()), three, three + StaleMarksFile.records(keys.prefix(1)).prefix(11), damaged]
    }

    // MARK: - Queue entry files

    static func queueEntries() throws -> [Data] {
        func entry(
            _ id: String, url: String = "https://api.example.test/orders", method: String = "POST", headers: [String: String] = [:],
            body: Data? = nil, timeout: Double = 30, ttl: Double = 86_400, priority: Int = 0, orderingKey: String? = nil,
            coalescingKey: String? = nil, sequence: UInt64 = 1, attempts: Int = 0, nextAttemptAt: Date? = nil, lastError: String? = nil,
            revision: Int = 0, maximumResponseBodySize: Int? = nil, deadlineSeconds: Double? = nil
        ) -> QueueEntry {
            QueueEntry(
                id: UUID(uuidString: id)!, url: URL(string: url)!, method: method, headers: headers, body: body, timeout: timeout,
                enqueuedAt: Date(timeIntervalSinceReferenceDate: 760_000_000.25), ttl: ttl, priority: priority,
                idempotencyKey: "8C1D4F3A-0B6E-4F7A-9D2C-5E8B1A3F6C9D", orderingKey: orderingKey, coalescingKey: coalescingKey,
                sequence: sequence, attempts: attempts, nextAttemptAt: nextAttemptAt, lastError: lastError, revision: revision,
                formatVersion: 1, maximumResponseBodySize: maximumResponseBodySize, deadlineSeconds: deadlineSeconds)
        }
        let entries = [
            entry("00000000-0000-0000-0000-000000000001"),
            entry(
                "6F9619FF-8B86-D011-B42D-00C04FC964FF", headers: ["Content-Type": "application/json", "Accept": "*/*"],
                body: Data(#"{"item":42,"note":"caf\u00e9 \"x\""}"#.utf8), priority: 2, orderingKey: "cart/7", coalescingKey: "cart",
                sequence: 9_007_199_254_740_992, attempts: 3, nextAttemptAt: Date(timeIntervalSinceReferenceDate: 760_000_060.5),
                lastError: "HTTP 503 (0 body bytes)", revision: 12, maximumResponseBodySize: 1_048_576, deadlineSeconds: 2.5),
            entry("A3BB189E-8BF9-3888-9912-ACE4E6543002", method: "DELETE", timeout: .infinity, ttl: .infinity, priority: 1),
            entry("3F2504E0-4F89-11D3-9A0C-0305E82C3301", url: "http://[::1]:8080/a%20b?q=%C3%A9", method: "PUT", body: Data(), timeout: .nan),
            entry(
                "E621E1F8-C36C-495A-93FC-0C247A3E6E5F", url: "https://example.test/ü/🚀", method: "PATCH",
                headers: ["X-Emoji": "😀", "X-Control": "\u{1}\t\n", "X-Slash": "a/b\\c"], body: Data((0..<64).map { UInt8($0 * 4) }),
                lastError: "transport: connection reset"),
        ]
        // Keys sorted: JSONEncoder's order otherwise changes from run to run (the reader takes any).
        let sorted = QueueEntry.makeEncoder()
        sorted.outputFormatting = [.sortedKeys]
        var seeds = try entries.map { try sorted.encode($0) }
        let pretty = QueueEntry.makeEncoder()
        pretty.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        seeds.append(try pretty.encode(entries[1]))
        // Escapes another writer might use, and a file cut short.
        let escaped = String(decoding: seeds[0], as: UTF8.self).replacingOccurrences(of: "\"POST\"", with: "\"\\u0050\\u004F\\u0053\\u0054\"")
        seeds.append(Data(escaped.utf8))
        seeds.append(seeds[1].prefix(seeds[1].count / 2))
        return seeds
    }

    // MARK: - Cache files

    static func cacheFiles() throws -> [Data] {
        let storedAt = Date(timeIntervalSinceReferenceDate: 760_000_000.125)
        func response(
            _ url: String, method: String = "GET", partition: String? = nil, status: Int = 200, headers: [String: String],
            vary: [String: String] = [:], isInvalidated: Bool = false, body: String
        ) -> StoredResponse {
            let primary = CacheDigest(method + " " + url + (partition ?? ""))
            let names = vary.keys.sorted()
            let digest = HTTPCachePolicy.varyDigest(names: names, requestHeaders: vary)
            return StoredResponse(
                key: StoredResponse.variantKey(primary: primary, varyNames: names, varyDigest: digest), primaryKey: primary, method: method,
                url: url, partition: partition.map { CacheDigest($0) }, storedAt: storedAt, initialAge: 12.5, statusCode: status,
                headers: headers.merging(["Date": "Tue, 01 Jan 2025 00:00:00 GMT"]) { first, _ in first }, varyNames: names, varyDigest: digest,
                isInvalidated: isInvalidated, body: Data(body.utf8))
        }
        let responses = [
            response("https://example.test/", headers: [:], body: ""),
            response(
                "https://api.example.test/items?page=", headers: ["Content-Type": "application/json", "Cache-Control": "max-age=60", "ETag": "\"v1\""],
                body: #"{"items":[1,2,3]}"#),
            response(
                "https://api.example.test/me", partition: "user-1", headers: ["Cache-Control": "private, no-cache", "Last-Modified": "Mon, 30 Dec 2024 10:00:00 GMT"],
                vary: ["accept-language": "de, en;q=0.5", "accept-encoding": "gzip"], isInvalidated: true, body: "Grüße 🚀"),
            response("https://example.test/head", method: "HEAD", status: 404, headers: ["Content-Length": "0"], vary: ["x-missing": ""], body: ""),
        ]
        var noted = responses[1]
        noted.note = Data(#"{"settling":[]}"#.utf8)
        var seeds = try (responses + [noted]).map { try CacheFileFormat.encode($0) }
        var obsolete = seeds[1]
        obsolete.replaceSubrange(0..<4, with: Array("RCv1".utf8))
        seeds.append(obsolete)
        seeds.append(seeds[2].prefix(60))
        // A version 2 file, as the cache wrote before notes: no note length in its prefix.
        seeds.append(Data("RCv2".utf8) + seeds[1][4..<12] + seeds[1][20...])
        return seeds
    }

    // MARK: - Header fields (one per line, in the harness's order)

    /// Response `Cache-Control`, request `Cache-Control`, `Vary`, `Accept-Language`,
    /// `Content-Language`, stored `ETag`, `304` `ETag`, `Age`, `Date`, `Expires`, `Last-Modified`,
    /// `Pragma`, `Connection`.
    static let cacheHeaders = [
        "max-age=60\n\n\n\n\n\"v1\"\n\"v1\"\n\nTue, 01 Jan 2025 00:00:00 GMT\n\n\n\n",
        "public, max-age=\"3600\", stale-while-revalidate=30, stale-if-error=86400\nmax-stale=10, min-fresh=5\nAccept-Language, Accept-Encoding\nde-CH, de;q=0.9, en;q=0.8, *;q=0.1\nde-ch\nW/\"abc\"\nW/\"abc\"\n17\nTue, 01 Jan 2025 00:00:00 GMT\nWed, 02 Jan 2025 00:00:00 GMT\nMon, 30 Dec 2024 10:00:00 GMT\n\nkeep-alive, X-Trace",
        "no-cache=\"Set-Cookie, X-Secret\", must-revalidate, must-understand, no-store\nno-cache, only-if-cached\n*\nen\nen\nabc\nabc\n9999999999999\nSunday, 06-Nov-94 08:49:37 GMT\n0\nSun Nov  6 08:49:37 1994\nno-cache\nclose",
        "max-age=60, max-age=120, ext=\"max-age=9, no-store\", private\nmax-age=0\naccept, , user-agent\nfr;q=0.5, de;q=0.5\nfr\n\"\"\nW/\"\"\n5, 7\nnot a date\nThu, 01 Jan 1970 00:00:00 GMT\n\nno-cache, x\nConnection, Upgrade",
        "max-age =60, max-age= 60, s-maxage=10, proxy-revalidate, immutable\nmax-stale\nCookie\n*;q=1\n\n\"unterminated\n\"x\"\n-1\nFri, 31 Dec 9999 23:59:59 GMT\nSat, 01 Jan 0000 00:00:00 GMT\nTue, 29 Feb 2000 12:00:60 GMT\n\n",
    ]

    static let httpDates = [
        "120", "0", "99999999999999999999999", " 30 ", "-5", "1.5", "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994", "Thu Feb 29 00:00:00 2024", "sat, 31 dec 2022 23:59:60 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
        "Mon, 01 Jan 0001 00:00:00 GMT", "Monday, 29-Feb-00 12:00:00 GMT", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun,  06 Nov 1994 08:49:37 GMT",
    ]

    /// The mode byte (see the harness) and the bytes a client sends.
    static let loopbackRequests: [(mode: UInt8, bytes: String)] = [
        (0, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        (1, "POST /items HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"),
        (2, "PUT /upload HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"),
        (3, "POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"),
        (1, "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHEAD /c HTTP/1.1\r\nConnection: close\r\n\r\n"),
        (0, "\r\n\r\nOPTIONS * HTTP/1.1\r\nX-Repeat: 1\r\nx-repeat: 2\r\n\r\n"),
        (2, "GET / HTTP/2.0\r\n\r\n"),
        (3, "GET / HTTP/1.1\r\n folded: value\r\n\r\n"),
        (1, "POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\nok"),
        (0, "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx"),
        (5, "GET /big HTTP/1.1\r\nX-Fill: \0aaaaaaaa\0\r\n\r\n"),
        (6, "GET /many HTTP/1.1\r\n\0X-Header: value\r\n\0\r\n"),
        (7, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;\0ext\0\r\na\r\n0\r\n\r\n"),
        (4, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: \0t\0\r\n\r\n"),
        (6, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"),
        (2, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\n"),
    ]
}
