import Foundation
import RequestEngine
import Testing

@testable import OfflineQueue

@Suite("QueueEntryDecoder: the fast reader agrees with JSONDecoder")
struct QueueEntryDecoderTests {
    func entry(
        headers: [String: String] = [:], body: Data? = nil, timeout: TimeInterval = 30, ttl: TimeInterval = 86_400,
        orderingKey: String? = nil, coalescingKey: String? = nil, nextAttemptAt: Date? = nil, lastError: String? = nil
    ) -> QueueEntry {
        var request = QueuedRequest(
            method: .patch, url: URL(string: "https://api.example.test/a/b?q=%20x&y=é")!, headers: headers, body: body,
            timeout: timeout, ttl: ttl, priority: .critical, idempotencyKey: "key \"quoted\" \\ / ü 🚀",
            orderingKey: orderingKey, coalescingKey: coalescingKey)
        request.headers = headers
        return QueueEntry(
            request: request, idempotencyKey: request.idempotencyKey, enqueuedAt: Date(timeIntervalSinceReferenceDate: 815_000_000.125),
            sequence: 42, revision: 3, attempts: 7, nextAttemptAt: nextAttemptAt, lastError: lastError)
    }

    @Test func anOperationIDRoundTripsAndAnEntryWithoutOneReadsNil() throws {
        struct Operation: QueueableRequest {
            let url = URL(string: "https://api.example.test/v1/notes")!
            let method = HTTPMethod.post
            let body: Data? = Data("{}".utf8)
            let operationID: String? = "createNote"
        }
        let stored = QueueEntry(Operation(), id: UUID(), enqueuedAt: Date(timeIntervalSinceReferenceDate: 815_000_000))
        #expect(stored.operationID == "createNote")
        #expect(stored.replayRequest?.operationID == "createNote")
        let data = try QueueEntry.makeEncoder().encode(stored)
        #expect(try #require(QueueEntryDecoder.decode(data)).operationID == "createNote")
        #expect(try QueueEntry.makeDecoder().decode(QueueEntry.self, from: data).operationID == "createNote")
        // Written before entries had one: no key at all.
        let older = try QueueEntry.makeEncoder().encode(entry())
        #expect(!String(decoding: older, as: UTF8.self).contains("operationID"))
        #expect(try #require(QueueEntryDecoder.decode(older)).operationID == nil)
    }

    @Test func everyFieldRoundTripsThroughTheFastReader() throws {
        let samples = [
            entry(),
            entry(
                headers: ["X-Quote": "say \"hi\"\n\t", "Accept": "*/*", "X-Emoji": "😀", "X-Control": "\u{1}\u{1F}"],
                body: Data((0..<300).map { UInt8($0 % 256) }), timeout: .infinity, ttl: .infinity,
                orderingKey: "doc/1", coalescingKey: "profile", nextAttemptAt: Date(timeIntervalSinceReferenceDate: 815_000_060.5),
                lastError: "HTTP 503 (0 body bytes)"),
            entry(body: Data()),
        ]
        for sample in samples {
            let data = try QueueEntry.makeEncoder().encode(sample)
            let fast = try #require(QueueEntryDecoder.decode(data))
            let slow = try QueueEntry.makeDecoder().decode(QueueEntry.self, from: data)
            #expect(fast == slow)
            #expect(fast == sample)
        }
    }

    @Test func prettyPrintedAndEscapedInputStillParses() throws {
        let encoder = QueueEntry.makeEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        let sample = entry(headers: ["A": "b/c"])
        #expect(QueueEntryDecoder.decode(try encoder.encode(sample)) == sample)
        // \u escapes, including a surrogate pair, as another writer might produce them.
        var json = String(decoding: try QueueEntry.makeEncoder().encode(entry(orderingKey: "x")), as: UTF8.self)
        json = json.replacingOccurrences(of: "\"orderingKey\":\"x\"", with: "\"orderingKey\":\"\\u0041\\ud83d\\ude80\"")
        #expect(QueueEntryDecoder.decode(Data(json.utf8))?.orderingKey == "A🚀")
    }

