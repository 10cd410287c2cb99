import Foundation

/// A request's properties read once, as a value: the one request every layer passes down.
///
/// A layer that sends a request on (a cache adding validators, the queue replaying an entry, the
/// auth layer setting a token, a live read refetching) makes one of these where the request
/// enters it and changes only what it must — no layer copies a request field by field. It is a
/// `NetworkRequest` itself, so any sender takes it, and making one from a `PreparedRequest` is
/// a plain copy.
///
/// ```swift
/// let outgoing = PreparedRequest(request).settingHeader("Authorization", to: "Bearer " + token)
/// try await engine.send(outgoing)
/// ```
public struct PreparedRequest: NetworkRequest, Equatable {
    public var url: URL
    public var method: HTTPMethod
    public var headers: [String: String]
    public var body: Data?
    public var timeout: TimeInterval
    public var maximumResponseBodySize: Int?
    public var deadline: Duration?
    public var requestPriority: RequestPriority
    public var operationID: String?
    public var retryable: Bool?
    public var cacheable: Bool?
    /// Whether the engine may answer it with a call for the same request already in flight
    /// (deduplication). A layer that knows the answer must come from after some moment — the
    /// response cache, once what it stores for the URL was marked stale — says no: a call begun
    /// before that moment may carry the state from before it.
    package var sharesCallsInFlight = true

    /// Reads each of `request`'s properties once (a `PreparedRequest` is copied as it is).
    public init(_ request: some NetworkRequest) {
        if let prepared = request as? PreparedRequest {
            self = prepared
            return
        }
        self.init(
            url: request.url, method: request.method, headers: request.headers, body: request.body,
            timeout: request.timeout, maximumResponseBodySize: request.maximumResponseBodySize, deadline: request.deadline,
            requestPriority: request.requestPriority, operationID: request.operationID, retryable: request.retryable,
            cacheable: request.cacheable
        )
    }

    /// A request from its parts; the defaults are `NetworkRequest`'s.
    public init(
        url: URL,
        method: HTTPMethod = .get,
        headers: [String: String] = [:],
        body: Data? = nil,
        timeout: TimeInterval = 30,
        maximumResponseBodySize: Int? = nil,
        deadline: Duration? = nil,
        requestPriority: RequestPriority = .interactive,
        operationID: String? = nil,
        retryable: Bool? = nil,
        cacheable: Bool? = nil
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.maximumResponseBodySize = maximumResponseBodySize
        self.deadline = deadline
        self.requestPriority = requestPriority
        self.operationID = operationID
        self.retryable = retryable
        self.cacheable = cacheable
    }

    /// This request with header `name` set to `value` (removed when `nil`): a header of the same
    /// name in any letter case is dropped, so exactly one goes out.
    public func settingHeader(_ name: String, to value: String?) -> PreparedRequest {
        var copy = self
        copy.setHeader(name, to: value)
        return copy
    }

    /// This request with each of `added` set as `settingHeader(_:to:)` sets one.
    public func settingHeaders(_ added: [String: String]) -> PreparedRequest {
        guard !added.isEmpty else { return self }
        var copy = self
        for (name, value) in added { copy.setHeader(name, to: value) }
        return copy
    }

    /// The value of header `name`, compared case-insensitively.
    public func header(_ name: String) -> String? {
        if let exact = headers[name] { return exact }
        return headers.first { $0.key.caseInsensitiveCompare(name) == .orderedSame }?.value
    }

    private mutating func setHeader(_ name: String, to value: String?) {
        if !headers.isEmpty {
            for key in headers.keys where key.caseInsensitiveCompare(name) == .orderedSame {
                headers[key] = nil
            }
        }
        headers[name] = value
    }
}
