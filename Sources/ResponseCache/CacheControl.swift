import Foundation

/// The `Cache-Control` directives a private client cache acts on (RFC 9111 §5.2, RFC 5861), from
/// a request or a response.
///
/// Parsed as the RFC's grammar says (§5.2: `cache-directive = token [ "=" ( token / quoted-string ) ]`):
/// names are case-insensitive; an argument may be a token or a quoted string (§5.2: recipients
/// accept both forms, so `max-age="60"` is 60); no whitespace around `=`, so `max-age =60` and
/// `max-age= 60` are not a valid `max-age`; commas inside a quoted string do not split directives,
/// so `ext="max-age=9"` is one unknown directive. Unknown directives are ignored. The work is
/// linear in the field's length whatever it holds.
struct CacheControl: Equatable, Sendable {
    /// A directive that takes delta-seconds (RFC 9111 §1.2.2).
    enum Seconds: Equatable, Sendable {
        case absent
        /// The value, saturated at 2^31 (§1.2.2: "a cache ... MUST ... use 2147483648").
        case value(Int)
        /// Present but not delta-seconds (negative, fractional, single-quoted, empty…), or given
        /// twice with different values: a response with such freshness is stale (§4.2.1).
        case invalid

        var seconds: Int? {
            if case .value(let seconds) = self { return seconds }
            return nil
        }
    }

    /// `no-store`: never written to the cache (request or response).
    var noStore = false
    /// `no-cache` without field names: a stored response is never used without validation and
    /// never served stale (response, §5.2.2.4); the stored response is not used without
    /// validation (request, §5.2.1.4).
    var noCache = false
    /// `no-cache="a, b"` (response): the listed fields are left out when the stored response is
    /// reused without validation (§5.2.2.4), lower-cased.
    var noCacheFields: [String] = []
    /// `max-age`: the response's explicit lifetime (response), or the oldest response the client
    /// accepts (request, §5.2.1.1). The first occurrence counts; a second one with another value
    /// makes it `.invalid` (§4.2.1: "either the first occurrence should be used or the response
    /// should be considered stale" — a conflicting repeat is treated as stale).
    var maxAge = Seconds.absent
    /// `max-stale[=N]` (request): stale responses accepted, up to N seconds past their lifetime
    /// (`Int.max` when no value is given, §5.2.1.2).
    var maxStale: Int?
    /// `min-fresh=N` (request): the response must stay fresh for at least N more seconds.
    var minFresh: Int?
    /// `only-if-cached` (request): never contact the network (§5.2.1.7).
    var onlyIfCached = false
    /// `must-revalidate` (response): never served stale (§5.2.2.2). `proxy-revalidate` and
    /// `s-maxage` are for shared caches, and this is a private one: they are ignored.
    var mustRevalidate = false
    /// `must-understand` (response, §5.2.2.3): stored only when the status code is understood, and
    /// then `no-store` does not apply.
    var mustUnderstand = false
    /// `public` (response): heuristic freshness applies to any status (§4.2.2).
    var isPublic = false
    /// `stale-while-revalidate=N` (RFC 5861 §3): within N seconds past its lifetime the stale
    /// response may be served while it is revalidated in the background.
    var staleWhileRevalidate: Int?
    /// `stale-if-error=N` (RFC 5861 §4; response or request): when the origin fails, the stale
    /// response may be served up to N seconds past its lifetime, and no longer.
    var staleIfError: Int?

    init() {}

    /// Parses every `Cache-Control` field value given (a field may repeat or hold a list).
    init(_ values: [String]) {
        for value in values {
            Self.forEachDirective(in: value) { name, argument in apply(name: name, argument: argument) }
        }
    }

    /// Parses one field value (repeated fields arrive joined by ", ", which parses the same).
    init(_ value: String?) {
        self.init(value.map { [$0] } ?? [])
    }