    @Test(arguments: [
        "", "{", "[]", "{\"id\":1}", "null", "{\"unknown\":\"field\"}",
        "{\"id\":\"not-a-uuid\",\"url\":\"https://x\"}",
    ])
    func foreignOrBrokenInputIsLeftToJSONDecoder(text: String) {
        #expect(QueueEntryDecoder.decode(Data(text.utf8)) == nil)
    }

    @Test func uuidParsingMatchesFoundation() {
        for _ in 0..<200 {
            let id = UUID()
            #expect(QueueEntryDecoder.parseUUID(id.uuidString) == id)
            #expect(QueueEntryDecoder.parseUUID(id.uuidString.lowercased()) == id)
        }
        for bad in ["", "1234", String(repeating: "g", count: 36), "12345678-1234-1234-1234-1234567890123", "123456781234-1234-1234-1234567890ab"] {
            #expect(QueueEntryDecoder.parseUUID(bad) == nil)
        }
    }

    // MARK: Found by Fuzz/ (fuzz-queue-entry): whatever the fast reader accepts, JSONDecoder reads the same

    /// An entry file as the store writes it (keys sorted), with `replacing` swapped in.
    static func file(_ replacing: String = "", with replacement: String = "") -> Data {
        let text =
            #"{"attempts":0,"enqueuedAt":760000000.25,"formatVersion":1,"headers":{},"id":"00000000-0000-0000-0000-000000000001","#
            + #""idempotencyKey":"8C1D4F3A-0B6E-4F7A-9D2C-5E8B1A3F6C9D","method":"POST","priority":0,"revision":0,"sequence":1,"#
            + #""timeout":30,"ttl":86400,"url":"https:\/\/api.example.test\/orders"}"#
        return Data((replacing.isEmpty ? text : text.replacingOccurrences(of: replacing, with: replacement)).utf8)
    }

    /// The fast reader either leaves `data` to JSONDecoder or reads what JSONDecoder reads.
    /// (Failures name the file, not the entries: describing a `Date` read as infinite traps.)
    func expectReadersAgree(_ data: Data, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let fast = QueueEntryDecoder.decode(data) else { return }
        let slow = try? QueueEntry.makeDecoder().decode(QueueEntry.self, from: data)
        let agree = slow == fast
        #expect(agree, "the readers disagree on \(String(decoding: data, as: UTF8.self))", sourceLocation: sourceLocation)
    }

    /// Whether the fast reader reads `data` (rather than leaving it to JSONDecoder).
    func fastReaderReads(_ data: Data) -> Bool { QueueEntryDecoder.decode(data) != nil }

    @Test func theFileTheseTestsEditIsReadByBothReaders() throws {
        let fast = try #require(QueueEntryDecoder.decode(Self.file()))
        #expect(fast == (try QueueEntry.makeDecoder().decode(QueueEntry.self, from: Self.file())))
    }

