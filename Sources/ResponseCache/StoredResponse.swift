import Foundation

/// One stored response, as held in a cache file: what identifies it (for the index), then the
/// response itself.
struct StoredResponse: Sendable, Equatable {
    /// The digest of method, URL and partition: the file's name and the index's key.
    var key: CacheDigest
    /// `GET` or `HEAD`.
    var method: String
    /// The request URL with secret query values removed: for `invalidate(where:)` and inspection,
    /// never for matching (the digest matches).
    var url: String
    /// The digest of the partition the response belongs to, if any (never the partition itself).
    var partition: CacheDigest?
    /// When the response was received, or last confirmed by a 304 (wall clock).
    var storedAt: Date
    var statusCode: Int
    /// Response headers that may be stored (no `Set-Cookie`, no hop-by-hop fields), names as sent.
    var headers: [String: String]
    /// Request header names the response varies on, lower-cased and sorted; `["*"]` never stored.
    var varyNames: [String]
    /// The digest of the request's values for `varyNames` (never the values themselves).
    var varyDigest: CacheDigest?
    var body: Data

    /// The stored header value for `name`, compared case-insensitively.
    func header(_ name: String) -> String? {
        if let exact = headers[name] { return exact }
        return headers.first { $0.key.caseInsensitiveCompare(name) == .orderedSame }?.value
    }
}

/// What the index keeps of a stored response without reading its body.
struct StoredResponseSummary: Sendable, Equatable {
    var key: CacheDigest
    var method: String
    var url: String
    var partition: CacheDigest?
    var storedAt: Date
}

/// The cache file format (version 1), little-endian:
///
/// ```
/// offset 0   "RCv1"                      magic
///        4   u32 summary length          the part the index reads at open
///        8   u32 detail length           status, headers, vary
///       12   u64 body length
///       20   16 bytes digest             SipHash-2-4 ×2 of everything from offset 36 to the end
///       36   summary: key digest (16), storedAt (f64 bits), method, url, partition flag (+16)
///            detail: status (u16), header count (u32) and pairs, vary name count and names,
///                    vary digest flag (+16)
///            body
/// ```
/// Strings are a u32 byte count and UTF-8. A file whose size is not exactly the sum of the
/// lengths, whose digest does not match, or whose fields do not parse is torn or corrupt: never
/// served.
enum CacheFileFormat {
    static let magic: [UInt8] = Array("RCv1".utf8)
    static let prefixLength = 36
    /// Longest summary accepted at open (a URL is at most a few KiB).
    static let maximumSummaryLength = 64 * 1024
    /// Longest detail section accepted.
    static let maximumDetailLength = 1024 * 1024

    /// Why bytes are not a usable cache file.
    enum Problem: Error, Equatable {
        case truncated
        case badMagic
        case lengthsDoNotAddUp
        case checksumMismatch
        case malformed(String)
    }

    static func encode(_ response: StoredResponse) -> Data {
        var summary = Writer()
        summary.digest(response.key)
        summary.u64(response.storedAt.timeIntervalSinceReferenceDate.bitPattern)
        summary.string(response.method)
        summary.string(response.url)
        summary.optionalDigest(response.partition)
        var detail = Writer()
        detail.u16(UInt16(clamping: response.statusCode))
        detail.u32(UInt32(clamping: response.headers.count))
        for (name, value) in response.headers.sorted(by: { $0.key < $1.key }) {
            detail.string(name)
            detail.string(value)
        }
        detail.u32(UInt32(clamping: response.varyNames.count))
        for name in response.varyNames { detail.string(name) }
        detail.optionalDigest(response.varyDigest)

        var file = Writer()
        file.bytes.reserveCapacity(prefixLength + summary.bytes.count + detail.bytes.count + response.body.count)
        file.bytes.append(contentsOf: magic)
        file.u32(UInt32(summary.bytes.count))
        file.u32(UInt32(detail.bytes.count))
        file.u64(UInt64(response.body.count))
        let digestOffset = file.bytes.count
        file.bytes.append(contentsOf: [UInt8](repeating: 0, count: 16))
        file.bytes.append(contentsOf: summary.bytes)
        file.bytes.append(contentsOf: detail.bytes)
        file.bytes.append(contentsOf: response.body)
        let checksum = file.bytes.withUnsafeBytes { CacheDigest(UnsafeRawBufferPointer(rebasing: $0[prefixLength...])) }
        var digestBytes = Writer()
        digestBytes.digest(checksum)
        file.bytes.replaceSubrange(digestOffset..<(digestOffset + 16), with: digestBytes.bytes)
        return Data(file.bytes)
    }

