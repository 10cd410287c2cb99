import Foundation
import RequestEngine

/// A request as `AuthenticatedRequestEngine` sends it: the caller's request with the token header
/// set. A new one is made for every attempt, so the caller's request is never changed and a retry
/// carries the new token. Its `description` (the default one) is never logged by the library.
struct AuthenticatedRequest<Wrapped: NetworkRequest>: NetworkRequest {
    let wrapped: Wrapped
    /// The wrapped request's headers with the token header set, computed once: the engine reads
    /// `headers` several times per send (identity, validation, the URL request).
    let headers: [String: String]

    var url: URL { wrapped.url }
    var method: HTTPMethod { wrapped.method }
    var body: Data? { wrapped.body }
    var timeout: TimeInterval { wrapped.timeout }
    var maximumResponseBodySize: Int? { wrapped.maximumResponseBodySize }
    /// What is left of the caller's deadline when this send starts (`AuthenticatedRequestEngine`
    /// counts one deadline across the token wait, the first send, the refresh and the retry), or
    /// `nil` when neither the request nor the sending engine has one.
    let deadline: Duration?

    /// `wrapped` with header `name` set to `value`; any header of the same name in another letter
    /// case is dropped, so exactly one token header goes out.
    init(_ wrapped: Wrapped, headerName name: String, value: String, deadline: Duration?) {
        self.wrapped = wrapped
        self.deadline = deadline
        var headers = wrapped.headers
        if !headers.isEmpty {
            for key in headers.keys where key.caseInsensitiveCompare(name) == .orderedSame {
                headers[key] = nil
            }
        }
        headers[name] = value
        self.headers = headers
    }
}
