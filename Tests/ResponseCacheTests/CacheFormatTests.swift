import Foundation
import Testing

@testable import ResponseCache

@Suite("ResponseCache building blocks: digest, file format, index, Cache-Control")
struct CacheFormatTests {
    // MARK: SipHash-2-4 against the reference vectors

    @Test func sipHashMatchesTheReferenceVectors() {
        // Aumasson & Bernstein's test key 00 01 … 0f, read as two little-endian words.
        let key0: UInt64 = 0x0706_0504_0302_0100
        let key1: UInt64 = 0x0F0E_0D0C_0B0A_0908
        let message = (0..<64).map { UInt8($0) }
        func hash(_ length: Int) -> UInt64 {
            message.withUnsafeBytes { SipHash24.hash(UnsafeRawBufferPointer(rebasing: $0[0..<length]), key0: key0, key1: key1) }
        }
        #expect(hash(0) == 0x726F_DB47_DD0E_0E31)
        #expect(hash(1) == 0x74F8_39C5_93DC_67FD)
        #expect(hash(7) == 0xAB02_00F5_8B01_D137)
        #expect(hash(8) == 0x93F5_F579_9A93_2462)
        #expect(hash(15) == 0xA129_CA61_49BE_45E5)
        #expect(hash(63) == 0x958A_324C_EB06_4572)
    }

    @Test func digestHexRoundTrips() {
        let digest = CacheDigest("GET\nhttps://example.test/feed\n")
        #expect(digest.hex.count == 32)
        #expect(CacheDigest(hex: Substring(digest.hex)) == digest)
        #expect(CacheDigest(hex: Substring(digest.hex.uppercased())) == digest)
        #expect(CacheDigest(hex: "xyz") == nil)
        #expect(CacheDigest("a") != CacheDigest("b"))
    }

    // MARK: File format

    private func sample(body: Data = Data("hello, world".utf8)) -> StoredResponse {
        StoredResponse(
            key: CacheDigest("GET\nhttps://example.test/feed\n"),
            primaryKey: CacheDigest("GET\nhttps://example.test/feed\n"),
            method: "GET",
            url: "https://example.test/feed?page=2",
            partition: CacheDigest("user-42"),
            storedAt: Date(timeIntervalSinceReferenceDate: 812_345_678.25),
            initialAge: 12.5,
            statusCode: 200,
            headers: ["Content-Type": "application/json", "ETag": "\"v1\"", "Cache-Control": "max-age=60"],
            varyNames: ["accept-language"],
            varyDigest: CacheDigest("en"),
            isInvalidated: true,
            body: body
        )
    }

    @Test func aStoredResponseRoundTripsThroughItsFile() throws {
        let response = sample()
        let data = try CacheFileFormat.encode(response)
        #expect(try CacheFileFormat.decode(data) == response)
        let summary = try data.withUnsafeBytes { try CacheFileFormat.decodeSummary($0) }
        #expect(summary.fileSize == data.count)
        #expect(summary.summary == response.summary)
        let empty = sample(body: Data())
        #expect(try CacheFileFormat.decode(try CacheFileFormat.encode(empty)) == empty)
    }

    @Test func aNoteRoundTripsAndIsCoveredByTheDigest() throws {
        var response = sample()
        response.note = Data("the layer above's bytes".utf8)
        let data = try CacheFileFormat.encode(response)
        #expect(try CacheFileFormat.decode(data) == response)
        // A flipped byte in the note is caught like any other.
        let noteStart = try data.withUnsafeBytes { try CacheFileFormat.prefix($0) }.summaryEnd + (try data.withUnsafeBytes { try CacheFileFormat.prefix($0) }.detailLength)
        var corrupted = data
        corrupted[noteStart] ^= 0x01
        #expect(throws: CacheFileFormat.Problem.checksumMismatch) { try CacheFileFormat.decode(corrupted) }
    }

