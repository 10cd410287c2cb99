import Foundation

/// What makes two requests "the same" for deduplication: method, full URL (query included),
/// every header (names compared case-insensitively, values exactly) and the body. The timeout is
/// not part of it.
///
/// Because headers are part of the identity, two requests that differ only in `Authorization`
/// (or a cookie) never share a response.
public struct RequestIdentity: Hashable, Sendable {
    public let method: HTTPMethod
    public let url: String
    public let headers: [String: String]
    public let body: Data?

    public init(_ request: some NetworkRequest) {
        self.init(method: request.method, url: request.url, headers: request.headers, body: request.body)
    }

    /// The identity of a request with these parts (the engine reads a request's properties once).
    init(method: HTTPMethod, url: URL, headers given: [String: String], body: Data?) {
        self.method = method
        self.url = url.absoluteString
        if given.isEmpty {
            headers = [:]
        } else {
            var normalized: [String: String] = [:]
            normalized.reserveCapacity(given.count)
            for (name, value) in given { normalized[name.lowercased()] = value }
            headers = normalized
        }
        self.body = body
    }
}
