import Foundation
import HTTPTypes
import OpenAPIRuntime
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A swift-openapi-runtime `ClientTransport` that sends a generated client's requests through any
/// `RequestSending`: an `AsyncRequestEngine` (retries, `Retry-After`, breakers, limits, hedges,
/// deduplication), an `AuthenticatedRequestEngine` over it (one coalesced token refresh on 401),
/// a `CachedRequestEngine` (fresh and offline reads from the cache), as the app composed them.
///
/// ```swift
/// let engine = AsyncRequestEngine(session: AsyncHTTPClientSession(), configuration: .init(retry: .init(policy: ExponentialRetryPolicy())))
/// let client = Client(serverURL: try Servers.Server1.url(), transport: ResilienceTransport(sender: engine))
/// let notes = try await client.listNotes()
/// ```
///
/// Each call of a generated operation is one logical request to the stack, whatever it does below:
/// - The request carries the operation's `operationID` (`NetworkRequest.operationID`): with
///   `CircuitBreakerScope.perOperation` a failing operation opens its own breaker; and
///   `Configuration.operationPolicy`'s answer for it, as `NetworkRequest.retryable` and
///   `cacheable`. Without an override an operation is repeated only if its method is idempotent
///   or it carries an `Idempotency-Key` (which every attempt sends unchanged).
/// - Repeated header fields of the request go as one field per name, their values joined with
///   `", "` (`"; "` for `Cookie`), as RFC 9110 §5.3 allows. The response's fields come from the
///   sender's `responseWithHead(for:)`: through `AsyncRequestEngine` (and
///   `AuthenticatedRequestEngine` over it) on `AsyncHTTPClientSession`, every field as received,
///   in order, a repeated one (two `Set-Cookie`) as separate fields, and no Foundation response
///   is built on the way; where the response passed through `HTTPURLResponse` (URLSession, a
///   `CachedRequestEngine`), a repeated field arrives joined with `", "`, which a generated client
///   reads as it reads separate ones (`HTTPFields` joins them alike), `Set-Cookie` excepted.
/// - The request body is read up to `Configuration.maximumRequestBodySize` bytes (past it:
///   `ResilienceTransportError.requestBodyTooLarge`, nothing sent); the response body is bounded
///   by `maximumResponseBodySize` (past it: `NetworkError.responseTooLarge`).
/// - Every final status is returned to the client, which maps it to the operation's output; only
///   a request that got no HTTP response throws (the stack's `NetworkError`).
/// - Cancelling the task that calls the operation cancels the request (every attempt, the backoff
///   and any wait for a limiter place), and the call throws `NetworkError.cancelled`.
public struct ResilienceTransport: ClientTransport {
    /// What the transport adds to each request and how much it reads.
    public struct Configuration: Sendable {
        /// The largest request body, in bytes, read from the client; a larger one fails with
        /// `ResilienceTransportError.requestBodyTooLarge(limit:)` before anything is sent.
        /// Default 16 MiB.
        public var maximumRequestBodySize: Int
        /// The largest response body, in bytes, accepted (`NetworkRequest.maximumResponseBodySize`);
        /// a larger one fails with `NetworkError.responseTooLarge(limit:)`. `nil` (the default):
        /// the sender's own limit (an `AsyncRequestEngine`'s is 16 MiB unless configured).
        public var maximumResponseBodySize: Int?
        /// How long one attempt may take (`NetworkRequest.timeout`). Default 30 seconds.
        public var timeout: Duration
        /// The policy of each operation, by `operationID`; called once per call. Default: every
        /// operation `OperationPolicy()` (HTTP's rules decide).
        public var operationPolicy: @Sendable (String) -> OperationPolicy

        public init(
            maximumRequestBodySize: Int = 16 * 1024 * 1024,
            maximumResponseBodySize: Int? = nil,
            timeout: Duration = .seconds(30),
            operationPolicy: @escaping @Sendable (String) -> OperationPolicy = { _ in OperationPolicy() }
        ) {
            self.maximumRequestBodySize = maximumRequestBodySize
            self.maximumResponseBodySize = maximumResponseBodySize
            self.timeout = timeout
            self.operationPolicy = operationPolicy
        }
    }

    private let sender: any RequestSending
    private let configuration: Configuration

    /// A transport sending through `sender`, which the app has composed (an engine, or a layer
    /// over one).
    public init(sender: some RequestSending, configuration: Configuration = .init()) {
        self.sender = sender
        self.configuration = configuration
    }

    public func send(
        _ request: HTTPRequest,
        body: HTTPBody?,
        baseURL: URL,
        operationID: String
    ) async throws -> (HTTPResponse, HTTPBody?) {
        let prepared = try await prepare(request, body: body, baseURL: baseURL, operationID: operationID)
        let (data, head) = try await sender.responseWithHead(for: prepared)
        let converted = try HTTPConversion.response(head)
        let hasNoContent = prepared.method == .head || head.statusCode == 204 || head.statusCode == 304
        return (converted, hasNoContent && data.isEmpty ? nil : HTTPBody(data))
    }

    /// The stack's request for a generated client's: the URL from `baseURL` and the request's
    /// path, the header fields joined per name, the body read within its bound, and the
    /// operation with its policy.
    func prepare(_ request: HTTPRequest, body: HTTPBody?, baseURL: URL, operationID: String) async throws -> PreparedRequest {
        let method = try HTTPConversion.method(request.method)
        let url = try HTTPConversion.url(baseURL: baseURL, path: request.path)
        var data: Data?
        if let body { data = try await HTTPConversion.collect(body, upTo: configuration.maximumRequestBodySize) }
        let policy = configuration.operationPolicy(operationID)
        return PreparedRequest(
            url: url,
            method: method,
            headers: HTTPConversion.headers(request.headerFields),
            body: data,
            timeout: configuration.timeout.timeInterval,
            maximumResponseBodySize: configuration.maximumResponseBodySize,
            operationID: operationID,
            retryable: policy.retryable,
            cacheable: policy.cacheable
        )
    }
}

extension Duration {
    /// Seconds, as `NetworkRequest.timeout` takes them.
    fileprivate var timeInterval: TimeInterval {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