    /// The summary length a file's prefix announces, so a reader knows how much to read at open.
    static func summaryLength(prefix: UnsafeRawBufferPointer) throws -> Int {
        guard prefix.count >= prefixLength else { throw Problem.truncated }
        guard prefix.prefix(4).elementsEqual(magic) else { throw Problem.badMagic }
        let length = Int(UInt32(littleEndian: prefix.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
        guard length <= maximumSummaryLength else { throw Problem.malformed("summary too long") }
        return length
    }

    /// The summary of a file from its first `prefixLength + summaryLength` bytes, and the file's
    /// expected total size (checked against the real size by the caller).
    static func decodeSummary(_ bytes: UnsafeRawBufferPointer) throws -> (summary: StoredResponseSummary, fileSize: Int) {
        let summaryLength = try summaryLength(prefix: bytes)
        guard bytes.count >= prefixLength + summaryLength else { throw Problem.truncated }
        let detailLength = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self)))
        let bodyLength = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt64.self))
        guard detailLength <= maximumDetailLength, bodyLength < UInt64(Int.max / 2) else { throw Problem.lengthsDoNotAddUp }
        var reader = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[prefixLength..<(prefixLength + summaryLength)]))
        let summary = try reader.summary()
        guard reader.isAtEnd else { throw Problem.malformed("summary has trailing bytes") }
        return (summary, prefixLength + summaryLength + detailLength + Int(bodyLength))
    }

    /// A whole file, checked: lengths, digest, every field.
    static func decode(_ data: Data) throws -> StoredResponse {
        try data.withUnsafeBytes { try decode($0) }
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) throws -> StoredResponse {
        let (summary, expectedSize) = try decodeSummary(bytes)
        guard bytes.count == expectedSize else { throw bytes.count < expectedSize ? Problem.truncated : Problem.lengthsDoNotAddUp }
        var stored = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[20..<36]))
        let expected = try stored.digest()
        guard CacheDigest(UnsafeRawBufferPointer(rebasing: bytes[prefixLength...])) == expected else { throw Problem.checksumMismatch }
        let summaryLength = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
        let detailLength = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self)))
        let detailStart = prefixLength + summaryLength
        var detail = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[detailStart..<(detailStart + detailLength)]))
        let status = Int(try detail.u16())
        let headerCount = Int(try detail.u32())
        guard headerCount <= 10_000 else { throw Problem.malformed("too many headers") }
        var headers: [String: String] = [:]
        for _ in 0..<headerCount {
            let name = try detail.string()
            headers[name] = try detail.string()
        }
        let varyCount = Int(try detail.u32())
        guard varyCount <= 1_000 else { throw Problem.malformed("too many vary names") }
        var varyNames: [String] = []
        for _ in 0..<varyCount { varyNames.append(try detail.string()) }
        let varyDigest = try detail.optionalDigest()
        guard detail.isAtEnd else { throw Problem.malformed("detail has trailing bytes") }
        let body = Data(UnsafeRawBufferPointer(rebasing: bytes[(detailStart + detailLength)...]))
        return StoredResponse(
            key: summary.key, method: summary.method, url: summary.url, partition: summary.partition,
            storedAt: summary.storedAt, statusCode: status, headers: headers, varyNames: varyNames,
            varyDigest: varyDigest, body: body
        )
    }

    private struct Writer {
        var bytes: [UInt8] = []

        mutating func u16(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
        mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
        mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
        mutating func digest(_ digest: CacheDigest) {
            u64(digest.high)
            u64(digest.low)
        }
        mutating func optionalDigest(_ digest: CacheDigest?) {
            guard let digest else {
                bytes.append(0)
                return
            }
            bytes.append(1)
            self.digest(digest)
        }
        mutating func string(_ text: String) {
            let utf8 = Array(text.utf8)
            u32(UInt32(clamping: utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var position = 0

        var isAtEnd: Bool { position == bytes.count }

        mutating func take(_ count: Int) throws -> UnsafeRawBufferPointer {
            guard count >= 0, bytes.count - position >= count else { throw Problem.truncated }
            defer { position += count }
            return UnsafeRawBufferPointer(rebasing: bytes[position..<(position + count)])
        }
        mutating func u16() throws -> UInt16 { UInt16(littleEndian: try take(2).loadUnaligned(as: UInt16.self)) }
        mutating func u32() throws -> UInt32 { UInt32(littleEndian: try take(4).loadUnaligned(as: UInt32.self)) }
        mutating func u64() throws -> UInt64 { UInt64(littleEndian: try take(8).loadUnaligned(as: UInt64.self)) }
        mutating func digest() throws -> CacheDigest {
            let high = try u64()
            return CacheDigest(high: high, low: try u64())
        }
        mutating func optionalDigest() throws -> CacheDigest? {
            switch try take(1)[0] {
            case 0: return nil
            case 1: return try digest()
            default: throw Problem.malformed("bad flag")
            }
        }
        mutating func string() throws -> String {
            let count = Int(try u32())
            let raw = try take(count)
            guard let text = String(validating: raw, as: UTF8.self) else { throw Problem.malformed("invalid UTF-8") }
            return text
        }
        mutating func summary() throws -> StoredResponseSummary {
            let key = try digest()
            let seconds = Double(bitPattern: try u64())
            guard seconds.isFinite else { throw Problem.malformed("stored-at is not finite") }
            let method = try string()
            let url = try string()
            let partition = try optionalDigest()
            return StoredResponseSummary(key: key, method: method, url: url, partition: partition, storedAt: Date(timeIntervalSinceReferenceDate: seconds))
        }
    }
}
