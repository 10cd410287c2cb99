import Foundation

/// The file that keeps `markStale` durable without rewriting a single response's file: the keys
/// of the stored responses marked stale, appended by each marking (one `write`, no file created),
/// and rewritten whole (temp name, then rename) now and then to drop the marks that ended.
///
/// ```
/// offset 0   "RCSM"                  magic
///        4   u32 format version (1)
///        8   records, 20 bytes each: a key digest (high, low: u64 each), then a u32 check
///            (the low 32 bits of the digest of those 16 bytes)
/// ```
/// Little-endian. A part of a record at the end is an append a power loss cut: ignored (that
/// marking is lost, as a response written just before a power loss may be). A record whose check
/// fails, or a wrong header, is damage: the cache then treats every response it opens as stale
/// (it cannot tell which were marked), which costs a revalidation each and never serves a marked
/// response as fresh. Either way the cache writes the file afresh at open.
enum StaleMarksFile {
    /// Its name in the cache folder: not a cache file (`CacheFolder.isCacheFile`), so opening the
    /// folder and `clear()`'s listing pass it by.
    static let name = "stale-marks"
    static let tempName = ".stale-marks.tmp"
    static let headerSize = 8
    static let recordSize = 20

    private static let magic: [UInt8] = Array("RCSM".utf8)
    private static let version: UInt32 = 1

    /// A whole file listing `keys`.
    static func encode(_ keys: some Collection<CacheDigest>) -> Data {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(headerSize + keys.count * recordSize)
        bytes += magic
        append(version, to: &bytes)
        appendRecords(keys, to: &bytes)
        return Data(bytes)
    }

    /// Records for `keys`, to append to a file.
    static func records(_ keys: some Collection<CacheDigest>) -> Data {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(keys.count * recordSize)
        appendRecords(keys, to: &bytes)
        return Data(bytes)
    }

    /// What a file says.
    enum Contents: Equatable {
        /// The keys of its whole records, and whether a part of one followed them.
        case keys([CacheDigest], cut: Bool)
        case damaged
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) -> Contents {
        guard bytes.count >= headerSize, Array(bytes[0..<4]) == magic, load(UInt32.self, bytes, at: 4) == version else { return .damaged }
        let count = (bytes.count - headerSize) / recordSize
        var keys: [CacheDigest] = []
        keys.reserveCapacity(count)
        for index in 0..<count {
            let offset = headerSize + index * recordSize
            let key = CacheDigest(high: load(UInt64.self, bytes, at: offset), low: load(UInt64.self, bytes, at: offset + 8))
            guard load(UInt32.self, bytes, at: offset + 16) == check(key) else { return .damaged }
            keys.append(key)
        }
        return .keys(keys, cut: (bytes.count - headerSize) % recordSize != 0)
    }

    private static func appendRecords(_ keys: some Collection<CacheDigest>, to bytes: inout [UInt8]) {
        for key in keys {
            append(key.high, to: &bytes)
            append(key.low, to: &bytes)
            append(check(key), to: &bytes)
        }
    }

    private static func check(_ key: CacheDigest) -> UInt32 {
        var raw = (key.high.littleEndian, key.low.littleEndian)
        return UInt32(truncatingIfNeeded: withUnsafeBytes(of: &raw) { CacheDigest($0) }.low)
    }

    private static func append<Integer: FixedWidthInteger>(_ value: Integer, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    private static func load<Integer: FixedWidthInteger>(_ type: Integer.Type, _ bytes: UnsafeRawBufferPointer, at offset: Int) -> Integer {
        Integer(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: Integer.self))
    }
}
