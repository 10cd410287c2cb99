import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Something that sends requests: `AsyncRequestEngine`, and (in the Auth layer)
/// `AuthenticatedRequestEngine`. Higher layers such as the offline queue take any sender, so a
/// queue can replay through an engine that injects and refreshes tokens.
public protocol RequestSending: Sendable {
    /// Sends `request` and returns the body and response of a 2xx reply; throws `NetworkError`
    /// otherwise (`httpError` for any other status).
    @discardableResult
    func send(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse)

    /// Sends `request` and returns the final HTTP response whatever its status, so the caller can
    /// act on status and headers itself (e.g. `Retry-After` on 503). Throws `NetworkError` only
    /// when no HTTP response was obtained.
    func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse)

    /// `response(for:)`, answering with the response's head as the session received it (fields in
    /// order, repeated ones separate) rather than Foundation's response. `AsyncRequestEngine`
    /// and `AuthenticatedRequestEngine` pass the session's head through, so over a session that
    /// reads fields itself (`AsyncHTTPClientSession`) no `HTTPURLResponse` is ever built; the
    /// default wraps `response(for:)`'s.
    func responseWithHead(for request: some NetworkRequest) async throws -> (Data, ResponseHead)

    /// The credential header fields this sender (or its transport) adds on its own to a request
    /// for `url`: a session's `Cookie`, an `AuthenticatedRequestEngine`'s token header. A cache
    /// above it treats a request it adds one to as credentialed (stored only under a partition)
    /// and matches `Vary` on the request as sent. The default is none.
    func credentialHeaders(for url: URL) -> [String: String]
}

extension RequestSending {
    public func credentialHeaders(for url: URL) -> [String: String] { [:] }

    public func responseWithHead(for request: some NetworkRequest) async throws -> (Data, ResponseHead) {
        let (data, response) = try await response(for: request)
        return (data, ResponseHead(response))
    }

    /// `response(for:)`, with a final status outside 2xx thrown as `NetworkError.httpError` (its
    /// body kept): every sender's `send(_:)`, written once.
    @discardableResult
    public func send(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await response(for: request)
        guard (200...299).contains(response.statusCode) else {
            throw NetworkError.httpError(statusCode: response.statusCode, data: data)
        }
        return (data, response)
    }
}
