import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(os)
import os
#else
import Synchronization
#endif

/// An HTTP response's status and header fields as its session received them: every field in the
/// order it arrived, a repeated field as separate fields (two `Set-Cookie` stay two), each name as
/// the server spelled it.
///
/// What the engine carries from the session to the caller. `AsyncRequestEngine.response(for:)`
/// hands back its `httpURLResponse`; `responseWithHead(for:)` hands back the head itself, so a
/// caller that reads fields of its own (a generated OpenAPI client through `ResilienceTransport`)
/// never has Foundation build a response. On Linux that initializer is the dearest step of a
/// small request: it canonicalises every name and parses `Content-Type` character by character
/// (Benchmarks/README.md, "A generated OpenAPI client over ResilienceTransport").
///
/// ```swift
/// let (data, head) = try await engine.responseWithHead(for: request)
/// let cookies = head.fields.filter { $0.name.lowercased() == "set-cookie" }.map(\.value)
/// ```
public struct ResponseHead: Sendable {
    /// One header field as received.
    public struct Field: Sendable, Hashable {
        public var name: String
        public var value: String

        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// One reference, so a head costs a result tuple no more than an `HTTPURLResponse` did (the
    /// engine keeps its async frames small; Benchmarks/README.md).
    private let storage: Storage

    /// The head of a Foundation response: its status, its URL and its fields (in
    /// `allHeaderFields`' order, repeated fields already joined by Foundation). `httpURLResponse`
    /// is `response` itself.
    public init(_ response: HTTPURLResponse) {
        storage = Storage(foundation: response)
    }

    /// A head made of the fields a session received, for `url`; `nil` for a status outside
    /// 100...999. Nothing is parsed or canonicalised until `httpURLResponse` is read.
    public init?(url: URL, statusCode: Int, httpVersion: String = "HTTP/1.1", fields: [Field]) {
        guard (100...999).contains(statusCode) else { return nil }
        storage = Storage(url: url, statusCode: statusCode, httpVersion: httpVersion, fields: fields)
    }

    /// The status code.
    public var statusCode: Int { storage.statusCode }

    /// The URL that answered (after redirects).
    public var url: URL? { storage.url }

    /// The header fields in the order received, repeated ones separate. For a head made from an
    /// `HTTPURLResponse`, its `allHeaderFields` (Foundation has joined repeated fields already, and
    /// gives no order).
    public var fields: [Field] {
        if let fields = storage.fields { return fields }
        return storage.foundation?.allHeaderFields.compactMap { name, value in
            guard let name = name as? String, let value = value as? String else { return nil }
            return Field(name: name, value: value)
        } ?? []
    }

    /// The value of field `name` (compared case-insensitively); a repeated field's values joined
    /// in order with `", "`, as `HTTPURLResponse` reports them. `nil` when absent.
    public func value(forHTTPHeaderField name: String) -> String? {
        guard let fields = storage.fields else { return storage.foundation?.value(forHTTPHeaderField: name) }
        var joined: String?
        for field in fields where Self.sameName(field.name, name) {
            if let first = joined {
                joined = first + ", " + field.value
            } else {
                joined = field.value
            }
        }
        return joined
    }

    /// The head as Foundation's response, made on first use and kept: each name once (the first
    /// spelling), a repeated field's values joined with `", "` in order.
    public var httpURLResponse: HTTPURLResponse { storage.httpURLResponse }

    /// ASCII case-insensitive equality of two field names, without allocating.
    static func sameName(_ lhs: String, _ rhs: String) -> Bool {
        guard lhs.utf8.count == rhs.utf8.count else { return false }
        var left = lhs.utf8.makeIterator()
        var right = rhs.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return true
            case (let l?, let r?):
                if l == r { continue }
                let lower = l | 0x20
                guard lower == r | 0x20, lower >= UInt8(ascii: "a"), lower <= UInt8(ascii: "z") else { return false }
            default: return false
            }
        }
    }

    /// Whether two of `names` differ only in letter case: compared pairwise, without allocating,
    /// for the usual handful of names; through lower-cased copies past 32 (a hostile server's
    /// thousands of fields must not cost a quadratic scan).
    static func hasCaseVariants(_ names: Dictionary<String, String>.Keys) -> Bool {
        guard names.count > 1 else { return false }
        guard names.count <= 32 else { return Set(names.lazy.map { $0.lowercased() }).count < names.count }
        var first = names.startIndex
        while first != names.endIndex {
            var second = names.index(after: first)
            while second != names.endIndex {
                if sameName(names[first], names[second]) { return true }
                second = names.index(after: second)
            }
            first = names.index(after: first)
        }
        return false
    }

    /// The fields one per name compared case-insensitively (the first spelling), a repeated
    /// field's values joined with `", "` in order.
    static func joiningCaseVariants(_ fields: [Field]) -> [String: String] {
        var headers: [String: String] = [:]
        var spelling: [String: String] = [:]
        for field in fields {
            let key = field.name.lowercased()
            if let name = spelling[key] {
                headers[name, default: ""] += ", " + field.value
            } else {
                spelling[key] = field.name
                headers[field.name] = field.value
            }
        }
        return headers
    }

    private final class Storage: Sendable {
        let statusCode: Int
        let url: URL?
        let httpVersion: String
        /// The fields as received; nil for a head made from a Foundation response.
        let fields: [Field]?
        let foundation: HTTPURLResponse?
        /// `httpURLResponse`, once made (fields heads only). The lock is held in place, not boxed:
        /// one allocation a response fewer.
        #if canImport(os)
        private let built = OSAllocatedUnfairLock<HTTPURLResponse?>(initialState: nil)
        #else
        private let built = Mutex<HTTPURLResponse?>(nil)
        #endif

        init(foundation: HTTPURLResponse) {
            statusCode = foundation.statusCode
            url = foundation.url
            httpVersion = "HTTP/1.1"
            fields = nil
            self.foundation = foundation
        }

        init(url: URL, statusCode: Int, httpVersion: String, fields: [Field]) {
            self.statusCode = statusCode
            self.url = url
            self.httpVersion = httpVersion
            self.fields = fields
            foundation = nil
        }

        var httpURLResponse: HTTPURLResponse {
            if let foundation { return foundation }
            if let made = built.withLock({ $0 }) { return made }
            let made = makeResponse()
            // Two readers may both have made one: the first stored is everyone's.
            return built.withLock { stored in
                if let stored { return stored }
                stored = made
                return made
            }
        }

        private func makeResponse() -> HTTPURLResponse {
            let fields = fields ?? []
            var headers: [String: String] = [:]
            headers.reserveCapacity(fields.count)
            for field in fields {
                if let joined = headers[field.name] {
                    headers[field.name] = joined + ", " + field.value
                } else {
                    headers[field.name] = field.value
                }
            }
            // Foundation keys its fields by a canonical spelling: two spellings of one name would
            // keep one value. Rare (servers spell a name one way), so looked for, not assumed.
            if ResponseHead.hasCaseVariants(headers.keys) { headers = ResponseHead.joiningCaseVariants(fields) }
            // Foundation's initializer accepts any status in 100...999 (checked when the head was made).
            guard let url, let response = HTTPURLResponse(url: url, statusCode: statusCode, httpVersion: httpVersion, headerFields: headers)
            else { preconditionFailure("HTTPURLResponse refused status \(statusCode)") }
            return response
        }
    }
}
