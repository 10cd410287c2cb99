import Foundation
import RequestEngine

/// Which parts of a request count as secrets that must never be written to a queue file, and so
/// what `OfflineQueueEngine.enqueue` strips or refuses (Sources/OfflineQueue/OfflineQueue.docc/OfflineQueueGuide.md, "Secrets").
///
/// At enqueue, with the policy in `OfflineQueueEngine.Configuration.secretPolicy`:
/// - **Secret headers are stripped** from the stored entry: a header whose name is in
///   `secretHeaderNames` (or `alwaysSecretHeaderNames`), or contains one of
///   `secretHeaderNameFragments`. They still go out with the first attempt; replays get them again
///   from the sender (`AuthenticatedRequestEngine` injects the token) or from
///   `Configuration.replayHeaders`.
/// - **User-info in the URL** (`https://user:password@host/`) is **refused** with
///   `OfflineQueueError.credentialsInURL`: it would sit on disk, and every replay would send it as
///   Basic auth.
/// - **A URL fragment** (`#access_token=…`) is **stripped**: HTTP never sends it, so nothing is lost.
/// - **A secret query parameter** (`?api_key=…`) is **refused** with
///   `OfflineQueueError.sensitiveQueryParameter`, and **a secret path parameter**
///   (`/cart;jsessionid=…`) with `OfflineQueueError.sensitivePathParameter`: a URL cannot be
///   rewritten without changing what the server does, so the caller must move the credential to a
///   header.
///
/// Names are compared without regard to letter case. Extend or replace any set:
/// ```swift
/// var policy = QueueSecretPolicy.standard
/// policy.secretHeaderNames.insert("X-Tenant-Secret-Id")
/// policy.secretParameterNames.insert("ticket")
/// let queue = OfflineQueueEngine(…, configuration: .init(secretPolicy: policy))
/// ```
/// `Authorization`, `Proxy-Authorization` and `Cookie` are stripped whatever the policy says.
public struct QueueSecretPolicy: Sendable, Equatable {
    /// Header names stripped by every policy: `authorization`, `proxy-authorization`, `cookie`.
    public static let alwaysSecretHeaderNames: Set<String> = ["authorization", "proxy-authorization", "cookie"]

    /// The default rule: the names below, chosen to catch credentials without catching ordinary
    /// names (`Content-Type`, `X-Request-ID`, `Idempotency-Key`; `page`, `sort`, `keyword`, `monkey`).
    public static let standard = QueueSecretPolicy(
        secretHeaderNames: [
            "authorization", "proxy-authorization", "cookie", "cookie2",
            "x-api-key", "api-key", "apikey", "x-apikey", "x-goog-api-key",
            "x-auth", "x-auth-token", "x-access-token", "x-csrf-token", "x-xsrf-token",
            "dpop", "ocp-apim-subscription-key", "x-functions-key",
        ],
        secretHeaderNameFragments: [
            "token", "secret", "password", "passwd", "api-key", "api_key", "apikey",
            "session", "signature", "credential", "csrf", "xsrf",
        ],
        secretParameterNames: [
            "key", "sid", "pwd", "pass", "jwt", "awsaccesskeyid",
        ],
        secretParameterNameSuffixes: [
            "token", "secret", "password", "passwd", "api_key", "apikey", "api-key",
            "access_key", "accesskey", "private_key", "secret_key",
            "signature", "sig", "auth", "credential", "credentials",
            "session", "sessionid", "sessid",
        ]
    )

    /// Header names (exact, any letter case) stripped from stored entries, in addition to
    /// `alwaysSecretHeaderNames`.
    public var secretHeaderNames: Set<String> {
        get { headerNames }
        set { headerNames = Self.lowercased(newValue) }
    }

    /// A header whose name contains one of these (any letter case) is stripped too:
    /// `X-Refresh-Token`, `X-Client-Secret`, `X-Session-Id`, …
    public var secretHeaderNameFragments: Set<String> {
        get { headerFragments }
        set { headerFragments = Self.lowercased(newValue) }
    }

    /// Query and path parameter names (exact, any letter case) that make enqueue refuse the URL.
    /// For short names that are often part of ordinary ones (`key`, `sid`): `sort_key` and
    /// `account_sid` are not matched.
    public var secretParameterNames: Set<String> {
        get { parameterNames }
        set { parameterNames = Self.lowercased(newValue) }
    }

