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

/// A set of methods as bits, for checks on the request path (a `Set` hashes on every lookup).
struct HTTPMethodSet: Sendable {
    private let bits: UInt8

    init(_ methods: Set<HTTPMethod>) {
        bits = methods.reduce(0) { $0 | Self.bit(for: $1) }
    }

    func contains(_ method: HTTPMethod) -> Bool {
        bits & Self.bit(for: method) != 0
    }

    private static func bit(for method: HTTPMethod) -> UInt8 {
        switch method {
        case .get: return 1 << 0
        case .post: return 1 << 1
        case .put: return 1 << 2
        case .patch: return 1 << 3
        case .delete: return 1 << 4
        case .head: return 1 << 5
        case .options: return 1 << 6
        }
    }
}
