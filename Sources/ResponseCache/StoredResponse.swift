import Foundation

/// One stored response, as held in a cache file: what identifies it (for the index), then the
/// response itself.
struct StoredResponse: Sendable, Equatable {
    /// This variant's digest: the file's name and the index's key. Variants of one URL differ in
    /// the request header values their response varies on (`variantKey(primary:varyNames:varyDigest:)`).
    var key: CacheDigest
    /// The digest of method, URL and partition, shared by every variant of one URL.
    var primaryKey: CacheDigest
    /// `GET` or `HEAD`.
    var method: String
    /// The request URL with secret query values removed: for `invalidate(where:)` and inspection,
    /// never for matching (the digest matches).
    var url: String
    /// The digest of the partition the response belongs to, if any (never the partition itself).
    var partition: CacheDigest?
    /// When the response was received, or last confirmed by a validation (wall clock): RFC 9111
    /// §4.2.3's `response_time`.
    var storedAt: Date
    /// Its age at `storedAt`, in seconds: §4.2.3's `corrected_initial_age` (the larger of the
    /// age its `Date` implies and its `Age` plus the time the exchange took).
    var initialAge: Double
    var statusCode: Int
    /// Response headers that may be stored (no `Set-Cookie`, no hop-by-hop fields), names as sent.
    /// Always holds a `Date` (RFC 9110 §6.6.1: one is added on receipt when the server sent none).
    var headers: [String: String]
    /// Request header names the response varies on, lower-cased and sorted; `["*"]` never stored.
    var varyNames: [String]
    /// The digest of the request's normalised values for `varyNames` (never the values themselves).
    var varyDigest: CacheDigest?
    /// Marked stale whatever its lifetime (RFC 9111 §4.4 invalidation, §4.3.5 a `HEAD` that
    /// disagrees): kept to be shown offline and revalidated, never served as fresh.
    var isInvalidated = false
    /// What the layer above the cache keeps with this response (empty: nothing): bytes the cache
    /// never reads, written and read back with the response (`CachedRequestEngine.annotateStored`).
    var note = Data()
    var body: Data

    /// The stored header value for `name`, compared case-insensitively.
    func header(_ name: String) -> String? {
        if let exact = headers[name] { return exact }
        return headers.first { $0.key.caseInsensitiveCompare(name) == .orderedSame }?.value
    }

    /// The file key of the variant of `primary` that varies on `varyNames` with these values.
    static func variantKey(primary: CacheDigest, varyNames: [String], varyDigest: CacheDigest?) -> CacheDigest {
        guard !varyNames.isEmpty else { return primary }
        return CacheDigest(primary.hex + "\nvary\n" + varyNames.joined(separator: ",") + "\n" + (varyDigest?.hex ?? "-"))
    }

    var summary: StoredResponseSummary {
        StoredResponseSummary(key: key, primaryKey: primaryKey, method: method, url: url, partition: partition, storedAt: storedAt)
    }
}

/// What the index keeps of a stored response without reading its body.
struct StoredResponseSummary: Sendable, Equatable {
    var key: CacheDigest
    var primaryKey: CacheDigest
    var method: String
    var url: String
    var partition: CacheDigest?
    var storedAt: Date
}

/// The cache file format (version 3), little-endian:
///
/// ```
/// offset 0   "RCv3"                      magic
///        4   u32 summary length          the part the index reads at open
///        8   u32 detail length           status, age, flags, headers, vary
///       12   u64 note length             what the layer above keeps with the response
///       20   u64 body length
///       28   16 bytes digest             SipHash-2-4 ×2 of everything from offset 44 to the end
///       44   summary: key digest (16), primary key digest (16), storedAt (f64 bits), method, url,
///                     partition flag (+16)
///            detail: status (u16), initial age (f64 bits), flags (u8: 1 = invalidated),
///                    header count (u32) and pairs, vary name count and names, vary digest flag (+16)
///            note
///            body
/// ```
/// Strings are a u32 byte count and UTF-8. A file whose size is not exactly the sum of the
/// lengths, whose digest does not match, or whose fields do not parse is torn or corrupt: never
/// served. Version 2 files (`RCv2`: the same without a note, a 36-byte prefix) are read as they
/// are, with an empty note. Version 1 files (one variant per URL, no age) are recognised by their
/// magic and dropped at open (`Problem.obsoleteVersion`): a cache may lose what it holds, never
/// misread it.
enum CacheFileFormat {
    static let magic: [UInt8] = Array("RCv3".utf8)
    /// Version 2's magic: read as it is (no note).
    static let version2Magic: [UInt8] = Array("RCv2".utf8)
    /// The magic of the first version, whose files are dropped at open.
    static let obsoleteMagic: [UInt8] = Array("RCv1".utf8)
    static let prefixLength = 44
    static let version2PrefixLength = 36
    /// Longest summary accepted at open (a URL is at most a few KiB).
    static let maximumSummaryLength = 64 * 1024
    /// Longest detail section accepted.
    static let maximumDetailLength = 1024 * 1024
    /// Most header fields, and most `Vary` names, a file holds.
    static let maximumHeaderCount = 10_000
    static let maximumVaryNames = 1_000

