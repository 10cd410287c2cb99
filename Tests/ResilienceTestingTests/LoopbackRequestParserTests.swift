import Foundation
import Testing

@testable import ResilienceTesting

// The loopback server's request parser on its own, fed the bytes as one read or as many: what it
// parses must not depend on how the socket delivered them (Fuzz/, fuzz-loopback-request).

@Suite("LoopbackRequestParser")
struct LoopbackRequestParserTests {
    enum Outcome: Equatable {
        case requests([String])
        case failure(Int, after: [String])
    }

    /// Parses `bytes` delivered in reads of at most `readSize` bytes: the requests (method, target
    /// and body), then the failure if there is one.
    func parse(_ bytes: [UInt8], readSize: Int) -> Outcome {
        var parser = LoopbackRequestParser()
        var requests: [String] = []
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + readSize)
            parser.append(bytes[offset..<end])
            offset = end
            parsing: while true {
                switch parser.next() {
                case .needMore: break parsing
                case .expectContinue: continue
                case .failure(let status): return .failure(status, after: requests)
                case .request(let request):
                    requests.append("\(request.method) \(request.target) \(String(decoding: request.body, as: UTF8.self))")
                }
            }
        }
        return .requests(requests)
    }

    static let chunkedHead = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"

    /// The fuzzer's find: a chunk-size line with a 70 KB extension was refused (400) when it
    /// arrived in several reads, since the line limit was checked only while the line was
    /// incomplete, and accepted when it arrived in one.
    @Test func aChunkLinePastItsLimitIsRefusedInOneReadAsInMany() {
        let crash = Array((Self.chunkedHead + "1;" + String(repeating: "ext", count: 23_000) + "\r\na\r\n0\r\n\r\n").utf8)
        #expect(parse(crash, readSize: crash.count) == .failure(400, after: []))
        #expect(parse(crash, readSize: 4096) == .failure(400, after: []))
        #expect(parse(crash, readSize: 1) == .failure(400, after: []))
    }

    @Test func aTrailerLinePastItsLimitIsRefusedInOneReadAsInMany() {
        let stream = Array((Self.chunkedHead + "0\r\nX-Trailer: " + String(repeating: "t", count: 9_000) + "\r\n\r\n").utf8)
        for readSize in [stream.count, 4096, 7, 1] {
            #expect(parse(stream, readSize: readSize) == .failure(400, after: []), "reads of \(readSize) bytes")
        }
    }

    /// A line of exactly `maxChunkLineBytes` bytes before its CRLF is accepted, one byte more is
    /// not, however the bytes arrive (a lone CR at the end of a read may start the CRLF).
    @Test(arguments: [0, 1])
    func theChunkLineLimitIsTheSameWhateverTheReads(extra: Int) {
        let line = "1;" + String(repeating: "x", count: LoopbackRequestParser.maxChunkLineBytes - 2 + extra)
        let stream = Array((Self.chunkedHead + line + "\r\na\r\n0\r\n\r\nGET /next HTTP/1.1\r\n\r\n").utf8)
        let expected: Outcome = extra == 0 ? .requests(["POST / a", "GET /next "]) : .failure(400, after: [])
        // The head is 47 bytes: reads of limit + 48 end on the CR after the line, + 49 on its LF.
        for readSize in [stream.count, LoopbackRequestParser.maxChunkLineBytes + 48, LoopbackRequestParser.maxChunkLineBytes + 49, 1024, 64, 1] {
            #expect(parse(stream, readSize: readSize) == expected, "reads of \(readSize) bytes")
        }
    }

    @Test func pipelinedChunkedRequestsParseTheSameInAnyReads() {
        let stream = Array(
            (Self.chunkedHead + "5;ext=1\r\nhello\r\n3\r\n wo\r\n0\r\nX-T: 1\r\n\r\n" + "GET /b HTTP/1.1\r\n\r\n" + Self.chunkedHead + "0\r\n\r\n").utf8)
        let expected = Outcome.requests(["POST / hello wo", "GET /b ", "POST / "])
        for readSize in [stream.count, 13, 2, 1] {
            #expect(parse(stream, readSize: readSize) == expected, "reads of \(readSize) bytes")
        }
    }
}
