import Foundation

/// One HTTP request as `LoopbackHTTPServer` parsed it.
public struct LoopbackRequest: Sendable, Equatable {
    /// The request method exactly as sent, e.g. `"GET"`.
    public let method: String
    /// The raw request target from the request line, e.g. `"/a?b=1"` (not percent-decoded).
    public let target: String
    /// The target without its query, e.g. `"/a"` (not percent-decoded). For an absolute-form target
    /// (`http://host/a?b=1`) this is the path part; for `OPTIONS *` it is `"*"`.
    public let path: String
    /// The query after the first `?` (without the `?`), `nil` when the target has no `?`.
    public let query: String?
    /// Request headers with lower-cased names; repeated headers are joined with `", "` in arrival order.
    public let headers: [String: String]
    /// The request body: `Content-Length` bytes, or the de-chunked `Transfer-Encoding: chunked` body.
    public let body: Data
    /// Identifies the TCP connection the request came on; distinct for every accepted connection
    /// of one server, equal for requests that reused a keep-alive connection.
    public let connectionID: Int

    /// Creates a request value, e.g. to unit-test a route handler without a socket.
    /// `path` and `query` are derived from `target`; header names are lower-cased.
    public init(method: String, target: String, headers: [String: String] = [:], body: Data = Data(), connectionID: Int = 0) {
        self.method = method
        self.target = target
        (self.path, self.query) = LoopbackRequest.split(target: target)
        var lowered: [String: String] = [:]
        for (name, value) in headers {
            let key = name.lowercased()
            if let existing = lowered[key] {
                lowered[key] = existing + ", " + value
            } else {
                lowered[key] = value
            }
        }
        self.headers = lowered
        self.body = body
        self.connectionID = connectionID
    }

    /// The value of header `name`, compared case-insensitively; `nil` when absent.
    public func header(_ name: String) -> String? {
        headers[name.lowercased()]
    }

    /// Splits a request target into path and query (origin-form, absolute-form and asterisk-form).
    static func split(target: String) -> (path: String, query: String?) {
        var pathAndQuery = Substring(target)
        if !target.hasPrefix("/"), let schemeEnd = target.range(of: "://") {
            // Absolute form (`http://host:port/p?q`): the path starts at the first "/" after the authority.
            let afterAuthority = target[schemeEnd.upperBound...]
            if let slash = afterAuthority.firstIndex(where: { $0 == "/" || $0 == "?" }) {
                pathAndQuery = afterAuthority[slash...]
            } else {
                pathAndQuery = ""
            }
        }
        if let fragment = pathAndQuery.firstIndex(of: "#") {
            pathAndQuery = pathAndQuery[..<fragment]
        }
        var path: Substring = pathAndQuery
        var query: String?
        if let mark = pathAndQuery.firstIndex(of: "?") {
            path = pathAndQuery[..<mark]
            query = String(pathAndQuery[pathAndQuery.index(after: mark)...])
        }
        if path.isEmpty && target != "*" {
            return ("/", query)
        }
        return (String(path), query)
    }
}
