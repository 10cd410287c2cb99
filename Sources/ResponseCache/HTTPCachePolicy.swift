import Foundation
import Retry

/// The parts of RFC 9111 a private client cache needs: what may be stored, how long it is fresh,
/// how to revalidate it, and which stored response answers which request. Pure functions over
/// header dictionaries, so every rule is testable without a network or a disk.
enum HTTPCachePolicy {
    /// Statuses stored: successful reads. Errors never replace a good stored response.
    static let storableStatuses: Set<Int> = [200, 203]

    /// Response header fields never written to disk: cookies (RFC 9111 §7.3 leaves them to the
    /// user agent; here they are a secret), hop-by-hop fields, and the body's transfer framing
    /// (the stored body is already decoded, so its encoding and length fields would lie).
    static let unstoredHeaders: Set<String> = [
        "set-cookie", "set-cookie2", "connection", "keep-alive", "proxy-connection", "transfer-encoding",
        "upgrade", "te", "trailer", "proxy-authenticate", "proxy-authorization", "authorization", "cookie",
        "content-encoding", "content-length", "age",
    ]

    /// Request header fields that carry a credential: a response to such a request is stored only
    /// under a partition.
    static let credentialHeaders: Set<String> = ["authorization", "cookie", "proxy-authorization"]

    /// The value of `name` in `headers`, compared case-insensitively; repeated fields joined by ", ".
    static func value(_ name: String, in headers: [String: String]) -> String? {
        if let exact = headers[name] { return exact }
        let matches = headers.filter { $0.key.caseInsensitiveCompare(name) == .orderedSame }.map(\.value)
        return matches.isEmpty ? nil : matches.joined(separator: ", ")
    }

    static func cacheControl(_ headers: [String: String]) -> CacheControl {
        CacheControl(value("Cache-Control", in: headers).map { [$0] } ?? [])
    }

    /// Whether a request carries a credential (`Authorization`, `Cookie`).
    static func carriesCredential(_ headers: [String: String]) -> Bool {
        headers.keys.contains { credentialHeaders.contains($0.lowercased()) }
    }

    /// The header names a response varies on, lower-cased and sorted; nil for `Vary: *` (never
    /// stored: no later request can be shown to match).
    static func varyNames(_ responseHeaders: [String: String]) -> [String]? {
        guard let vary = value("Vary", in: responseHeaders) else { return [] }
        let names = vary.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        if names.contains("*") { return nil }
        return Array(Set(names)).sorted()
    }

    /// The digest of a request's values for `names` (an absent field differs from an empty one);
    /// nil when there are no names. Values are never stored, only this digest.
    static func varyDigest(names: [String], requestHeaders: [String: String]) -> CacheDigest? {
        guard !names.isEmpty else { return nil }
        var text = ""
        for name in names {
            text += name
            if let value = value(name, in: requestHeaders) {
                text += "=" + value.trimmingCharacters(in: .whitespaces)
            } else {
                text += "\u{0}absent"
            }
            text += "\n"
        }
        return CacheDigest(text)
    }

    /// The headers of `response` that may be stored.
    static func storableHeaders(_ headers: [String: String]) -> [String: String] {
        headers.filter { !unstoredHeaders.contains($0.key.lowercased()) }
    }

    /// The URL as written to disk: no user-info, no fragment, and no query values (only their
    /// names), since a query value may be a credential. Matching never uses it (the key digest does).
    static func storedURL(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "" }
        components.user = nil
        components.password = nil
        components.fragment = nil
        if let items = components.queryItems {
            components.queryItems = items.isEmpty ? nil : items.map { URLQueryItem(name: $0.name, value: nil) }
        }
        return components.string ?? ""
    }

    /// How long a stored response is fresh: the stricter of the server's explicit lifetime
    /// (`max-age`, else `Expires` − `Date`) and the caller's `staleTime`; `no-cache` makes it zero.
    /// Without an explicit lifetime, `staleTime`.
    static func freshnessLifetime(headers: [String: String], staleTime: Duration) -> Duration {
        let control = cacheControl(headers)
        if control.noCache { return .zero }
        var explicit: Duration?
        if let maxAge = control.maxAge {
            explicit = .seconds(maxAge)
        } else if let expiresText = value("Expires", in: headers) {
            // RFC 9111 §5.3: an invalid date (such as "0") means already expired.
            guard let expires = HTTPDate.parse(expiresText) else { return .zero }
            let date = value("Date", in: headers).flatMap { HTTPDate.parse($0) }
            if let date {
                explicit = .clamped(seconds: expires.timeIntervalSince(date), upperBound: .seconds(Int64(Int32.max)))
            } else {
                explicit = .zero  // no Date to measure against: revalidate
            }
        }
        guard let explicit else { return max(.zero, staleTime) }
        return min(explicit, max(.zero, staleTime))
    }

    /// The age of a stored response at `now`: time since it was stored plus the `Age` it arrived
    /// with (a clock that went backwards counts as zero).
    static func age(of stored: StoredResponse, initialAge: Duration, now: Date) -> Duration {
        .clamped(seconds: now.timeIntervalSince(stored.storedAt), upperBound: .seconds(Int64(Int32.max))) + initialAge
    }

    /// The validators to send when revalidating `stored`.
    static func conditionalHeaders(for stored: StoredResponse) -> [String: String] {
        var headers: [String: String] = [:]
        if let etag = stored.header("ETag") { headers["If-None-Match"] = etag }
        if let modified = stored.header("Last-Modified") { headers["If-Modified-Since"] = modified }
        return headers
    }

    /// `stored` updated by a 304's headers (RFC 9111 §4.3.4): the 304's fields replace the stored
    /// ones with the same name (except those never stored), and it counts as received now.
    static func refreshed(_ stored: StoredResponse, with notModifiedHeaders: [String: String], now: Date) -> StoredResponse {
        var updated = stored
        var headers = stored.headers
        for (name, value) in storableHeaders(notModifiedHeaders) {
            if let existing = headers.keys.first(where: { $0.caseInsensitiveCompare(name) == .orderedSame }) {
                headers[existing] = nil
            }
            headers[name] = value
        }
        updated.headers = headers
        updated.storedAt = now
        return updated
    }
}
