/// An HTTP request method.
public enum HTTPMethod: String, Sendable, Hashable, Codable, CaseIterable {
    case get = "GET"
    case post = "POST"
    case put = "PUT"
    case patch = "PATCH"
    case delete = "DELETE"
    case head = "HEAD"
    case options = "OPTIONS"

    /// Whether sending the request twice has the same effect as sending it once (RFC 9110 §9.2.2):
    /// GET, HEAD, OPTIONS, PUT and DELETE. POST and PATCH are not, so the engine retries them only
    /// when the request carries an `Idempotency-Key` header.
    public var isIdempotent: Bool {
        switch self {
        case .get, .head, .options, .put, .delete: return true
        case .post, .patch: return false
        }
    }
}
