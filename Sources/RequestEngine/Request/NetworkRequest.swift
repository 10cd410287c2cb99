import Foundation
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What to send: a URL, a method, headers, an optional body and a timeout.
///
/// Adopt it with a small struct; only `url` and `method` are required:
/// ```swift
/// struct R: NetworkRequest { let url: URL; let method: HTTPMethod = .get }
/// ```
public protocol NetworkRequest: Sendable {
    /// The absolute `http` or `https` URL to call.
    var url: URL { get }
    /// The HTTP method.
    var method: HTTPMethod { get }
    /// Request headers. Defaults to none. Names are case-insensitive; a value must not contain CR or LF.
    var headers: [String: String] { get }
    /// The request body. Defaults to `nil`.
    var body: Data? { get }
    /// Seconds one attempt may take before it fails with `NetworkError.timedOut`; the engine
    /// enforces it on its own clock (each retry gets a fresh timeout). Defaults to 30.
    /// `.infinity` means no limit; zero, negative or NaN is rejected as `NetworkError.invalidRequest`.
    var timeout: TimeInterval { get }
    /// The largest response body, in bytes, this request accepts; a larger one fails with
    /// `NetworkError.responseTooLarge(limit:)`. Defaults to `nil`: the engine's
    /// `AsyncRequestEngine.Configuration.maximumResponseBodySize` (16 MiB unless configured) applies.
    /// A value here replaces the engine's, larger or smaller (`Int.max` lifts the limit for this
    /// request); a negative value is rejected as `NetworkError.invalidRequest`.
    var maximumResponseBodySize: Int? { get }
    /// The longest the whole request may take — every attempt, every backoff and any wait for a
    /// limiter permit — measured on the engine's clock from `send`; past it the request fails
    /// with `NetworkError.deadlineExceeded`. Defaults to `nil`: the engine's
    /// `AsyncRequestEngine.Configuration.deadline` applies (none unless configured). A value here
    /// replaces the engine's; zero or negative fails at once with `deadlineExceeded`.
    var deadline: Duration? { get }
    /// The share of a host's adaptive concurrency limit this request may take
    /// (`AsyncRequestEngine.Configuration.limits.adaptiveConcurrencyPerHost`): `.interactive` (the default: a
    /// user waits for it) keeps a guaranteed share; `.background` takes what is left and waits
    /// first when the limit shrinks. The offline queue sends its replays as `.background`.
    var requestPriority: RequestPriority { get }
    /// The API operation this request performs (an OpenAPI `operationId` such as `createNote`),
    /// or `nil`. With `CircuitBreakerScope.perOperation` it chooses the request's breaker, so a
    /// failing operation opens its own breaker and the host's other operations go on. Requests
    /// with different operations never share a call in flight. Defaults to `nil`.
    var operationID: String? { get }
    /// Whether the engine may send this request more than once (retries and hedges): `nil` (the
    /// default) leaves it to the method and the `Idempotency-Key` rule (idempotent methods, or
    /// any request carrying a key); `false` sends it once, never hedged; `true` vouches that
    /// repeating it is safe whatever the method (an API whose POSTs are idempotent by design).
    /// Retries still need the engine's retry policy, hedges its hedging policy.
    var retryable: Bool? { get }
    /// Whether a response cache may store and answer this request: `nil` (the default) leaves it
    /// to HTTP's rules (a GET or HEAD, not `no-store`, …); `false` keeps it out of the cache
    /// both ways, as a request `Cache-Control: no-store` would, without sending that directive
    /// on; `true` is the same as `nil` (HTTP's rules still decide: a POST is never stored).
    var cacheable: Bool? { get }
}

extension NetworkRequest {
    public var headers: [String: String] { [:] }
    public var body: Data? { nil }
    public var timeout: TimeInterval { 30 }
    public var maximumResponseBodySize: Int? { nil }
    public var deadline: Duration? { nil }
    public var requestPriority: RequestPriority { .interactive }
    public var operationID: String? { nil }
    public var retryable: Bool? { nil }
    public var cacheable: Bool? { nil }
}

/// Header names the library reads or writes.
public enum HTTPHeader {
    /// Lets the engine retry a POST or PATCH: the server uses the key to apply the request once.
    public static let idempotencyKey = "Idempotency-Key"
    /// Read on 429 and 503 responses to time the next attempt.
    public static let retryAfter = "Retry-After"
}

extension NetworkRequest {
    /// Whether `headers` holds a non-empty `Idempotency-Key` (name compared case-insensitively).
    public var hasIdempotencyKey: Bool {
        HeaderValidation.containsIdempotencyKey(headers)
    }

