import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting
import Testing

@testable import Observability

@Suite("PathTemplate: identifiers collapsed, secrets never part of a template")
struct PathTemplateTests {
    let template = PathTemplate.collapsingIdentifiers

    @Test(arguments: [
        ("https://api.example.com/users/42", "/users/{id}"),
        ("https://api.example.com/users/42/orders/0017", "/users/{id}/orders/{id}"),
        ("https://api.example.com/items/550e8400-e29b-41d4-a716-446655440000", "/items/{id}"),
        ("https://api.example.com/items/550E8400-E29B-41D4-A716-446655440000/tags", "/items/{id}/tags"),
        ("https://api.example.com/objects/507f1f77bcf86cd799439011", "/objects/{id}"),
        ("https://api.example.com/commits/3f786850e387550fdab836ed7e6dc881de23001b", "/commits/{id}"),
        ("https://api.example.com/v2/users", "/v2/users"),
        ("https://api.example.com/cafe/deadbeef", "/cafe/deadbeef"),
        ("https://api.example.com/feed/", "/feed/"),
        ("https://api.example.com", "/"),
        ("https://api.example.com/", "/"),
        ("https://api.example.com?x=1", "/"),
        ("https://api.example.com/search?q=secret&access_token=abc123", "/search"),
        ("https://api.example.com/a/b#fragment-token", "/a/b"),
        ("https://alice:hunter2@api.example.com:8443/me/7", "/me/{id}"),
        ("https://api.example.com/cart;jsessionid=ABC123/items;v=2", "/cart/items"),
        ("https://api.example.com/users/12;session=x", "/users/{id}"),
        ("http://[::1]:8080/v1/ping", "/v1/ping"),
        ("https://api.example.com/files/report%20final.pdf", "/files/report%20final.pdf"),
        ("https://api.example.com/12345678-1234-1234-1234-12345678", "/12345678-1234-1234-1234-12345678"),
    ])
    func defaultTemplateOfURL(input: String, expected: String) {
        #expect(template.template(for: url(input)) == expected)
    }

    @Test func relativeURLsUseTheirResolvedPath() {
        let base = url("https://api.example.com/v1/")
        let relative = URL(string: "users/99?token=t", relativeTo: base)
        #expect(relative.map { template.template(for: $0) } == "/v1/users/{id}")
    }

    @Test func templateForAPathIgnoresItsQuery() {
        #expect(template.template(forPath: "/users/42?tab=1") == "/users/{id}")
        #expect(template.template(forPath: "") == "/")
        #expect(template.template(forPath: "users/7#x") == "users/{id}")
    }

    @Test func identifierSegments() {
        #expect(PathTemplate.isIdentifier("0"))
        #expect(PathTemplate.isIdentifier("123456789012345678901234567890"))
        #expect(PathTemplate.isIdentifier("550e8400-e29b-41d4-a716-446655440000"))
        #expect(PathTemplate.isIdentifier("550e8400e29b41d4a716446655440000"))
        #expect(!PathTemplate.isIdentifier(""))
        #expect(!PathTemplate.isIdentifier("v2"))
        #expect(!PathTemplate.isIdentifier("-42"))
        #expect(!PathTemplate.isIdentifier("deadbeefdeadbeefdeadbeef"))  // no decimal digit: could be a word
        #expect(!PathTemplate.isIdentifier("550e8400-e29b-41d4-a716-44665544000g"))
        #expect(!PathTemplate.isIdentifier("abc123"))
    }

    @Test func customTemplateReceivesThePathWithoutQueryOrUserInfo() {
        let seen = LockedBox<[String]>([])
        let custom = PathTemplate.custom { path in
            seen.mutate { $0.append(path) }
            return "/fixed"
        }
        #expect(custom.template(for: url("https://u:p@api.example.com/a/b;x=1?token=abc#frag")) == "/fixed")
        #expect(custom.template(for: url("https://api.example.com")) == "/fixed")
        #expect(seen.value == ["/a/b;x=1", "/"])
    }

    @Test func wordAtATimeSearchFindsTheSameByteAsAPlainLoop() {
        var generator = SplitMix64(seed: 5)
        let alphabet = Array("/;?#:a0".utf8) + [0x2E, 0x80, 0xFF, 0x00]
        for _ in 0..<5_000 {
            let length = Int.random(in: 0...40, using: &generator)
            let bytes = (0..<length).map { _ in alphabet.randomElement(using: &generator) ?? 0 }
            let start = Int.random(in: 0...length, using: &generator)
            let (a, b, c) = (UInt8(ascii: "/"), UInt8(ascii: ";"), UInt8(ascii: "#"))
            let expected = bytes[start...].firstIndex { $0 == a || $0 == b || $0 == c } ?? length
            let found = bytes.withUnsafeBufferPointer { URLPathScanner.firstIndex(in: $0, from: start, of: a, b, c) }
            #expect(found == expected, "\(bytes) from \(start)")
        }
    }

    @Test func theHashOfATemplateDependsOnlyOnItsBytes() {
        // Written in one piece, byte by byte, or in odd chunks: the same hash.
        let bytes = Array("/users/{id}/orders/{id}/items".utf8)
        func hash(chunks: [Int]) -> Int {
            var hasher = TemplateHasher(seed: 99, discriminator: 1)
            bytes.withUnsafeBufferPointer { buffer in
                var start = 0
                for size in chunks {
                    let end = min(start + size, buffer.count)
                    hasher.write(UnsafeBufferPointer(rebasing: buffer[start..<end]))
                    start = end
                }
                while start < buffer.count {
                    hasher.write(byte: buffer[start])
                    start += 1
                }
            }
            return hasher.finalize()
        }
        let whole = hash(chunks: [bytes.count])
        #expect(hash(chunks: []) == whole)
        #expect(hash(chunks: [3, 5, 8, 1, 13]) == whole)
        #expect(hash(chunks: [8, 8, 8]) == whole)
        var other = TemplateHasher(seed: 99, discriminator: 2)  // another method
        bytes.withUnsafeBufferPointer { other.write($0) }
        #expect(other.finalize() != whole)
    }
}

/// A value behind a lock, for closures that record what they saw.
final class LockedBox<Value: Sendable>: Sendable {
    private let lock: Locked<Value>
    init(_ value: Value) { lock = Locked(value) }
    var value: Value { lock.withLock { $0 } }
    func mutate(_ body: (inout Value) -> Void) { lock.withLock { body(&$0) } }
}
