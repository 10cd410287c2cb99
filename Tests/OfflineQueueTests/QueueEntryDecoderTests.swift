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
}