    private mutating func apply(name: Substring, argument: Argument?) {
        switch name.lowercased() {
        case "no-store": noStore = true
        case "no-cache":
            switch argument {
            case .quoted, .token:  // field names (§5.2: either form is accepted)
                noCacheFields += (argument?.text ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
            case .malformed, nil:  // when in doubt, the stricter reading
                noCache = true
            }
        case "max-age":
            let parsed = argument.flatMap { Self.deltaSeconds($0.text) }
            switch (maxAge, parsed) {
            case (.absent, .some(let seconds)): maxAge = .value(seconds)
            case (.absent, nil): maxAge = .invalid
            case (.value(let first), .some(let seconds)) where first == seconds: break
            default: maxAge = .invalid
            }
        case "max-stale":
            if let argument {
                if let seconds = Self.deltaSeconds(argument.text) { maxStale = min(maxStale ?? .max, seconds) }
            } else {
                maxStale = .max
            }
        case "min-fresh":
            if let seconds = argument.flatMap({ Self.deltaSeconds($0.text) }) { minFresh = max(minFresh ?? 0, seconds) }
        case "only-if-cached": onlyIfCached = true
        case "must-revalidate": mustRevalidate = true
        case "must-understand": mustUnderstand = true
        case "public": isPublic = true
        case "stale-while-revalidate":
            if let seconds = argument.flatMap({ Self.deltaSeconds($0.text) }) { staleWhileRevalidate = min(staleWhileRevalidate ?? .max, seconds) }
        case "stale-if-error":
            if let seconds = argument.flatMap({ Self.deltaSeconds($0.text) }) { staleIfError = min(staleIfError ?? .max, seconds) }
        default: break
        }
    }

    /// Non-negative decimal digits only (leading zeros allowed); values past 2^31 saturate to it
    /// (RFC 9111 §1.2.2). Anything else — a sign, a point, a letter, a space — is not delta-seconds.
    static func deltaSeconds<Text: StringProtocol>(_ text: Text) -> Int? {
        guard !text.isEmpty else { return nil }
        var value = 0
        for byte in text.utf8 {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = min(value * 10 + Int(byte - UInt8(ascii: "0")), 2_147_483_648)
        }
        return value
    }

    /// A directive's argument: a token as written, the unescaped content of a quoted string, or
    /// something after `=` that is neither (an invalid value for any directive that takes one).
    enum Argument: Equatable {
        case token(Substring)
        case quoted(String)
        case malformed

        var text: String {
            switch self {
            case .token(let token): String(token)
            case .quoted(let content): content
            case .malformed: ""
            }
        }
    }

    /// Calls `body` for each directive of `value`, in order. A member whose name is not a token
    /// (whitespace before `=`, an empty name) is skipped; one whose argument is neither a token nor
    /// one quoted string (whitespace after `=`, an unterminated quote) comes with `.malformed`.
    static func forEachDirective(in value: String, _ body: (Substring, Argument?) -> Void) {
        let utf8 = value.utf8
        var index = utf8.startIndex
        while index < utf8.endIndex {
            // One list member: up to the next comma outside a quoted string.
            var end = index
            var quoted = false
            var escaped = false
            while end < utf8.endIndex {
                let byte = utf8[end]
                if escaped {
                    escaped = false
                } else if quoted {
                    if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { quoted = false }
                } else if byte == UInt8(ascii: "\"") {
                    quoted = true
                } else if byte == UInt8(ascii: ",") {
                    break
                }
                end = utf8.index(after: end)
            }
            if let (name, argument) = directive(value[index..<end]) { body(name, argument) }
            index = end < utf8.endIndex ? utf8.index(after: end) : end
        }
    }

    /// One member, trimmed of the list's optional whitespace: `name` or `name=argument`.
    private static func directive(_ member: Substring) -> (Substring, Argument?)? {
        let trimmed = member.trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
        guard !trimmed.isEmpty else { return nil }
        let text = Substring(trimmed)
        guard let equals = text.firstIndex(of: "=") else {
            return isToken(text) ? (text, nil) : nil
        }
        let name = text[..<equals]
        let raw = text[text.index(after: equals)...]
        guard isToken(name) else { return nil }
        if raw.first == "\"" {
            return (name, unquote(raw).map(Argument.quoted) ?? .malformed)
        }
        return (name, isToken(raw) ? .token(raw) : .malformed)
    }

    /// RFC 9110 §5.6.2 `token`: one or more tchar.
    private static func isToken(_ text: Substring) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                    return true
                default:
                    return "!#$%&'*+-.^_`|~".utf8.contains(byte)
                }
            }
    }

    /// The content of a whole quoted string (RFC 9110 §5.6.4), backslash escapes removed; nil
    /// when `text` is not exactly one quoted string.
    private static func unquote(_ text: Substring) -> String? {
        var content = ""
        var escaped = false
        var closed = false
        for character in text.dropFirst() {
            if closed { return nil }  // something after the closing quote
            if escaped {
                content.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "\"" {
                closed = true
            } else {
                content.append(character)
            }
        }
        return closed ? content : nil
    }
}
