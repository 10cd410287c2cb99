import Foundation

/// Something the template bytes are written to: a hasher on the per-event path, a byte buffer
/// when a new endpoint's template string is needed. Both see exactly the same byte stream, so an
/// endpoint's hash is a function of its template string.
protocol TemplateWriter {
    mutating func write(_ bytes: UnsafeBufferPointer<UInt8>)
    mutating func write(byte: UInt8)
    /// Writes the four bytes of `word`, least significant first.
    mutating func write(_ word: UInt32)
}

/// Finds the path in a URL's UTF-8 bytes and writes its template, without allocating.
enum URLPathScanner {
    private static let slash = UInt8(ascii: "/")

    /// Calls `body` with the UTF-8 bytes of `url`'s path (between the authority and the first `?`
    /// or `#`; percent-encoded as in the URL). Allocation-free for URLs whose string is native
    /// UTF-8, as on Linux and on Apple platforms with the Swift Foundation URL.
    @inline(__always)
    static func withPath<R>(of url: URL, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        let string = url.absoluteString
        if let result = string.utf8.withContiguousStorageIfAvailable({ body(path(in: $0)) }) {
            return result
        }
        var copy = string
        return copy.withUTF8 { body(path(in: $0)) }
    }

    /// The path of a URL for custom templates: percent-encoded, without query or fragment, `"/"` when empty.
    static func percentEncodedPath(of url: URL) -> String {
        withPath(of: url) { path in
            path.isEmpty ? "/" : String(decoding: path, as: UTF8.self)
        }
    }

    /// The slice of `url` (a URL string's bytes) that is its path: after `scheme:` and a
    /// `//authority` (user info, host, port) if present, up to the first `?` or `#`.
    @inline(__always)
    static func path(in url: UnsafeBufferPointer<UInt8>) -> UnsafeBufferPointer<UInt8> {
        let count = url.count
        var start = 0
        // A scheme ends at the first ":" that comes before any "/", "?" or "#" (RFC 3986: a
        // relative reference cannot have a ":" in its first segment).
        var index = 0
        while index < count {
            let byte = url[index]
            if byte == colon || byte == slash || byte == question || byte == hash { break }
            index &+= 1
        }
        if index > 0, index < count, url[index] == colon {
            start = index &+ 1
            if start &+ 1 < count, url[start] == slash, url[start &+ 1] == slash {
                start = firstIndex(in: url, from: start &+ 2, of: slash, question, hash)
            }
        }
        let end = firstIndex(in: url, from: start, of: question, hash, hash)
        return UnsafeBufferPointer(rebasing: url[start..<end])
    }

    /// Writes the default template of `path` (bytes without query): segments split on `/`,
    /// matrix parameters dropped, identifier segments replaced by `{id}`; `/` for an empty path.
    @inline(__always)
    static func writeTemplate<W: TemplateWriter>(ofPath path: UnsafeBufferPointer<UInt8>, into writer: inout W) {
        let count = path.count
        if count == 0 {
            writer.write(byte: slash)
            return
        }
        var start = 0
        while true {
            // The segment ends at the next "/"; matrix parameters, if any, start at its first ";".
            let segmentEnd = firstIndex(in: path, from: start, of: slash, semicolon, semicolon)
            let end =
                segmentEnd < count && path[segmentEnd] == semicolon
                ? firstIndex(in: path, from: segmentEnd, of: slash, slash, slash)
                : segmentEnd
            let segment = UnsafeBufferPointer(rebasing: path[start..<segmentEnd])
            if isIdentifier(segment) {
                writer.write(identifierPlaceholder)
            } else {
                writer.write(segment)
            }
            if end == count { return }
            writer.write(byte: slash)
            start = end &+ 1
        }
    }

    /// The index of the first byte at or after `start` equal to `a`, `b` or `c` (`bytes.count` if
    /// none), eight bytes at a time: a byte equal to the pattern makes `word ^ pattern` have a zero
    /// byte, and `(v - 0x01…01) & ~v & 0x80…80` flags the lowest zero byte of `v` exactly.
    @inline(__always)
    static func firstIndex(in bytes: UnsafeBufferPointer<UInt8>, from start: Int, of a: UInt8, _ b: UInt8, _ c: UInt8) -> Int {
        let count = bytes.count
        var index = start
        if let base = bytes.baseAddress {
            let raw = UnsafeRawPointer(base)
            let ones: UInt64 = 0x0101_0101_0101_0101
            let highs: UInt64 = 0x8080_8080_8080_8080
            let patternA = ones &* UInt64(a), patternB = ones &* UInt64(b), patternC = ones &* UInt64(c)
            while index &+ 8 <= count {
                let word = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: index, as: UInt64.self))
                let matchA = word ^ patternA, matchB = word ^ patternB, matchC = word ^ patternC
                let found = ((matchA &- ones) & ~matchA | (matchB &- ones) & ~matchB | (matchC &- ones) & ~matchC) & highs
                if found != 0 { return index &+ (found.trailingZeroBitCount &>> 3) }
                index &+= 8
            }
        }
        while index < count {
            let byte = bytes[index]
            if byte == a || byte == b || byte == c { return index }
            index &+= 1
        }
        return count
    }

    private static let colon = UInt8(ascii: ":")
    private static let question = UInt8(ascii: "?")
    private static let hash = UInt8(ascii: "#")
    private static let semicolon = UInt8(ascii: ";")
    /// `{id}` as one little-endian word, written to a hasher in one step.
    static let identifierPlaceholder: UInt32 = 0x7D64_697B

    /// Whether a segment is all digits, a UUID, or ≥ 16 hex digits with a decimal digit among them.
    /// Stops at the first byte that rules all three out, so ordinary words cost a byte or two.
    @inline(__always)
    static func isIdentifier(_ segment: UnsafeBufferPointer<UInt8>) -> Bool {
        let count = segment.count
        guard count > 0 else { return false }
        var digits = 0
        var hexLetters = 0
        var dashes = 0
        for index in 0..<count {
            let byte = segment[index]
            if byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") {
                digits += 1
            } else if (byte | 0x20) >= UInt8(ascii: "a") && (byte | 0x20) <= UInt8(ascii: "f") {
                hexLetters += 1
            } else if byte == UInt8(ascii: "-") && count == 36 && (index == 8 || index == 13 || index == 18 || index == 23) {
                dashes += 1
            } else {
                return false
            }
        }
        if digits == count { return true }
        if count == 36 && dashes == 4 { return true }
        return dashes == 0 && count >= 16 && digits > 0
    }
}

