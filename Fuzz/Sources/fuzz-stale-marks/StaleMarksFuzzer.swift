import Foundation
import FuzzSupport

@testable import ResponseCache

/// The response cache's `stale-marks` file (`StaleMarksFile`), read whole at every open.
///
/// Every input is tried twice: as it is, and "repaired" (a valid header, and each whole record's
/// check recomputed), so the fuzzer reaches what follows the checks.
///
/// Contract: no input crashes; a file that decodes re-encodes to its whole records byte for byte
/// (`encode` of its keys, and `records` appended to the header, are the same bytes), and says it was
/// cut exactly when a part of a record follows them; a decodable file with a byte of its header
/// changed is damaged; one with a byte of a record changed never decodes to the same keys.
@main
enum StaleMarksFuzzer {
    static func main() {
        FuzzDriver.run { data, size in
            let input = FuzzInput(data, size)
            StaleMarksFuzzer.check(Array(input.bytes))
            StaleMarksFuzzer.check(StaleMarksFuzzer.repair(Array(input.bytes)))
            return 0
        }
    }

    static func check(_ bytes: [UInt8]) {
        let contents = bytes.withUnsafeBytes { StaleMarksFile.decode($0) }
        guard case .keys(let keys, let cut) = contents else { return }
        let whole = StaleMarksFile.headerSize + keys.count * StaleMarksFile.recordSize
        fuzzCheck(whole <= bytes.count, "\(keys.count) keys from \(bytes.count) bytes")
        fuzzCheck(cut == (bytes.count != whole), "cut \(cut) with \(bytes.count - whole) bytes after the records")
        let encoded = StaleMarksFile.encode(keys)
        fuzzCheck(Array(encoded) == Array(bytes[0..<whole]), "the keys re-encode to other bytes")
        fuzzCheck(Array(encoded) == Array(bytes[0..<StaleMarksFile.headerSize]) + Array(StaleMarksFile.records(keys)), "encode differs from header + records")
        // One byte changed: in the header, damaged; in a record, never the same keys.
        guard !bytes.isEmpty else { return }
        let position = Int(bytes.count.multipliedReportingOverflow(by: 7_919).partialValue % whole)
        var changed = Array(bytes[0..<whole])
        changed[position] ^= 0x5A
        let again = changed.withUnsafeBytes { StaleMarksFile.decode($0) }
        if position < StaleMarksFile.headerSize {
            fuzzCheck(again == .damaged, "a changed header byte at \(position) still decodes")
        } else {
            fuzzCheck(again != .keys(keys, cut: false), "a changed record byte at \(position) decodes to the same keys")
        }
    }

    /// `bytes` with the header made valid and every whole record's check recomputed.
    static func repair(_ bytes: [UInt8]) -> [UInt8] {
        let header = Array(StaleMarksFile.encode([CacheDigest]()))
        var repaired = header + bytes.dropFirst(min(bytes.count, StaleMarksFile.headerSize))
        let records = (repaired.count - StaleMarksFile.headerSize) / StaleMarksFile.recordSize
        for index in 0..<records {
            let offset = StaleMarksFile.headerSize + index * StaleMarksFile.recordSize
            let key = repaired.withUnsafeBytes { raw in
                CacheDigest(
                    high: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self)),
                    low: UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: offset + 8, as: UInt64.self)))
            }
            let record = Array(StaleMarksFile.records([key]))
            repaired.replaceSubrange(offset..<(offset + StaleMarksFile.recordSize), with: record)
        }
        return repaired
    }
}
