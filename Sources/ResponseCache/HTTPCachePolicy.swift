import Foundation
import Retry

/// The parts of RFC 9111 a private client cache needs: what may be stored, how long it is fresh,
/// how old it is, how to revalidate it, which stored response answers which request, and which
/// stored responses a `304` or a `HEAD` response updates. Pure functions over header
/// dictionaries, so every rule is testable without a network or a disk.
enum HTTPCachePolicy {
    /// Statuses a cache may store without explicit freshness, and give a heuristic lifetime
    /// (RFC 9110 §15.1; 206 is left out: partial content is not stored).
    static let heuristicallyCacheable: Set<Int> = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501]

    /// The final statuses RFC 9110 defines, less 206 (partial content is not stored) and 304 (a
    /// validation answer, never stored as a response): what `must-understand` asks about (§5.2.2.3).
    static let understoodStatuses: Set<Int> = [
        200, 201, 202, 203, 204, 205, 300, 301, 302, 303, 305, 307, 308,
        400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421, 422, 426,
        500, 501, 502, 503, 504, 505,
    ]

    /// Hop-by-hop fields (RFC 9110 §7.6.1) and the proxy's own: never stored (§3.1), never
    /// updated from a `304`.
    static let hopByHopHeaders: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer",
        "proxy-authenticate", "proxy-authentication-info", "proxy-authorization",
    ]

    /// Response header fields never written to disk: hop-by-hop fields; cookies (§7.3 leaves them
    /// to the user agent; here they are a secret) and credentials; `Content-Length` (the stored
    /// body's length is known, a transport that decoded the body reports the encoded one, and
    /// §3.2 forbids updating it); `Age` (recomputed on every use, §4). `Content-Encoding` is kept:
    /// the body is stored as the transport delivered it, so the stored answer repeats the network's.
    static let unstoredHeaders: Set<String> = hopByHopHeaders.union([
        "set-cookie", "set-cookie2", "authorization", "cookie", "content-length", "age",
    ])

    /// Request header fields that carry a credential: a response to such a request is stored only
    /// under a partition.
    static let credentialHeaders: Set<String> = ["authorization", "cookie", "proxy-authorization"]

    /// Request header fields that make a request conditional or partial: such a request is the
    /// caller's own business, passed through untouched (its `304` or `206` never reaches the store).
    static let conditionalHeaders: Set<String> = ["if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range", "range"]

    /// The longest heuristic lifetime (Firefox's bound): a response last modified years ago is not
    /// fresh for months.
    static let maximumHeuristicLifetime = Duration.seconds(7 * 24 * 3600)

    /// The largest delta-seconds (RFC 9111 §1.2.2): lifetimes and ages saturate here.
    static let maximumDelta = Duration.seconds(2_147_483_648)

    // MARK: - Header access

    /// The value of `name` in `headers`, compared case-insensitively; repeated fields joined by ", ".
    static func value(_ name: String, in headers: [String: String]) -> String? {
        if let exact = headers[name] { return exact }
        var found: String?
        for (key, value) in headers where key.utf8.count == name.utf8.count && key.caseInsensitiveCompare(name) == .orderedSame {
            found = found.map { $0 + ", " + value } ?? value
        }
        return found
    }

    static func cacheControl(_ headers: [String: String]) -> CacheControl {
        CacheControl(value("Cache-Control", in: headers))
    }

    /// Whether a request carries a credential (`Authorization`, `Cookie`).
    static func carriesCredential(_ headers: [String: String]) -> Bool {
        headers.keys.contains { credentialHeaders.contains($0.lowercased()) }
    }

    /// Whether the caller made the request conditional or partial itself.
    static func isConditionalOrPartial(_ headers: [String: String]) -> Bool {
        headers.keys.contains { conditionalHeaders.contains($0.lowercased()) }
    }

    /// A request's directives: its `Cache-Control`, or — only when it has none — `Pragma:
    /// no-cache` read as `no-cache` (RFC 9111 §5.4).
    static func requestDirectives(_ headers: [String: String]) -> CacheControl {
        if value("Cache-Control", in: headers) != nil { return cacheControl(headers) }
        var control = CacheControl()
        if let pragma = value("Pragma", in: headers) {
            control.noCache = pragma.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).lowercased() == "no-cache" }
        }
        return control
    }

    // MARK: - Storing (§3)

    /// Whether a final response to a GET or HEAD may be stored by a private cache (§3): not
    /// `no-store` (unless `must-understand` with an understood status), not partial, and with an
    /// explicit lifetime, `public`, `private`, or a heuristically cacheable status.
    static func mayStore(status: Int, headers: [String: String], control: CacheControl) -> Bool {
        guard (200...599).contains(status), status != 206, status != 304 else { return false }
        if control.mustUnderstand {
            guard understoodStatuses.contains(status) else { return false }
        } else if control.noStore {
            return false
        }
        if control.maxAge != .absent || value("Expires", in: headers) != nil || control.isPublic { return true }
        if value("Cache-Control", in: headers).map(hasPrivateDirective) == true { return true }
        return heuristicallyCacheable.contains(status)
    }

    private static func hasPrivateDirective(_ value: String) -> Bool {
        var found = false
        CacheControl.forEachDirective(in: value) { name, _ in if name.lowercased() == "private" { found = true } }
        return found
    }

    /// The headers of a response that may be stored: none of `unstoredHeaders`, and none of the
    /// fields its `Connection` header names (§3.1).
    static func storableHeaders(_ headers: [String: String]) -> [String: String] {
        let named = Set((value("Connection", in: headers) ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
        return headers.filter { field in
            let name = field.key.lowercased()
            return !unstoredHeaders.contains(name) && !named.contains(name)
        }
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

    // MARK: - Vary (§4.1)

    /// The header names a response varies on, lower-cased and sorted; nil for `Vary: *` (never
    /// stored: no later request can be shown to match).
    static func varyNames(_ responseHeaders: [String: String]) -> [String]? {
        guard let vary = value("Vary", in: responseHeaders) else { return [] }
        let names = vary.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        if names.contains("*") { return nil }
        return Array(Set(names)).sorted()
    }

    /// Request header fields whose list members are case-insensitive and whose order carries no
    /// meaning (quality values say the preference): normalised by lower-casing and sorting.
    static let orderInsensitiveHeaders: Set<String> = ["accept-language", "accept-encoding", "accept-charset"]

    /// A request field's value as `Vary` compares it (§4.1: "normalizing both header field values
    /// in a way that is known to have identical semantics"): repeated fields combined, list members
    /// trimmed and joined by "," (whitespace around them carries no meaning), and for
    /// `orderInsensitiveHeaders` also lower-cased, stripped of inner whitespace and sorted.
    static func normalisedVaryValue(_ name: String, _ value: String) -> String {
        var members = value.split(separator: ",", omittingEmptySubsequences: false)
            .map { $0.trimmingCharacters(in: CharacterSet(charactersIn: " \t")) }
            .filter { !$0.isEmpty }
        if orderInsensitiveHeaders.contains(name) {
            members = members.map { $0.lowercased().filter { $0 != " " && $0 != "\t" } }.sorted()
        }
        return members.joined(separator: ",")
    }

    /// The digest of a request's normalised values for `names` (an absent field differs from an
    /// empty one); nil when there are no names. Values are never stored, only this digest.
    static func varyDigest(names: [String], requestHeaders: [String: String]) -> CacheDigest? {
        guard !names.isEmpty else { return nil }
        var text = ""
        for name in names {
            text += name
            if let value = value(name, in: requestHeaders) {
                text += "=" + normalisedVaryValue(name, value)
            } else {
                text += "\u{0}absent"
            }
            text += "\n"
        }
        return CacheDigest(text)
    }

    /// Whether `stored` may answer a request with these headers: its `Vary` fields match; or it
    /// varies on `Accept-Language` alone, says its `Content-Language`, and that is the language
    /// the request prefers most (§4.1: "when a selecting header field has a known mechanism for
    /// doing so (e.g., qvalues on Accept and similar request header fields), that mechanism can
    /// be used").
    static func matches(_ stored: StoredResponse, requestHeaders: [String: String]) -> Bool {
        if stored.varyDigest == varyDigest(names: stored.varyNames, requestHeaders: requestHeaders) { return true }
        guard stored.varyNames == ["accept-language"],
            let language = stored.header("Content-Language")?.trimmingCharacters(in: .whitespaces).lowercased(),
            !language.isEmpty, !language.contains(","),
            let accepted = value("Accept-Language", in: requestHeaders)
        else { return false }
        return preferredLanguage(accepted) == language
    }

    /// The language range an `Accept-Language` value prefers most (RFC 9110 §12.5.4): the one
    /// with the highest quality value; nil when several share it (equal weights state no
    /// preference, RFC 9110 §12.4.2, which is also why their order is normalised away), or when
    /// it names none (`*` and `q=0` never count).
    static func preferredLanguage(_ value: String) -> String? {
        var best: (range: String, quality: Double)?
        var tied = false
        for member in value.split(separator: ",") {
            let parts = member.split(separator: ";")
            guard let first = parts.first else { continue }
            let range = first.trimmingCharacters(in: .whitespaces).lowercased()
            guard !range.isEmpty, range != "*" else { continue }
            var quality = 1.0
            for parameter in parts.dropFirst() {
                let text = parameter.trimmingCharacters(in: .whitespaces).lowercased()
                if text.hasPrefix("q=") { quality = Double(text.dropFirst(2)) ?? 0 }
            }
            guard quality > 0, quality <= 1 else { continue }
            if quality > (best?.quality ?? 0) {
                best = (range, quality)
                tied = false
            } else if quality == best?.quality, range != best?.range {
                tied = true
            }
        }
        return tied ? nil : best?.range
    }

    /// The stored response that answers a request with these headers: among the variants whose
    /// `Vary` fields match, the most recent (§4.1).
    static func select(from variants: [StoredResponse], requestHeaders: [String: String]) -> StoredResponse? {
        variants.filter { matches($0, requestHeaders: requestHeaders) }.max { $0.storedAt < $1.storedAt }
    }

    // MARK: - Freshness (§4.2.1, §4.2.2)

    /// The lifetime the server gave (§4.2.1): `max-age`, else `Expires` − `Date`. An invalid one
    /// (a `max-age` that is not delta-seconds or conflicts with another, an `Expires` that is not
    /// a date, or given twice) is zero: stale. Nil when the response gives none. A `Date` that is
    /// not a date counts as absent: `received` stands in for it (RFC 9110 §6.6.1).
    static func explicitLifetime(_ headers: [String: String], control: CacheControl, received: Date) -> Duration? {
        switch control.maxAge {
        case .value(let seconds): return .seconds(seconds)
        case .invalid: return .zero
        case .absent: break
        }
        guard let expiresText = value("Expires", in: headers) else { return nil }
        guard let expires = HTTPDate.parse(expiresText) else {
            return .zero  // §5.3: an invalid date, such as "0", means already expired
        }
        return .clamped(seconds: expires.timeIntervalSince(date(headers, received: received)), upperBound: maximumDelta)
    }

    /// The heuristic lifetime (§4.2.2): for a heuristically cacheable status, or any status marked
    /// `public`, 10 % of the time between `Last-Modified` and `Date` (or `received`), at most
    /// `maximumHeuristicLifetime`; nil when the response does not allow one.
    static func heuristicLifetime(_ headers: [String: String], status: Int, control: CacheControl, received: Date) -> Duration? {
        guard heuristicallyCacheable.contains(status) || control.isPublic,
            let modified = value("Last-Modified", in: headers).flatMap({ HTTPDate.parse($0) })
        else { return nil }
        return .clamped(seconds: date(headers, received: received).timeIntervalSince(modified) / 10, upperBound: maximumHeuristicLifetime)
    }

    /// The response's `Date`, or `received` when it has none that parses.
    private static func date(_ headers: [String: String], received: Date) -> Date {
        value("Date", in: headers).flatMap { HTTPDate.parse($0) } ?? received
    }

    /// How long `stored` is fresh for a read asking `staleTime`: zero when the server said
    /// `no-cache` or the response was invalidated.
    static func freshnessLifetime(_ stored: StoredResponse, staleTime: StaleTime) -> Duration {
        freshnessLifetime(stored, control: cacheControl(stored.headers), staleTime: staleTime)
    }

    static func freshnessLifetime(_ stored: StoredResponse, control: CacheControl, staleTime: StaleTime) -> Duration {
        if control.noCache || stored.isInvalidated { return .zero }
        return staleTime.lifetime(
            explicit: explicitLifetime(stored.headers, control: control, received: stored.storedAt),
            heuristic: heuristicLifetime(stored.headers, status: stored.statusCode, control: control, received: stored.storedAt)
        )
    }

    /// What a stored response is worth to one request at one moment.
    struct Reuse: Equatable, Sendable {
        /// Younger than its freshness lifetime (for the read's `StaleTime`).
        var isFresh: Bool
        /// May answer this request without validation (§4.2, §5.2.1): fresh and within the
        /// request's `max-age` and `min-fresh`, or stale within its `max-stale` where the response
        /// allows stale use. False whenever the request says `no-cache`.
        var isUsable: Bool
        /// May be served stale at all (when offline, or as the app's choice): the response did
        /// not say `no-cache` or `must-revalidate` (§4.2.4).
        var mayServeStale: Bool
        /// Stale within its `stale-while-revalidate` window (RFC 5861 §3), not invalidated (§4.4),
        /// and the request did not ask for validation (`no-cache`, `max-age`, `min-fresh`).
        var withinStaleWhileRevalidate: Bool
        /// May be served stale when the origin fails: `mayServeStale`, and within the
        /// `stale-if-error` window when the request (first) or the response gives one (RFC 5861 §4).
        var mayServeOnError: Bool
    }

    /// How `stored` may be used for a request with `request` directives, read with `staleTime`, at `now`.
    static func reuse(_ stored: StoredResponse, request: CacheControl, staleTime: StaleTime, now: Date) -> Reuse {
        let control = cacheControl(stored.headers)
        let lifetime = freshnessLifetime(stored, control: control, staleTime: staleTime)
        let age = currentAge(of: stored, now: now)
        let isFresh = age < lifetime
        let staleness = age - lifetime  // negative while fresh
        let mayServeStale = !control.noCache && !control.mustRevalidate
        let asksValidation = request.noCache || request.maxAge != .absent || request.minFresh != nil
        var isUsable = !request.noCache
        // max-age=0 asks for validation whatever the age (a clock that has not moved would
        // otherwise find a response of age zero acceptable); an invalid one is read as 0.
        switch request.maxAge {
        case .value(let maxAge): if maxAge == 0 || age > .seconds(maxAge) { isUsable = false }
        case .invalid: isUsable = false
        case .absent: break
        }
        if isUsable, let minFresh = request.minFresh, lifetime - age < .seconds(minFresh) { isUsable = false }
        // §4.4: an invalidated response is validated before it is sent again; max-stale does
        // not reach it.
        if isUsable, !isFresh {
            isUsable = mayServeStale && !stored.isInvalidated && request.maxStale.map { staleness <= .seconds($0) } == true
        }
        let staleIfErrorWindow = request.staleIfError ?? control.staleIfError
        return Reuse(
            isFresh: isFresh,
            isUsable: isUsable,
            mayServeStale: mayServeStale,
            withinStaleWhileRevalidate: mayServeStale && !isFresh && !asksValidation && !stored.isInvalidated
                && control.staleWhileRevalidate.map { staleness <= .seconds($0) } == true,
            mayServeOnError: mayServeStale && staleIfErrorWindow.map { staleness <= .seconds($0) } != false
        )
    }

    // MARK: - Age (§4.2.3)

    /// `corrected_initial_age` (§4.2.3) of a response requested at `requestTime` and received at
    /// `responseTime`, in seconds: the larger of the age its `Date` implies (a `Date` in the
    /// future implies none) and its `Age` plus the time the exchange took. `Age` is its first
    /// list member (§5.1), ignored when that is not delta-seconds.
    static func correctedInitialAge(_ headers: [String: String], requestTime: Date, responseTime: Date) -> Double {
        let cap = maximumDelta.seconds
        var apparentAge = 0.0
        if let date = value("Date", in: headers).flatMap({ HTTPDate.parse($0) }) {
            apparentAge = min(cap, max(0, responseTime.timeIntervalSince(date)))
        }
        let ageValue =
            value("Age", in: headers)
            .flatMap { $0.split(separator: ",", maxSplits: 1, omittingEmptySubsequences: false).first }
            .flatMap { CacheControl.deltaSeconds($0.trimmingCharacters(in: CharacterSet(charactersIn: " \t"))) } ?? 0
        let responseDelay = min(cap, max(0, responseTime.timeIntervalSince(requestTime)))
        return max(apparentAge, min(cap, Double(ageValue) + responseDelay))
    }

    /// `current_age` of `stored` at `now` (§4.2.3): its corrected initial age plus the time since
    /// it was received (a clock that went backwards adds nothing).
    static func currentAge(of stored: StoredResponse, now: Date) -> Duration {
        .clamped(seconds: stored.initialAge + max(0, now.timeIntervalSince(stored.storedAt)), upperBound: .seconds(Int64(Int32.max) * 4))
    }

    /// `headers` with a `Date` added when the server sent none (RFC 9110 §6.6.1: a recipient with
    /// a clock that caches a response without one records when it was received).
    static func withDate(_ headers: [String: String], receivedAt responseTime: Date) -> [String: String] {
        guard value("Date", in: headers) == nil else { return headers }
        var dated = headers
        dated["Date"] = HTTPDate.format(responseTime)
        return dated
    }

    // MARK: - Validation (§4.3)

    /// The validators to send when revalidating `stored` (§4.3.1): its `ETag` as `If-None-Match`
    /// and its `Last-Modified` as `If-Modified-Since`, both as the server sent them (a server
    /// that sends a bare `ETag` compares what comes back with what it sent).
    static func validators(for stored: StoredResponse) -> [String: String] {
        var headers: [String: String] = [:]
        if let etag = stored.header("ETag") { headers["If-None-Match"] = etag }
        if let modified = stored.header("Last-Modified") { headers["If-Modified-Since"] = modified }
        return headers
    }

    /// The stored variants a `304` with `notModifiedHeaders` updates (§4.3.4): with a strong
    /// `ETag`, every variant with that same strong `ETag`; else with a weak `ETag` or a
    /// `Last-Modified`, the most recent variant whose validators match them. Empty when none
    /// matches: the `304` must then update nothing.
    ///
    /// A `304` with no validator at all confirms the validators of the request it answers: it
    /// selects `nominated`, the stored response whose validators this cache sent (§4.3.4 names
    /// the case where that response lacks validators too; a server that leaves `ETag` out of a
    /// `304`, as RFC 9110 §15.4.5 asks it not to, is read the same way browsers read it). Without
    /// a nominated response, only a single stored response without validators is selected.
    static func selectedBy304(_ notModifiedHeaders: [String: String], among variants: [StoredResponse], nominated: StoredResponse? = nil) -> [StoredResponse] {
        let etag = value("ETag", in: notModifiedHeaders).map(EntityTag.init)
        let modified = value("Last-Modified", in: notModifiedHeaders)
        if let etag, etag.isStrong {
            return variants.filter { stored in stored.header("ETag").map(EntityTag.init).map { $0.isStrong && $0.opaque == etag.opaque } ?? false }
        }
        if etag != nil || modified != nil {
            let matching = variants.filter { stored in
                if let etag, stored.header("ETag").map(EntityTag.init)?.opaque != etag.opaque { return false }
                if let modified, stored.header("Last-Modified") != modified { return false }
                return true
            }
            return matching.max { $0.storedAt < $1.storedAt }.map { [$0] } ?? []
        }
        if let nominated { return [nominated] }
        if variants.count == 1, let only = variants.first, only.header("ETag") == nil, only.header("Last-Modified") == nil {
            return [only]
        }
        return []
    }

    /// Whether a `200` response to `HEAD` describes `stored` (§4.3.5): the validators it carries
    /// match the stored ones, and its `Content-Length`, if any, is the stored body's length.
    /// When it does not, the stored response is to be considered stale.
    static func headResponse(_ headHeaders: [String: String], describes stored: StoredResponse) -> Bool {
        if let etag = value("ETag", in: headHeaders).map(EntityTag.init), stored.header("ETag").map(EntityTag.init) != etag {
            return false
        }
        if let modified = value("Last-Modified", in: headHeaders), stored.header("Last-Modified") != modified { return false }
        if value("Content-Encoding", in: headHeaders) == nil, let length = value("Content-Length", in: headHeaders).flatMap(CacheControl.deltaSeconds),
            length != stored.body.count
        {
            return false
        }
        return true
    }

    /// `stored` updated by the headers of a `304` or of a `200` to `HEAD` (§3.2, §4.3.4, §4.3.5):
    /// their fields replace the stored ones with the same name, except those never stored; it
    /// counts as received at `responseTime` with the age the new response implies, and is no
    /// longer invalidated.
    static func refreshed(_ stored: StoredResponse, with newHeaders: [String: String], requestTime: Date, responseTime: Date) -> StoredResponse {
        var updated = stored
        var headers = stored.headers
        for (name, value) in storableHeaders(newHeaders) {
            for existing in headers.keys where existing.caseInsensitiveCompare(name) == .orderedSame {
                headers[existing] = nil
            }
            headers[name] = value
        }
        updated.headers = withDate(headers, receivedAt: responseTime)
        updated.storedAt = responseTime
        updated.initialAge = correctedInitialAge(newHeaders, requestTime: requestTime, responseTime: responseTime)
        updated.isInvalidated = false
        return updated
    }
}

/// An entity tag (RFC 9110 §8.8.3) as compared by a cache: its opaque part and whether it is weak.
/// Lenient about what servers send: a bare tag (`abc`) is read as `"abc"`, and `w/` as `W/`.
struct EntityTag: Equatable {
    let opaque: String
    let isStrong: Bool

    init(_ text: String) {
        // Read by Unicode scalars, as the grammar reads octets: by Characters, a tag that opens
        // with a combining mark (`"\u{301}x"`) has no opening quote, since the mark joins it.
        var rest = Substring(text.trimmingCharacters(in: .whitespaces)).unicodeScalars
        var weak = false
        if rest.starts(with: "W/".unicodeScalars) || rest.starts(with: "w/".unicodeScalars) {
            weak = true
            rest = rest.dropFirst(2)
        }
        if rest.count >= 2, rest.first == "\"", rest.last == "\"" { rest = rest.dropFirst().dropLast() }
        opaque = String(rest)
        isStrong = !weak
    }
}
