import Foundation

/// The file that keeps `markStale` durable without rewriting a single response's file: the keys
/// of the stored responses marked stale since their files were written, in one small file the
/// cache rewrites (to a temp name, then renamed) each time it marks something stale.
///
/// ```
/// offset 0   "RCSM"                  magic
///        4   u32 format version (1)
///        8   u32 key count n
///       12   n × 16 bytes            key digests (high, low: u64 each)
///   12+16n   16 bytes digest         SipHash-2-4 ×2 of everything before it
/// ```
/// Little-endian. A file that does not match its length or its digest is damaged: the cache
/// then treats every response it opens as stale (it cannot tell which were marked), which costs
/// a revalidation each and never serves a marked response as fresh.
enum StaleMarksFile {
    /// Its name in the cache folder: not a cache file (`CacheFolder.isCacheFile`), so opening the
    /// folder and `clear()`'s listing pass it by.
    static let name = "stale-marks"
    static let tempName = ".stale-marks.tmp"

    private static let magic: [UInt8] = Array("RCSM".utf8)
    private static let version: UInt32 = 1

    static func encode(_ keys: [CacheDigest]) -> Data {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(12 + keys.count * 16 + 16)
        bytes += magic
        append(version, to: &bytes)
        append(UInt32(truncatingIfNeeded: keys.count), to: &bytes)
        for key in keys {
            append(key.high, to: &bytes)
            append(key.low, to: &bytes)
        }
        let digest = bytes.withUnsafeBytes { CacheDigest($0) }
        append(digest.high, to: &bytes)
        append(digest.low, to: &bytes)
        return Data(bytes)
    }

    /// The keys the file lists, or nil when it is damaged (or of a version this reader does not know).
    static func decode(_ bytes: UnsafeRawBufferPointer) -> [CacheDigest]? {
        guard bytes.count >= 28, Array(bytes[0..<4]) == magic, load(UInt32.self, bytes, at: 4) == version else { return nil }
        let count = Int(load(UInt32.self, bytes, at: 8))
        guard count <= (bytes.count - 28) / 16, bytes.count == 12 + count * 16 + 16 else { return nil }
        let end = 12 + count * 16
        let digest = CacheDigest(UnsafeRawBufferPointer(rebasing: bytes[0..<end]))
        guard digest.high == load(UInt64.self, bytes, at: end), digest.low == load(UInt64.self, bytes, at: end + 8) else { return nil }
        return (0..<count).map { index in
            CacheDigest(high: load(UInt64.self, bytes, at: 12 + index * 16), low: load(UInt64.self, bytes, at: 20 + index * 16))
        }
    }

    private static func append<Integer: FixedWidthInteger>(_ value: Integer, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    private static func load<Integer: FixedWidthInteger>(_ type: Integer.Type, _ bytes: UnsafeRawBufferPointer, at offset: Int) -> Integer {
        Integer(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: Integer.self))
    }
}
