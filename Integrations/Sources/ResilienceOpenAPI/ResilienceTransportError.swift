/// Why `ResilienceTransport` did not send an operation's request. A generated client reports it
/// as its `ClientError`'s `underlyingError`.
///
/// Failures of the send itself are the stack's own errors, unchanged: `NetworkError` from the
/// engine (`responseTooLarge(limit:)` for a response body over
/// `Configuration.maximumResponseBodySize`, `cancelled`, `timedOut`, …), `AuthError` from an
/// authenticated engine.
public enum ResilienceTransportError: Error, Sendable, Equatable {
    /// The request body is larger than `Configuration.maximumRequestBodySize` bytes; nothing was
    /// sent.
    case requestBodyTooLarge(limit: Int)
    /// The request cannot be expressed for the stack; nothing was sent. `reason` names the part:
    /// a method the engine does not send (`HTTPMethod` has GET, POST, PUT, PATCH, DELETE, HEAD and
    /// OPTIONS), or a base URL and path that do not make an absolute `http` or `https` URL.
    case invalidRequest(reason: String)
    /// The sender returned a response a generated client cannot take (a status outside
    /// 100–999).
    case invalidResponse(reason: String)
}
