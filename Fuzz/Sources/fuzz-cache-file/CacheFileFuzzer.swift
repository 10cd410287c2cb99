import Foundation
import FuzzSupport

@testable import ResponseCache

/// Cache files (`CacheFileFormat`, version 3, and version 2 as older files are), read whole by
/// `DiskResponseCache` and by their summary at open.
///
/// Every input is tried twice: as it is, and "repaired" (its lengths made to add up to its size
/// and its checksum recomputed), so the fuzzer reaches the field parsers behind the checksum.
///
/// Contract: no input crashes; what decodes re-encodes (the writer refuses nothing the reader
/// accepts) to bytes that decode to the same response, and encoding is deterministic; the summary read at open (from the bytes the folder reads)
/// agrees with the whole file's and announces its exact size; a decodable file cut short by one
/// byte, or with one byte changed, never decodes; `CacheDigest(hex:)` reads back `hex`.
@main
enum CacheFileFuzzer {
    static func main() {
        FuzzDriver.run { data, size in
            let input = FuzzInput(data, size)
            CacheFileFuzzer.check(UnsafeRawBufferPointer(input.bytes))
            if input.bytes.count >= CacheFileFormat.version2PrefixLength {
                let repaired = CacheFileFuzzer.repair(Array(input.bytes))
                repaired.withUnsafeBytes { CacheFileFuzzer.check($0) }
            }
            let text = input.text
            if let digest = CacheDigest(hex: Substring(text)) {
                fuzzCheck(digest.hex == text.lowercased(), "CacheDigest(hex: \(text)) reads back as \(digest.hex)")
            }
            return 0
        }
    }

    static func check(_ bytes: UnsafeRawBufferPointer) {
        let decoded = try? CacheFileFormat.decode(bytes)
        let summary = try? CacheFileFormat.decodeSummary(bytes)
        if let summary {
            // What CacheFolder reads at open: the first 4 KiB, or prefix and summary if longer.
            let end = (try? CacheFileFormat.prefix(bytes).summaryEnd) ?? 0
            let read = min(bytes.count, max(4096, end))
            let fromPrefix = try? CacheFileFormat.decodeSummary(UnsafeRawBufferPointer(rebasing: bytes[0..<read]))
            fuzzCheck(fromPrefix?.summary == summary.summary && fromPrefix?.fileSize == summary.fileSize, "the summary read at open differs")
        }
        guard let decoded else { return }
        fuzzCheck(summary?.summary == decoded.summary, "the summary disagrees with the file")
        fuzzCheck(summary?.fileSize == bytes.count, "the summary announces \(String(describing: summary?.fileSize)) bytes, the file has \(bytes.count)")
        fuzzCheck(decoded.initialAge.isFinite && decoded.initialAge >= 0, "initial age \(decoded.initialAge)")
        fuzzCheck(decoded.storedAt.timeIntervalSinceReferenceDate.isFinite, "stored-at is not finite")

        guard let encoded = try? CacheFileFormat.encode(decoded) else {
            return fuzzCheck(false, "a file the reader accepts is one the writer refuses: \(decoded)")
        }
        let again = try? CacheFileFormat.decode(encoded)
        fuzzCheck(again == decoded, "decode(encode(x)) != x for \(decoded)")
        if let again { fuzzCheck((try? CacheFileFormat.encode(again)) == encoded, "encoding is not deterministic") }

        fuzzCheck((try? CacheFileFormat.decode(UnsafeRawBufferPointer(rebasing: bytes.dropLast()))) == nil, "a file cut short by one byte decodes")
        var changed = Array(bytes)
        let position = Int(truncatingIfNeeded: UInt(bitPattern: changed.count &* 31 &+ 7)) % changed.count
        changed[position] ^= 0x5A
        fuzzCheck(changed.withUnsafeBytes { (try? CacheFileFormat.decode($0)) == nil }, "a file with byte \(position) changed decodes")
    }

    /// `bytes` with summary and detail lengths cut to what the file can hold, the note length (in
    /// version 3) cut likewise, the body length set to the rest, and the checksum recomputed.
    static func repair(_ bytes: [UInt8]) -> [UInt8] {
        var bytes = bytes
        let version2 = bytes.starts(with: Array("RCv2".utf8))
        let prefix = version2 ? CacheFileFormat.version2PrefixLength : CacheFileFormat.prefixLength
        guard bytes.count >= prefix else { return bytes }
        func u32(at offset: Int) -> Int { bytes[offset..<(offset + 4)].reversed().reduce(0) { $0 << 8 | Int($1) } }
        func store(_ value: UInt64, at offset: Int, width: Int) {
            for index in 0..<width { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * UInt64(index))) }
        }
        let room = bytes.count - prefix
        let summaryLength = u32(at: 4) % (room + 1)
        let detailLength = u32(at: 8) % (room - summaryLength + 1)
        store(UInt64(summaryLength), at: 4, width: 4)
        store(UInt64(detailLength), at: 8, width: 4)
        var rest = room - summaryLength - detailLength
        if !version2 {
            let noteLength = u32(at: 12) % (rest + 1)
            store(UInt64(noteLength), at: 12, width: 8)
            rest -= noteLength
        }
        store(UInt64(rest), at: version2 ? 12 : 20, width: 8)
        let digest = bytes.withUnsafeBytes { CacheDigest(UnsafeRawBufferPointer(rebasing: $0[prefix...])) }
        store(digest.high, at: prefix - 16, width: 8)
        store(digest.low, at: prefix - 8, width: 8)
        return bytes
    }
}
