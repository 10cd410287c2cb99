import Foundation

/// Stored responses by path — one path, or everything under one — that the cache finds from its
/// index of stored URLs, without running a rule once per stored URL: `markStale(matching:)`.
///
/// `markStale(where:)` runs the app's closure on every distinct stored URL (5 000 URLs cost about
/// 3 ms on Linux, most of it Foundation's `URL.path`); a pattern costs a dictionary lookup and the
/// matches. Paths are compared as they appear in the URL (percent-encoded), without the query; a
/// trailing `/` does not count (`/items/` is `/items`). A `host`, when given, must match without
/// regard to case (the port is not compared); otherwise any host matches.
///
/// ```swift
/// cache.markStale(matching: [.pathPrefix("/notes"), .path("/me")])
/// ```
public struct CacheURLPattern: Sendable, Hashable, CustomStringConvertible {
    /// The path, normalized: it begins with `/` and does not end with one (unless it is `/`).
    public let path: String
    /// Whether paths under `path` match too (`/notes` matches `/notes/42` and `/notes/42/tags`,
    /// never `/notesX`).
    public let includesSubpaths: Bool
    /// The host, lowercased; `nil` matches every host.
    public let host: String?

    /// Exactly `path` (any query).
    public static func path(_ path: String, host: String? = nil) -> CacheURLPattern {
        CacheURLPattern(path: path, includesSubpaths: false, host: host)
    }

    /// `path` and every path under it (a segment boundary: `/notes` covers `/notes/42`, not
    /// `/notesX`).
    public static func pathPrefix(_ path: String, host: String? = nil) -> CacheURLPattern {
        CacheURLPattern(path: path, includesSubpaths: true, host: host)
    }

    private init(path: String, includesSubpaths: Bool, host: String?) {
        self.path = StoredURLParts.normalized(path: Substring(path))
        self.includesSubpaths = includesSubpaths
        self.host = host?.lowercased()
    }

    /// Whether `url` matches (the same test the index answers).
    public func matches(_ url: URL) -> Bool {
        matches(StoredURLParts(url.absoluteString))
    }

    func matches(_ parts: StoredURLParts) -> Bool {
        if let host, parts.host != host { return false }
        if parts.path == path { return true }
        guard includesSubpaths else { return false }
        return path == "/" || (parts.path.hasPrefix(path) && parts.path.utf8.dropFirst(path.utf8.count).first == UInt8(ascii: "/"))
    }

    public var description: String {
        "\(host ?? "*")\(path)\(includesSubpaths ? (path == "/" ? "**" : "/**") : "")"
    }
}

/// A stored URL's host (lowercased, without user or port) and path (normalized as
/// `CacheURLPattern` compares them), read from its string without Foundation's parser.
struct StoredURLParts: Sendable, Hashable {
    let host: String
    let path: String

    init(_ url: String) {
        let bytes = url.utf8
        var start = bytes.startIndex
        if let scheme = url.range(of: "://") { start = scheme.upperBound }
        var authorityEnd = start
        while authorityEnd < bytes.endIndex, ![UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "#")].contains(bytes[authorityEnd]) {
            authorityEnd = bytes.index(after: authorityEnd)
        }
        var authority = url[start..<authorityEnd]
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
            authority = authority[...close]
        } else if let colon = authority.firstIndex(of: ":") {
            authority = authority[..<colon]
        }
        host = authority.lowercased()
        var pathEnd = authorityEnd
        while pathEnd < bytes.endIndex, bytes[pathEnd] != UInt8(ascii: "?"), bytes[pathEnd] != UInt8(ascii: "#") {
            pathEnd = bytes.index(after: pathEnd)
        }
        path = Self.normalized(path: url[authorityEnd..<pathEnd])
    }

    /// `/` first, no `/` last (unless the path is `/`).
    static func normalized(path: Substring) -> String {
        var path = path
        while path.count > 1, path.hasSuffix("/") { path = path.dropLast() }
        return path.hasPrefix("/") ? String(path) : "/" + path
    }

    /// The paths a pattern with subpaths may name to reach this one: `/`, `/a`, `/a/b` for `/a/b`.
    var enclosingPaths: [String] {
        var paths = ["/"]
        guard path != "/" else { return paths }
        var index = path.utf8.index(after: path.utf8.startIndex)
        while index < path.utf8.endIndex {
            if path.utf8[index] == UInt8(ascii: "/") { paths.append(String(path[..<index])) }
            index = path.utf8.index(after: index)
        }
        paths.append(path)
        return paths
    }
}