    /// Builds the `URLRequest` the session sends, or throws `NetworkError.invalidRequest` for a URL
    /// that is not absolute `http`/`https` with a host and a port in 0–65535, a header name or
    /// value that could split the header block (CR, LF, NUL, or a name with separators), or a
    /// non-positive timeout. The scheme is case-insensitive (RFC 3986): `HTTP://…` is sent as
    /// `http://…`.
    public func makeURLRequest() throws(NetworkError) -> URLRequest {
        try URLRequestBuilder.make(url: url, method: method, headers: headers, body: body, timeout: timeout)
    }
}

/// Builds and checks the `URLRequest` for a request's parts (the engine reads a request's
/// properties once and passes them here).
enum URLRequestBuilder {
    static func make(
        url: URL,
        method: HTTPMethod,
        headers: [String: String],
        body: Data?,
        timeout: TimeInterval
    ) throws(NetworkError) -> URLRequest {
        var authority: String?
        return try make(url: url, method: method, headers: headers, body: body, timeout: timeout, authority: &authority)
    }

    /// The same, and the URL's authority (`CircuitBreakerRegistry.authority(of:)`) in `authority`
    /// when it is not nil on entry: read off the host and port this validates anyway, so a
    /// per-host strategy does not parse the URL again. With `sessionTimesAttempts`, the request's
    /// `timeoutInterval` is `timeout` itself (the session bounds the attempt with it), else a
    /// second more (a backstop behind the engine's own timeout).
    static func make(
        url: URL,
        method: HTTPMethod,
        headers: [String: String],
        body: Data?,
        timeout: TimeInterval,
        sessionTimesAttempts: Bool = false,
        authority: inout String?
    ) throws(NetworkError) -> URLRequest {
        guard let typedScheme = url.scheme else {
            throw .invalidRequest(reason: "URL scheme must be http or https")
        }
        let scheme = typedScheme.lowercased()
        guard scheme == "http" || scheme == "https" else {
            throw .invalidRequest(reason: "URL scheme must be http or https")
        }
        guard let host = url.host, !host.isEmpty else {
            throw .invalidRequest(reason: "URL has no host")
        }
        // Foundation parses any number of digits as the port; URLSession then fails with badURL.
        let port = url.port
        if let port, !(0...65_535).contains(port) {
            throw .invalidRequest(reason: "URL port must be in 0-65535")
        }
        if authority != nil { authority = CircuitBreakerRegistry.authority(host: host, port: port) }
        guard !timeout.isNaN, timeout > 0 else {
            throw .invalidRequest(reason: "timeout must be positive")
        }
        // Schemes are case-insensitive (RFC 3986 §3.1), but URLSession picks its protocol by the
        // scheme as written and rejects `HTTP` as an unsupported URL: send it lower-cased.
        let target = typedScheme == scheme ? url : try lowercasingScheme(of: url, typed: typedScheme, as: scheme)
        // The session's own timeout is a backstop when the engine enforces `timeout` itself. Given
        // to the initialiser: setting it afterwards copies the request's storage.
        var urlRequest = URLRequest(
            url: target,
            cachePolicy: .useProtocolCachePolicy,
            timeoutInterval: timeout.isFinite ? timeout + (sessionTimesAttempts ? 0 : 1) : 7 * 24 * 3600
        )
        // GET is URLRequest's default; setting it anyway costs allocations (Foundation normalises it).
        if method != .get { urlRequest.httpMethod = method.rawValue }
        if let body { urlRequest.httpBody = body }
        for (name, value) in headers {
            guard HeaderValidation.isValidName(name) else {
                throw .invalidRequest(reason: "invalid header name")
            }
            guard HeaderValidation.isValidValue(value) else {
                throw .invalidRequest(reason: "invalid value for header \(name)")
            }
            urlRequest.setValue(value, forHTTPHeaderField: name)
        }
        return urlRequest
    }

    /// `url` with its scheme, written `typed`, replaced by `scheme` (the same letters in lower case).
    private static func lowercasingScheme(of url: URL, typed: String, as scheme: String) throws(NetworkError) -> URL {
        let absolute = url.absoluteString
        guard absolute.hasPrefix(typed), let lowered = URL(string: scheme + absolute.dropFirst(typed.count)) else {
            throw .invalidRequest(reason: "URL scheme must be http or https")
        }
        return lowered
    }
}

enum HeaderValidation {
    /// Whether `headers` holds a non-empty `Idempotency-Key` (name compared case-insensitively).
    static func containsIdempotencyKey(_ headers: [String: String]) -> Bool {
        headers.contains { name, value in
            name.caseInsensitiveCompare(HTTPHeader.idempotencyKey) == .orderedSame
                && !value.trimmingCharacters(in: .whitespaces).isEmpty
        }
    }

    /// RFC 9110 token characters.
    static func isValidName(_ name: String) -> Bool {
        !name.isEmpty
            && name.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"):
                    return true
                default:
                    return "!#$%&'*+-.^_`|~".utf8.contains(byte)
                }
            }
    }

    /// No CR, LF or NUL (which would let a value inject headers).
    static func isValidValue(_ value: String) -> Bool {
        !value.utf8.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }
    }
}
