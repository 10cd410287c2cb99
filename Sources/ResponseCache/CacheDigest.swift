import Foundation

/// A 128-bit digest (SipHash-2-4 under two fixed keys), used for what must not be written in
/// clear — cache keys in file names, a partition, the values of request headers a response
/// varies on — and as a file's checksum. Not a cryptographic commitment: the full key is checked
/// again on every read, so a collision can only cause a miss, never a wrong response.
struct CacheDigest: Hashable, Sendable, Comparable {
    let high: UInt64
    let low: UInt64

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// The digest of `bytes`.
    init(_ bytes: UnsafeRawBufferPointer) {
        high = SipHash24.hash(bytes, key0: 0x7265_7369_6C69_656E, key1: 0x6365_2D63_6163_6865)
        low = SipHash24.hash(bytes, key0: 0x0F1E_2D3C_4B5A_6978, key1: 0x8796_A5B4_C3D2_E1F0)
    }

    init(_ data: Data) {
        self = data.withUnsafeBytes { CacheDigest($0) }
    }

    init(_ text: String) {
        var copy = text
        self = copy.withUTF8 { CacheDigest(UnsafeRawBufferPointer($0)) }
    }

    /// 32 lower-case hex digits.
    var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var bytes = [UInt8](repeating: 0, count: 32)
        for index in 0..<16 {
            let word = index < 8 ? high : low
            let byte = UInt8(truncatingIfNeeded: word >> (UInt64(7 - index % 8) * 8))
            bytes[index * 2] = digits[Int(byte >> 4)]
            bytes[index * 2 + 1] = digits[Int(byte & 0x0F)]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Parses `hex` (32 hex digits, either case).
    init?(hex: Substring) {
        guard hex.utf8.count == 32 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in hex.utf8.enumerated() {
            let nibble: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibble = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            if index < 16 { high = high << 4 | UInt64(nibble) } else { low = low << 4 | UInt64(nibble) }
        }
        self.init(high: high, low: low)
    }

    static func < (lhs: CacheDigest, rhs: CacheDigest) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }
}

/// SipHash-2-4 (Aumasson and Bernstein), 64-bit output.
///
/// The state is a struct with a mutating round rather than locals captured by a nested function:
/// captured locals are boxed on the heap in unoptimized builds, which made hashing a body there
/// an order of magnitude slower (tests run unoptimized).
struct SipHash24 {
    private var v0: UInt64
    private var v1: UInt64
    private var v2: UInt64
    private var v3: UInt64

    private init(key0: UInt64, key1: UInt64) {
        v0 = 0x736F_6D65_7073_6575 ^ key0
        v1 = 0x646F_7261_6E64_6F6D ^ key1
        v2 = 0x6C79_6765_6E65_7261 ^ key0
        v3 = 0x7465_6462_7974_6573 ^ key1
    }

    @inline(__always) private mutating func round() {
        v0 &+= v1; v1 = v1 << 13 | v1 >> 51; v1 ^= v0; v0 = v0 << 32 | v0 >> 32
        v2 &+= v3; v3 = v3 << 16 | v3 >> 48; v3 ^= v2
        v0 &+= v3; v3 = v3 << 21 | v3 >> 43; v3 ^= v0
        v2 &+= v1; v1 = v1 << 17 | v1 >> 47; v1 ^= v2; v2 = v2 << 32 | v2 >> 32
    }

    @inline(__always) private mutating func compress(_ word: UInt64) {
        v3 ^= word
        round()
        round()
        v0 ^= word
    }

    static func hash(_ bytes: UnsafeRawBufferPointer, key0: UInt64, key1: UInt64) -> UInt64 {
        var state = SipHash24(key0: key0, key1: key1)
        let count = bytes.count
        let blocks = count / 8
        var offset = 0
        while offset < blocks * 8 {
            state.compress(UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
            offset += 8
        }
        var last = UInt64(truncatingIfNeeded: count) << 56
        for index in 0..<(count % 8) {
            last |= UInt64(bytes[blocks * 8 + index]) << (UInt64(index) * 8)
        }
        state.compress(last)
        state.v2 ^= 0xFF
        state.round(); state.round(); state.round(); state.round()
        return state.v0 ^ state.v1 ^ state.v2 ^ state.v3
    }
}