    /// Why a response is not written: its file would break a limit the reader enforces, and a
    /// file the reader refuses is one the cache would serve now and call corrupt after a relaunch.
    enum Unstorable: Error, Equatable {
        /// The summary (method, URL as stored, keys) over `maximumSummaryLength`: a URL of about
        /// 64 KiB.
        case summaryTooLong
        /// Status, header fields and `Vary` names over `maximumDetailLength` (1 MiB) together.
        case detailTooLong
        case tooManyHeaders
        case tooManyVaryNames
        /// A status outside 0…65535, an age or a date that is not a finite, non-negative number.
        case fieldOutOfRange
    }

    /// Why bytes are not a usable cache file.
    enum Problem: Error, Equatable {
        case truncated
        case badMagic
        /// A file of an older format version: not corrupt, but not read either.
        case obsoleteVersion
        case lengthsDoNotAddUp
        case checksumMismatch
        case malformed(String)
    }

    /// The file for `response`, or why the reader would not take it back: every limit `decode`
    /// enforces is enforced here first.
    static func encode(_ response: StoredResponse) throws(Unstorable) -> Data {
        guard response.headers.count <= maximumHeaderCount else { throw .tooManyHeaders }
        guard response.varyNames.count <= maximumVaryNames else { throw .tooManyVaryNames }
        guard (0...Int(UInt16.max)).contains(response.statusCode), response.initialAge.isFinite, response.initialAge >= 0,
            response.storedAt.timeIntervalSinceReferenceDate.isFinite
        else { throw .fieldOutOfRange }
        var summary = Writer()
        summary.digest(response.key)
        summary.digest(response.primaryKey)
        summary.u64(response.storedAt.timeIntervalSinceReferenceDate.bitPattern)
        summary.string(response.method)
        summary.string(response.url)
        summary.optionalDigest(response.partition)
        var detail = Writer()
        detail.u16(UInt16(response.statusCode))
        detail.u64(response.initialAge.bitPattern)
        detail.bytes.append(response.isInvalidated ? 1 : 0)
        detail.u32(UInt32(clamping: response.headers.count))
        for (name, value) in response.headers.sorted(by: { $0.key < $1.key }) {
            detail.string(name)
            detail.string(value)
        }
        detail.u32(UInt32(clamping: response.varyNames.count))
        for name in response.varyNames { detail.string(name) }
        detail.optionalDigest(response.varyDigest)
        // Every string is shorter than its section, so no length below was clamped.
        guard summary.bytes.count <= maximumSummaryLength else { throw .summaryTooLong }
        guard detail.bytes.count <= maximumDetailLength else { throw .detailTooLong }

        var file = Writer()
        file.bytes.reserveCapacity(prefixLength + summary.bytes.count + detail.bytes.count + response.note.count + response.body.count)
        file.bytes.append(contentsOf: magic)
        file.u32(UInt32(summary.bytes.count))
        file.u32(UInt32(detail.bytes.count))
        file.u64(UInt64(response.note.count))
        file.u64(UInt64(response.body.count))
        let digestOffset = file.bytes.count
        file.bytes.append(contentsOf: [UInt8](repeating: 0, count: 16))
        file.bytes.append(contentsOf: summary.bytes)
        file.bytes.append(contentsOf: detail.bytes)
        file.bytes.append(contentsOf: response.note)
        file.bytes.append(contentsOf: response.body)
        let checksum = file.bytes.withUnsafeBytes { CacheDigest(UnsafeRawBufferPointer(rebasing: $0[prefixLength...])) }
        var digestBytes = Writer()
        digestBytes.digest(checksum)
        file.bytes.replaceSubrange(digestOffset..<(digestOffset + 16), with: digestBytes.bytes)
        return Data(file.bytes)
    }

    /// What a file's prefix says: its version's layout and the lengths of its sections.
    struct Prefix: Equatable {
        /// The prefix's own length (36 for version 2, 44 for version 3).
        let length: Int
        let summaryLength: Int
        let detailLength: Int
        let noteLength: Int
        let bodyLength: Int
        /// Where the stored digest is.
        let digestOffset: Int

        /// Where the summary ends: what a reader reads at open.
        var summaryEnd: Int { length + summaryLength }
        /// The size the file must have.
        var fileSize: Int { length + summaryLength + detailLength + noteLength + bodyLength }
    }