    /// Files written before notes existed (version 2: a 36-byte prefix without the note's length)
    /// are read as they are, with an empty note: an upgrade loses nothing stored.
    @Test func aVersion2FileIsReadWithAnEmptyNote() throws {
        let response = sample()
        let current = try CacheFileFormat.encode(response)  // version 3, empty note
        // The same file as version 2 wrote it: no note length; the digest covers the same bytes.
        let version2 = Data("RCv2".utf8) + current[4..<12] + current[20...]
        #expect(try CacheFileFormat.decode(version2) == response)
        let summary = try version2.withUnsafeBytes { try CacheFileFormat.decodeSummary($0) }
        #expect(summary.fileSize == version2.count && summary.summary == response.summary)
    }

    @Test func everyTruncationAndEveryFlippedByteIsDetected() throws {
        let data = try CacheFileFormat.encode(sample(body: Data(repeating: 0x41, count: 300)))
        for length in 0..<data.count {
            #expect(throws: CacheFileFormat.Problem.self) { try CacheFileFormat.decode(data.prefix(length)) }
        }
        for position in 0..<data.count {
            var corrupted = data
            corrupted[position] ^= 0x01
            #expect(throws: CacheFileFormat.Problem.self, "byte \(position)") { try CacheFileFormat.decode(corrupted) }
        }
        var zeroed = data
        zeroed.replaceSubrange(40..<data.count, with: [UInt8](repeating: 0, count: data.count - 40))
        #expect(throws: CacheFileFormat.Problem.self) { try CacheFileFormat.decode(zeroed) }
        #expect(throws: CacheFileFormat.Problem.self) { try CacheFileFormat.decode(data + Data([0])) }
    }

    // MARK: Index

    private func summary(_ name: String) -> StoredResponseSummary {
        StoredResponseSummary(key: CacheDigest(name), primaryKey: CacheDigest(name), method: "GET", url: "https://example.test/\(name)", partition: nil, storedAt: Date())
    }

    @Test func theIndexEvictsLeastRecentlyUsedFirstAndCountsBytes() {
        var index = CacheIndex()
        for name in ["a", "b", "c", "d"] { index.insert(summary(name), size: 10) }
        #expect(index.totalBytes == 40)
        index.touch(CacheDigest("a"))  // order now b, c, d, a
        #expect(index.keysByRecency() == ["b", "c", "d", "a"].map { CacheDigest($0) })
        #expect(index.evictionCandidates(toFit: 25) == ["b", "c"].map { CacheDigest($0) })
        #expect(index.evictionCandidates(toFit: 25, sparing: CacheDigest("c")) == ["b", "d"].map { CacheDigest($0) })
        #expect(index.evictionCandidates(toFit: index.totalBytes).isEmpty)
        index.insert(summary("c"), size: 30)  // replaced: newest, new size
        #expect(index.totalBytes == 60)
        #expect(index.keysByRecency() == ["b", "d", "a", "c"].map { CacheDigest($0) })
        index.remove(CacheDigest("d"))
        #expect(index.keysByRecency() == ["b", "a", "c"].map { CacheDigest($0) })
        #expect(index.totalBytes == 50)
        index.touch(CacheDigest("c"))
        index.touch(CacheDigest("b"))
        #expect(index.keysByRecency() == ["a", "c", "b"].map { CacheDigest($0) })
        #expect(index.oldest == CacheDigest("a") && index.newest == CacheDigest("b"))
    }

    @Test func theIndexMatchesAModelUnderRandomOperations() {
        var generator = SystemRandomNumberGenerator()
        var index = CacheIndex()
        var model: [(key: String, size: Int)] = []  // least recent first
        for step in 0..<5_000 {
            let name = "k\(Int.random(in: 0..<40, using: &generator))"
            switch Int.random(in: 0..<3, using: &generator) {
            case 0:
                let size = Int.random(in: 0..<100, using: &generator)
                index.insert(summary(name), size: size)
                model.removeAll { $0.key == name }
                model.append((name, size))
            case 1:
                index.touch(CacheDigest(name))
                if let position = model.firstIndex(where: { $0.key == name }) { model.append(model.remove(at: position)) }
            default:
                index.remove(CacheDigest(name))
                model.removeAll { $0.key == name }
            }
            #expect(index.keysByRecency() == model.map { CacheDigest($0.key) }, "step \(step)")
            #expect(index.totalBytes == model.map(\.size).reduce(0, +), "step \(step)")
            if index.keysByRecency() != model.map({ CacheDigest($0.key) }) { break }
        }
    }
}
