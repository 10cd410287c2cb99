import Foundation
import RequestEngine

/// The version of a resource an edit was made on: the validators (RFC 9110 §8.8) of the response
/// the user saw when they made it. A queued write that carries one is sent conditionally, so it
/// never silently overwrites a version someone else wrote meanwhile: with `If-Match: etag` when the
/// entity tag is strong, else with `If-Unmodified-Since: lastModified`; a server that has moved on
/// answers `412 Precondition Failed`.
///
/// A weak entity tag (`W/"…"`) is never sent in `If-Match` (that field compares strongly, so it
/// could never match and every send would fail): such a base falls back to its `lastModified`, and
/// with neither the write goes unconditionally, as one without a base.
public struct EditBase: Sendable, Hashable, Codable {
    /// The `ETag` of the version edited, as the server sent it (quotes included).
    public var etag: String?
    /// The `Last-Modified` of the version edited, as the server sent it (an HTTP-date).
    public var lastModified: String?

    public init(etag: String? = nil, lastModified: String? = nil) {
        self.etag = etag
        self.lastModified = lastModified
    }

    /// Whether `etag` is a strong entity tag (`"…"`, not `W/"…"`).
    var hasStrongETag: Bool {
        guard let etag else { return false }
        return etag.hasPrefix("\"") && etag.hasSuffix("\"") && etag.count >= 2
    }

    /// The precondition header field a write made on this base is sent with, if any.
    var precondition: (name: String, value: String)? {
        if hasStrongETag, let etag { return ("If-Match", etag) }
        if let lastModified { return ("If-Unmodified-Since", lastModified) }
        return nil
    }

    /// `headers` with this base's precondition, unless they carry a precondition of their own
    /// (`If-Match`, `If-Unmodified-Since`, in any letter case): the app's own choice stands.
    func applied(to headers: [String: String]) -> [String: String] {
        guard let precondition else { return headers }
        let own = headers.keys.contains { name in
            name.caseInsensitiveCompare("If-Match") == .orderedSame || name.caseInsensitiveCompare("If-Unmodified-Since") == .orderedSame
        }
        guard !own else { return headers }
        var headers = headers
        headers[precondition.name] = precondition.value
        return headers
    }
}
