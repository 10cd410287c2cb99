import Foundation

/// The `Cache-Control` directives a private client cache acts on (RFC 9111 §5.2), parsed leniently:
/// names are case-insensitive, values may be quoted, unknown directives and malformed values are
/// ignored (a malformed `max-age` counts as absent, never as a crash or as "fresh forever").
struct CacheControl: Equatable, Sendable {
    /// `no-store`: never write this response (or a response to this request) to the cache.
    var noStore = false
    /// `no-cache`: a stored response must be revalidated before every use.
    var noCache = false
    /// `max-age=N` in seconds, if present and valid.
    var maxAge: Int?
    /// `must-revalidate`: a stale response is never served without revalidation, not even offline.
    var mustRevalidate = false
    /// `stale-if-error=N` (RFC 5861): how long past freshness the response may be served when the
    /// origin cannot be reached.
    var staleIfError: Int?

    init() {}

    /// Parses every `Cache-Control` field value given (a header may repeat or hold a list).
    init(_ values: [String]) {
        for value in values {
            for directive in Self.split(value) {
                let parts = directive.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = parts[0].trimmingCharacters(in: .whitespaces).lowercased()
                let argument = parts.count == 2 ? Self.unquote(parts[1].trimmingCharacters(in: .whitespaces)) : nil
                switch name {
                case "no-store": noStore = true
                case "no-cache": noCache = true
                case "must-revalidate", "proxy-revalidate": mustRevalidate = true
                case "max-age":
                    // RFC 9111 §1.2.2: delta-seconds; a duplicate keeps the lowest (most conservative).
                    if let seconds = argument.flatMap(Self.deltaSeconds) { maxAge = min(maxAge ?? .max, seconds) }
                case "stale-if-error":
                    if let seconds = argument.flatMap(Self.deltaSeconds) { staleIfError = min(staleIfError ?? .max, seconds) }
                default: break
                }
            }
        }
    }

    /// Non-negative decimal digits only; values beyond 2^31 saturate (RFC 9111 §1.2.2).
    static func deltaSeconds(_ text: String) -> Int? {
        guard !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return Int(text).map { min($0, 2_147_483_648) } ?? 2_147_483_648
    }

    /// Splits a directive list on commas outside quoted strings.
    private static func split(_ value: String) -> [String] {
        var result: [String] = []
        var current = ""
        var quoted = false
        var escaped = false
        for character in value {
            if escaped {
                current.append(character)
                escaped = false
                continue
            }
            switch character {
            case "\\" where quoted:
                escaped = true
                current.append(character)
            case "\"":
                quoted.toggle()
                current.append(character)
            case "," where !quoted:
                result.append(current)
                current = ""
            default:
                current.append(character)
            }
        }
        result.append(current)
        return result.filter { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
    }

    private static func unquote(_ text: String) -> String {
        guard text.count >= 2, text.first == "\"", text.last == "\"" else { return text }
        return String(text.dropFirst().dropLast())
    }
}
