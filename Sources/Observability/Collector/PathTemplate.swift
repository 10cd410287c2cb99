import Foundation

/// Turns a request URL into the endpoint template that metrics are grouped by, such as
/// `/users/{id}/orders`.
///
/// The template is built from the URL's path only: scheme, user info, host, port, query and
/// fragment never reach it, so credentials in user info and tokens in query strings cannot become
/// metric labels. Matrix parameters (`;jsessionid=…` in a segment) are dropped too.
///
/// The default, `collapsingIdentifiers`, replaces each path segment that looks like an identifier
/// with `{id}`:
/// - all ASCII digits (`42`, `0012`);
/// - a UUID in 8-4-4-4-12 hexadecimal form, any letter case;
/// - 16 or more hexadecimal digits with at least one decimal digit among them (object ids, hashes).
///
/// Other segments are kept as they appear in the URL (percent-encoded). Slugs, user names and
/// opaque tokens are not recognised: supply a `custom` template for APIs that put them in paths.
/// Whatever the template, the collector caps the number of distinct endpoints.
public struct PathTemplate: Sendable {
    enum Kind: Sendable {
        case collapsingIdentifiers
        case custom(@Sendable (String) -> String)
    }

    let kind: Kind

    /// The placeholder that replaces identifier segments: `{id}`.
    public static let identifierPlaceholder = "{id}"

    /// Numeric, UUID and long hexadecimal segments become `{id}` (see the type's documentation).
    /// Computing it allocates nothing once the endpoint has been seen.
    public static let collapsingIdentifiers = PathTemplate(kind: .collapsingIdentifiers)

    /// Your own template function. It receives the URL's path, percent-encoded, without query and
    /// fragment (`"/users/42/avatar"`; `"/"` for an empty path), and returns the template. It runs
    /// for every `started` and `deduplicated` event, so keep it cheap; returning a string literal
    /// or a string of at most 15 UTF-8 bytes avoids an allocation. Compose with the default via
    /// `PathTemplate.collapsingIdentifiers.template(forPath:)`.
    public static func custom(_ template: @escaping @Sendable (_ path: String) -> String) -> PathTemplate {
        PathTemplate(kind: .custom(template))
    }

    /// The template for `url`.
    public func template(for url: URL) -> String {
        switch kind {
        case .collapsingIdentifiers:
            return URLPathScanner.withPath(of: url) { path in
                var builder = TemplateBytes()
                URLPathScanner.writeTemplate(ofPath: path, into: &builder)
                return builder.string
            }
        case .custom(let template):
            return template(URLPathScanner.percentEncodedPath(of: url))
        }
    }

    /// The template for a path such as `"/users/42?tab=1"`. Anything from the first `?` or `#`
    /// on is ignored. (Unlike `template(for:)`, this does not look for a scheme or a host.)
    public func template(forPath path: String) -> String {
        var path = path
        if let end = path.firstIndex(where: { $0 == "?" || $0 == "#" }) { path = String(path[..<end]) }
        switch kind {
        case .collapsingIdentifiers:
            return path.withUTF8 { bytes in
                var builder = TemplateBytes()
                URLPathScanner.writeTemplate(ofPath: bytes, into: &builder)
                return builder.string
            }
        case .custom(let template):
            return template(path.isEmpty ? "/" : path)
        }
    }

    /// Whether the default template replaces this path segment with `{id}`.
    public static func isIdentifier(_ segment: some StringProtocol) -> Bool {
        var segment = String(segment)
        return segment.withUTF8 { URLPathScanner.isIdentifier($0) }
    }
}