    /// Query and path parameter names (any letter case) that make enqueue refuse the URL when the
    /// name is one of them or ends with one after `_`, `-` or `.` (`access_token`, `x-api-key`);
    /// names of five characters or more also match as a plain suffix (`accesstoken`, `jsessionid`).
    public var secretParameterNameSuffixes: Set<String> {
        get { parameterSuffixes }
        set { parameterSuffixes = Self.lowercased(newValue) }
    }

    private var headerNames: Set<String>
    private var headerFragments: Set<String>
    private var parameterNames: Set<String>
    private var parameterSuffixes: Set<String>

    /// A policy with exactly these sets (each defaults to `standard`'s); names are lowercased.
    public init(
        secretHeaderNames: Set<String> = QueueSecretPolicy.standard.secretHeaderNames,
        secretHeaderNameFragments: Set<String> = QueueSecretPolicy.standard.secretHeaderNameFragments,
        secretParameterNames: Set<String> = QueueSecretPolicy.standard.secretParameterNames,
        secretParameterNameSuffixes: Set<String> = QueueSecretPolicy.standard.secretParameterNameSuffixes
    ) {
        headerNames = Self.lowercased(secretHeaderNames)
        headerFragments = Self.lowercased(secretHeaderNameFragments)
        parameterNames = Self.lowercased(secretParameterNames)
        parameterSuffixes = Self.lowercased(secretParameterNameSuffixes)
    }

    /// Whether a header of this name is stripped from stored entries.
    public func isSecretHeader(_ name: String) -> Bool {
        let name = name.lowercased()
        return Self.alwaysSecretHeaderNames.contains(name) || headerNames.contains(name)
            || headerFragments.contains { !$0.isEmpty && name.contains($0) }
    }

    /// Whether a query or path parameter of this name makes enqueue refuse the URL.
    public func isSecretParameter(_ name: String) -> Bool {
        let name = name.lowercased()
        if parameterNames.contains(name) { return true }
        return parameterSuffixes.contains { suffix in
            guard !suffix.isEmpty, name.hasSuffix(suffix) else { return false }
            if suffix.count >= 5 { return true }
            guard let separator = name.dropLast(suffix.count).last else { return true }  // the whole name
            return separator == "_" || separator == "-" || separator == "."
        }
    }

    private static func lowercased(_ names: Set<String>) -> Set<String> {
        Set(names.map { $0.lowercased() })
    }
}

// MARK: - Applying the policy at enqueue

extension QueueSecretPolicy {
    /// `request` as a queue entry, checked and stripped the way `OfflineQueueEngine.enqueue` stores
    /// it: for a front door that queues without an engine, such as `PostgresQueueStore`'s outbox
    /// enqueue inside a transaction. `request.idempotencyKey` is read once, here.
    ///
    /// - Throws: `NetworkError.invalidRequest` (a request that cannot be built, a deadline that is
    ///   not positive), `OfflineQueueError.credentialsInURL`, `.sensitiveQueryParameter`,
    ///   `.sensitivePathParameter`.
    public func entry(for request: some QueueableRequest, id: UUID = UUID(), enqueuedAt: Date = Date()) throws -> QueueEntry {
        let storable = try checkedStorable(request)
        return QueueEntry(id: id, request: storable, idempotencyKey: storable.idempotencyKey, enqueuedAt: enqueuedAt, sequence: QueueEntry.unplacedSequence)
    }

    /// `storable(_:)` after the checks every enqueue makes: the request can be built, and its
    /// deadline, if any, leaves time for an attempt.
    func checkedStorable<Base: QueueableRequest>(_ request: Base) throws -> StorableRequest<Base> {
        _ = try request.makeURLRequest()  // invalid requests are thrown, never stored
        // A deadline with nothing left would fail every send of the entry: refused, not stored.
        if let deadline = request.deadline, deadline <= .zero {
            throw NetworkError.invalidRequest(reason: "a queued request's deadline must be positive")
        }
        return try storable(request)
    }