/// Collects template bytes into a string (only when a new endpoint is registered).
struct TemplateBytes: TemplateWriter {
    private var bytes: [UInt8] = []

    mutating func write(_ bytes: UnsafeBufferPointer<UInt8>) { self.bytes.append(contentsOf: bytes) }
    mutating func write(byte: UInt8) { bytes.append(byte) }
    mutating func write(_ word: UInt32) {
        for shift in stride(from: 0, to: 32, by: 8) { bytes.append(UInt8(truncatingIfNeeded: word >> UInt32(shift))) }
    }

    var string: String { String(decoding: bytes, as: UTF8.self) }
}

/// A fast 64-bit streaming hash of the template bytes (a multiply-mix over 8-byte words, seeded
/// per collector). The result depends only on the byte stream, not on how it was split into
/// writes. Used to find an endpoint without building its template string; two templates with the
/// same 64-bit hash would share a row, which for a few hundred endpoints has a probability
/// around 10^-15.
struct TemplateHasher: TemplateWriter {
    private var state: UInt64
    /// Bytes written but not yet absorbed (fewer than 8), least significant first.
    private var pending: UInt64 = 0
    private var pendingBits: UInt64 = 0
    private var length: UInt64 = 0

    private static let multiplier: UInt64 = 0x9E37_79B9_7F4A_7C15
    private static let finalMultiplier: UInt64 = 0xD6E8_FEB8_6659_FD93

    init(seed: UInt64, discriminator: UInt64) {
        state = seed ^ (discriminator &* Self.finalMultiplier)
    }

    @inline(__always)
    private static func mix(_ a: UInt64, _ b: UInt64) -> UInt64 {
        let product = a.multipliedFullWidth(by: b)
        return product.high ^ product.low
    }

    @inline(__always)
    private mutating func absorb(_ word: UInt64) {
        state = Self.mix(state ^ word, Self.multiplier)
    }

    /// Appends the low `bits` bits of `value` (bits ≤ 64, a multiple of 8) to the stream.
    @inline(__always)
    private mutating func append(_ value: UInt64, bits: UInt64) {
        length &+= bits >> 3
        let filled = pendingBits &+ bits
        if filled < 64 {
            pending |= value &<< pendingBits
            pendingBits = filled
            return
        }
        // A full word: the pending bytes, then as many of the new ones as fit.
        absorb(pendingBits == 0 ? value : pending | value &<< pendingBits)
        let carried = filled &- 64
        pending = carried == 0 ? 0 : value &>> (bits &- carried)
        pendingBits = carried
    }

    @inline(__always)
    mutating func write(byte: UInt8) {
        append(UInt64(byte), bits: 8)
    }

    @inline(__always)
    mutating func write(_ word: UInt32) {
        append(UInt64(word), bits: 32)
    }

    @inline(__always)
    mutating func write(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let base = bytes.baseAddress else { return }
        let raw = UnsafeRawPointer(base)
        let count = bytes.count
        var index = 0
        while index &+ 8 <= count {
            append(UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)), bits: 64)
            index &+= 8
        }
        // The last 0–7 bytes as one little-endian value.
        var tail: UInt64 = 0
        var shift: UInt64 = 0
        while index < count {
            tail |= UInt64(bytes[index]) &<< shift
            shift &+= 8
            index &+= 1
        }
        if shift > 0 { append(tail, bits: shift) }
    }

    /// The hash, never 0 (0 marks an empty cache slot).
    @inline(__always)
    func finalize() -> Int {
        let last = Self.mix(state ^ pending ^ (length << 56), Self.finalMultiplier)
        let result = Int(truncatingIfNeeded: Self.mix(last ^ length, Self.multiplier))
        return result == 0 ? 1 : result
    }
}