    /// A file's prefix, checked: a known version, a summary and a detail within their limits,
    /// lengths that add up to a size that can exist.
    static func prefix(_ bytes: UnsafeRawBufferPointer) throws -> Prefix {
        guard bytes.count >= 4 else { throw Problem.truncated }
        let version3 = bytes.prefix(4).elementsEqual(magic)
        guard version3 || bytes.prefix(4).elementsEqual(version2Magic) else {
            throw bytes.prefix(4).elementsEqual(obsoleteMagic) ? Problem.obsoleteVersion : Problem.badMagic
        }
        let length = version3 ? prefixLength : version2PrefixLength
        guard bytes.count >= length else { throw Problem.truncated }
        let summaryLength = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)))
        let detailLength = Int(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self)))
        let noteLength = version3 ? UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: 12, as: UInt64.self)) : 0
        let bodyLength = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: version3 ? 20 : 12, as: UInt64.self))
        guard summaryLength <= maximumSummaryLength else { throw Problem.malformed("summary too long") }
        guard detailLength <= maximumDetailLength, noteLength < UInt64(Int.max / 4), bodyLength < UInt64(Int.max / 4) else {
            throw Problem.lengthsDoNotAddUp
        }
        return Prefix(
            length: length, summaryLength: summaryLength, detailLength: detailLength, noteLength: Int(noteLength),
            bodyLength: Int(bodyLength), digestOffset: length - 16)
    }

    /// The summary of a file from its first `prefix(_:).summaryEnd` bytes, and the file's
    /// expected total size (checked against the real size by the caller).
    static func decodeSummary(_ bytes: UnsafeRawBufferPointer) throws -> (summary: StoredResponseSummary, fileSize: Int) {
        let prefix = try prefix(bytes)
        guard bytes.count >= prefix.summaryEnd else { throw Problem.truncated }
        var reader = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[prefix.length..<prefix.summaryEnd]))
        let summary = try reader.summary()
        guard reader.isAtEnd else { throw Problem.malformed("summary has trailing bytes") }
        return (summary, prefix.fileSize)
    }

    /// A whole file, checked: lengths, digest, every field.
    static func decode(_ data: Data) throws -> StoredResponse {
        try data.withUnsafeBytes { try decode($0) }
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) throws -> StoredResponse {
        let (summary, expectedSize) = try decodeSummary(bytes)
        guard bytes.count == expectedSize else { throw bytes.count < expectedSize ? Problem.truncated : Problem.lengthsDoNotAddUp }
        let prefix = try prefix(bytes)
        var stored = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[prefix.digestOffset..<prefix.length]))
        let expected = try stored.digest()
        guard CacheDigest(UnsafeRawBufferPointer(rebasing: bytes[prefix.length...])) == expected else { throw Problem.checksumMismatch }
        let detailStart = prefix.summaryEnd
        let noteStart = detailStart + prefix.detailLength
        let bodyStart = noteStart + prefix.noteLength
        var detail = Reader(bytes: UnsafeRawBufferPointer(rebasing: bytes[detailStart..<noteStart]))
        let status = Int(try detail.u16())
        let initialAge = Double(bitPattern: try detail.u64())
        guard initialAge.isFinite, initialAge >= 0 else { throw Problem.malformed("initial age out of range") }
        let flags = try detail.take(1)[0]
        guard flags <= 1 else { throw Problem.malformed("unknown flags") }
        let headerCount = Int(try detail.u32())
        guard headerCount <= maximumHeaderCount else { throw Problem.malformed("too many headers") }
        var headers: [String: String] = [:]
        for _ in 0..<headerCount {
            let name = try detail.string()
            headers[name] = try detail.string()
        }
        let varyCount = Int(try detail.u32())
        guard varyCount <= maximumVaryNames else { throw Problem.malformed("too many vary names") }
        var varyNames: [String] = []
        for _ in 0..<varyCount { varyNames.append(try detail.string()) }
        let varyDigest = try detail.optionalDigest()
        guard detail.isAtEnd else { throw Problem.malformed("detail has trailing bytes") }
        let note = Data(UnsafeRawBufferPointer(rebasing: bytes[noteStart..<bodyStart]))
        let body = Data(UnsafeRawBufferPointer(rebasing: bytes[bodyStart...]))
        return StoredResponse(
            key: summary.key, primaryKey: summary.primaryKey, method: summary.method, url: summary.url,
            partition: summary.partition, storedAt: summary.storedAt, initialAge: initialAge, statusCode: status,
            headers: headers, varyNames: varyNames, varyDigest: varyDigest, isInvalidated: flags == 1, note: note, body: body
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
            let primaryKey = try digest()
            let seconds = Double(bitPattern: try u64())
            guard seconds.isFinite else { throw Problem.malformed("stored-at is not finite") }
            let method = try string()
            let url = try string()
            let partition = try optionalDigest()
            return StoredResponseSummary(key: key, primaryKey: primaryKey, method: method, url: url, partition: partition, storedAt: Date(timeIntervalSinceReferenceDate: seconds))
        }
    }
}