    /// `request` as the queue may store it: refused (thrown) when its URL carries user-info or a
    /// secret query or path parameter; otherwise with the URL's fragment removed and its secret
    /// headers set aside for the first attempt only.
    func storable<Base: QueueableRequest>(_ request: Base) throws -> StorableRequest<Base> {
        let url = request.url
        if !(url.user ?? "").isEmpty || !(url.password ?? "").isEmpty {
            throw OfflineQueueError.credentialsInURL
        }
        let components = URLComponents(url: url, resolvingAgainstBaseURL: true)
        if let name = components.flatMap(secretQueryParameter(in:)) {
            throw OfflineQueueError.sensitiveQueryParameter(name)
        }
        if let name = components.flatMap(secretPathParameter(in:)) {
            throw OfflineQueueError.sensitivePathParameter(name)
        }
        var stored: [String: String] = [:]
        var secret: [String: String] = [:]
        for (name, value) in request.headers {
            if isSecretHeader(name) { secret[name] = value } else { stored[name] = value }
        }
        return StorableRequest(wrapped: request, url: Self.removingFragment(from: url), headers: stored, secretHeaders: secret)
    }

    /// The first query parameter whose name is secret, as written in the URL.
    func secretQueryParameter(in components: URLComponents) -> String? {
        components.queryItems?.first { isSecretParameter($0.name) }?.name
    }

    /// The first path parameter (`;name=value` in a path segment) whose name is secret.
    func secretPathParameter(in components: URLComponents) -> String? {
        let path = components.percentEncodedPath
        guard path.contains(";") else { return nil }
        for segment in path.split(separator: "/") {
            for parameter in segment.split(separator: ";", omittingEmptySubsequences: false).dropFirst() {
                let encoded = String(parameter.prefix { $0 != "=" })
                let name = encoded.removingPercentEncoding ?? encoded
                if isSecretParameter(name) { return name }
            }
        }
        return nil
    }

    /// `url` without its fragment (`#…`, even an empty one); `url` itself when it has none.
    static func removingFragment(from url: URL) -> URL {
        guard url.fragment != nil else { return url }
        let absolute = url.absoluteString
        // '#' can only be the fragment's delimiter: elsewhere in a URL it is percent-encoded.
        guard let hash = absolute.firstIndex(of: "#"), let stripped = URL(string: String(absolute[..<hash])) else { return url }
        return stripped
    }
}

/// A request as the queue stores it (`QueueSecretPolicy.storable(_:)`): the caller's request with
/// the URL's fragment removed and its secret headers held apart, so that the entry never contains
/// them while the first attempt still sends them (`PreparedRequest.keepSecretHeaders(from:)`).
struct StorableRequest<Base: QueueableRequest>: QueueableRequest {
    let wrapped: Base
    let url: URL
    /// The headers that may be stored.
    let headers: [String: String]
    /// The headers the policy calls secret: sent with the first attempt, never stored.
    let secretHeaders: [String: String]

    var method: HTTPMethod { wrapped.method }
    var body: Data? { wrapped.body }
    var timeout: TimeInterval { wrapped.timeout }
    var ttl: TimeInterval { wrapped.ttl }
    var priority: QueuePriority { wrapped.priority }
    /// Read through to the caller's request: its default is a fresh UUID per read, and the queue
    /// reads it once.
    var idempotencyKey: String { wrapped.idempotencyKey }
    var orderingKey: String? { wrapped.orderingKey }
    var coalescingKey: String? { wrapped.coalescingKey }
    var maximumResponseBodySize: Int? { wrapped.maximumResponseBodySize }
    var deadline: Duration? { wrapped.deadline }
    var requestPriority: RequestPriority { wrapped.requestPriority }
    var editBase: EditBase? { wrapped.editBase }
    var operationID: String? { wrapped.operationID }
    var retryable: Bool? { wrapped.retryable }
    var cacheable: Bool? { wrapped.cacheable }
}

extension PreparedRequest {
    /// For the first attempt only: the caller's secret headers (Authorization, Cookie, API keys…)
    /// go out with the request even though they are never stored.
    mutating func keepSecretHeaders<Base>(from request: StorableRequest<Base>) {
        for (name, value) in request.secretHeaders { headers[name] = value }
    }

    /// For a replay: the headers `replayHeaders` returns for `entry` are added, each replacing a
    /// stored header of the same name in any letter case. `Idempotency-Key` is never replaced.
    func addingReplayHeaders(
        for entry: QueueEntry,
        from replayHeaders: (@Sendable (QueueEntry) async -> [String: String])?
    ) async -> PreparedRequest {
        guard let replayHeaders else { return self }
        let added = await replayHeaders(entry).filter { $0.key.caseInsensitiveCompare(HTTPHeader.idempotencyKey) != .orderedSame }
        return settingHeaders(added)
    }
}