    /// The fuzzer's first find: `"ttl":06400` (a leading zero, not JSON) read as 6400 where
    /// JSONDecoder rejects the file, so a corrupt file was loaded instead of quarantined.
    @Test func aNumberJSONDecoderRejectsIsLeftToIt() {
        let crash =
            #"{"attempts":0,"enqueuedAt":760000000.25,"formatVersion":1,"headers":{},"id":"00000000-0000-0000-0000-000000000001","#
            + #""idempotencyKey":"8C1D4F3A-0B6E-4F7A-9D2C-5E8B1A3F6C9D","method":"\u0017\u004F\u0053\u0054","priority":0,"revision":0,"#
            + #""sequence":1,"timeout":30,"ttl":06400,"url":"https:\/\/api.example.test\/orders"}"#
        #expect(!fastReaderReads(Data(crash.utf8)))
        expectReadersAgree(Data(crash.utf8))
        // Past Double's range, or rounding to zero: `"ttl":81.5e-36400` was the fuzzer's second find.
        for number in ["06400", "1.", "-", "-01", ".5", "1e", "1e+", "+1", "1.5.5", "1e5e5", "0x10", "--1", "81.5e-36400", "1e400", "-1.8e308", "2e-324"] {
            let data = Self.file(#""ttl":86400"#, with: #""ttl":\#(number)"#)
            #expect(!fastReaderReads(data), "ttl \(number)")
            expectReadersAgree(data)
        }
        for number in ["0", "-0", "86400", "1.5", "1e5", "1E+5", "2.5e-3", "-0.0", "0e-400", "5e-324", "1.7976931348623157e308"] {
            let data = Self.file(#""ttl":86400"#, with: #""ttl":\#(number)"#)
            #expect(fastReaderReads(data), "ttl \(number)")
            expectReadersAgree(data)
        }
    }

    /// A byte that is not UTF-8 inside a string: the fast reader read U+FFFD in its place (a
    /// method or URL the app never wrote); JSONDecoder rejects the file.
    @Test func aStringThatIsNotUTF8IsLeftToJSONDecoder() throws {
        let original = Self.file()
        let insideMethod = try #require(original.range(of: Data(#""POST""#.utf8))).lowerBound + 2  // after `"P`
        for bytes: [UInt8] in [[0xFF], [0xC3], [0xED, 0xA0, 0x80], [0xF0, 0x9F, 0x98], [0xC0, 0xAF]] {
            let data = original.prefix(upTo: insideMethod) + bytes + original.suffix(from: insideMethod)
            #expect(!fastReaderReads(data), "bytes \(bytes)")
            expectReadersAgree(data)
        }
        // Escaped or not, valid UTF-8 beyond ASCII still takes the fast path.
        let unicode = Self.file(#""method":"POST""#, with: #""method":"POST","orderingKey":"ü🚀\u00fc""#)
        #expect(QueueEntryDecoder.decode(unicode)?.orderingKey == "ü🚀ü")
    }

    /// A key given twice (two `url`s): the fast reader kept the last, JSONDecoder the first, so
    /// the two read different entries from one file.
    @Test func aRepeatedKeyIsLeftToJSONDecoder() {
        let twice = Self.file(#""url":"#, with: #""url":"https:\/\/example.test\/%C3%BC\/%tion reset","url":"#)
        #expect(!fastReaderReads(twice))
        expectReadersAgree(twice)
        let header = Self.file(#""headers":{}"#, with: #""headers":{"A":"1","A":"2"}"#)
        #expect(!fastReaderReads(header))
        expectReadersAgree(header)
    }

    /// `"enqueuedAt":"inf"`: the fast reader read an infinite date, JSONDecoder reads no string
    /// as a `Date`.
    @Test func aDateWrittenAsAStringIsLeftToJSONDecoder() {
        for text in ["\"inf\"", "\"-inf\"", "\"nan\""] {
            let data = Self.file(#""enqueuedAt":760000000.25"#, with: #""enqueuedAt":\#(text)"#)
            #expect(!fastReaderReads(data), "enqueuedAt \(text)")
            expectReadersAgree(data)
        }
    }
}

@Suite("EntryFileName: an entry's file name, as uuidString writes it")
struct EntryFileNameTests {
    @Test func theNameIsTheUUIDStringAndJSON() {
        var ids = (0..<1_000).map { _ in UUID() }
        ids.append(UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
        ids.append(UUID(uuid: (255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255)))
        ids.append(UUID(uuid: (0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, 0xFE, 0xDC, 0xBA, 0x98, 0x76, 0x54, 0x32, 0x10)))
        for id in ids {
            #expect(EntryFileName.of(id) == "\(id.uuidString).json")
        }
    }
}
