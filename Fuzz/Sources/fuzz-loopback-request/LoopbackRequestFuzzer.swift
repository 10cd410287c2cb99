import Foundation
import FuzzSupport

@testable import ResilienceTesting

/// The loopback server's HTTP/1.x request parser (`LoopbackRequestParser`), fed what a client
/// socket might send.
///
/// The first input byte chooses how the rest arrives: bits 0-1 the largest read (1, 7, 64 or
/// 1 024 bytes, the sizes drawn from the byte); with bit 2 set, a rest of the form `A NUL B NUL C`
/// becomes A, B repeated past 64 KiB, then C (a head or a line past the parser's limits), read
/// 64 times larger.
///
/// Contract: no input crashes or takes more than linear time; the requests and the failure parsed
/// do not depend on how the bytes are split into reads; a failure stays a failure; a parsed
/// request has a token for a method, a target, lower-cased header names and no more body than
/// was sent; the parser never holds more than twice the bytes it has not consumed.
@main
enum LoopbackRequestFuzzer {
    static func main() {
        FuzzDriver.run { data, size in
            LoopbackRequestFuzzer.check(FuzzInput(data, size))
            return 0
        }
    }

    /// What a run of the parser produced: the requests in order, then the failure, if any.
    struct Outcome: Equatable {
        var requests: [String] = []
        var bodies: [Data] = []
        var failure: Int?
    }

    static func check(_ input: FuzzInput) {
        guard let mode = input.bytes.first else { return }
        var stream = Array(input.bytes.dropFirst())
        var largest = [1, 7, 64, 1024][Int(mode & 3)]
        if mode & 4 != 0 {
            let parts = stream.split(separator: 0, maxSplits: 2, omittingEmptySubsequences: false)
            if parts.count == 3, !parts[1].isEmpty {
                var amplified = Array(parts[0])
                amplified.reserveCapacity(parts[0].count + 64 * 1024 + 4096 + parts[1].count + parts[2].count)
                while amplified.count < parts[0].count + 64 * 1024 + 4096 { amplified.append(contentsOf: parts[1]) }
                amplified.append(contentsOf: parts[2])
                stream = amplified
                largest *= 64
            }
        }
        let whole = run(stream, reads: [stream.count])
        var random = SplitMix64(seed: UInt64(mode))
        var reads: [Int] = []
        var total = 0
        while total < stream.count {
            let read = min(stream.count - total, 1 + Int(random.next() % UInt64(largest)))
            reads.append(read)
            total += read
        }
        let split = run(stream, reads: reads)
        fuzzCheck(whole == split, "the outcome depends on how the bytes arrive:\n whole \(whole)\n in \(reads.count) reads \(split)")
    }

    static func run(_ stream: [UInt8], reads: [Int]) -> Outcome {
        var parser = LoopbackRequestParser()
        var outcome = Outcome()
        var offset = 0
        var bodyBytes = 0
        for read in reads {
            parser.append(stream[offset..<(offset + read)])
            offset += read
            let held = heldByteCount(parser)
            fuzzCheck(held <= 2 * parser.bufferedByteCount + read, "the parser holds \(held) bytes for \(parser.bufferedByteCount) unconsumed")
            parsing: while true {
                switch parser.next() {
                case .needMore:
                    break parsing
                case .expectContinue:
                    continue
                case .failure(let status):
                    fuzzCheck([400, 431, 505].contains(status), "failure status \(status)")
                    if case .failure(let again) = parser.next() {
                        fuzzCheck(again == status, "a failure changed from \(status) to \(again)")
                    } else {
                        fuzzCheck(false, "the parser recovered from a failure")
                    }
                    outcome.failure = status
                    return outcome
                case .request(let request):
                    fuzzCheck(!request.method.isEmpty && !request.target.isEmpty, "empty method or target")
                    fuzzCheck(request.headers.keys.allSatisfy { $0 == $0.lowercased() }, "header names not lower-cased")
                    bodyBytes += request.body.count
                    fuzzCheck(bodyBytes <= offset, "\(bodyBytes) body bytes from \(offset) sent")
                    _ = request.wantsKeepAlive
                    let headers = request.headers.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }
                    outcome.requests.append("\(request.method) \(request.target) HTTP/1.\(request.minorVersion) \(headers), \(request.body.count) body bytes")
                    outcome.bodies.append(request.body)
                }
            }
        }
        return outcome
    }

    /// The parser's whole buffer, consumed bytes included (read through reflection: it is private).
    static func heldByteCount(_ parser: LoopbackRequestParser) -> Int {
        for child in Mirror(reflecting: parser).children where child.label == "buffer" {
            if let buffer = child.value as? [UInt8] { return buffer.count }
        }
        fuzzCheck(false, "LoopbackRequestParser has no buffer to measure")
        return 0
    }
}
