import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A `NetworkSession` over AsyncHTTPClient, for services: hand it to `AsyncRequestEngine` and every
/// retry, timeout, deduplication and event of the engine runs over AHC's connection pool.
///
/// ```swift
/// let engine = AsyncRequestEngine(session: AsyncHTTPClientSession(), retryPolicy: ExponentialRetryPolicy())
/// ```
///
/// What it guarantees, the same as `URLSessionTransport` (see Docs/Integrations.md):
/// - **Errors** are thrown as `NetworkError`, mapped as the URLSession path maps them: a refused
///   connection is `.transport(.cannotConnectToHost)`, a reset or a connection closed before the
///   response ended `.transport(.connectionLost)`, a name that does not resolve
///   `.transport(.dnsFailure)`, a failed TLS handshake `.transport(.secureConnectionFailed)`, a
///   timeout `.timedOut`, bytes that are not HTTP `.invalidResponse`, and the caller's
///   cancellation `.cancelled`.
/// - **Body limit** (`data(for:maximumBodySize:)`): a `Content-Length` above the limit fails with
///   `NetworkError.responseTooLarge(limit:statusCode:)` as soon as the head arrives (not for HEAD,
///   1xx, 204 and 304); any other body fails the same way as soon as the bytes received cross the
///   limit. The request is then cancelled and its connection closed.
/// - **Cancellation**: cancelling the calling task cancels the AHC request (its connection is
///   closed, never returned to the pool mid-response) and answers `NetworkError.cancelled`.
/// - **Timeout**: the request's `timeoutInterval` bounds the whole exchange, body included (AHC's
///   deadline), as the engine's own per-attempt timeout does; `.infinity` or a non-positive value
///   sets none. With `honorsTimeoutAndCancellation`, the engine relies on it: an unhedged
///   request with no host limit runs in its caller's task, timed by this session.
/// - The response is an `HTTPURLResponse` with the final URL (after redirects), the status and
///   the headers (repeated fields joined with ", ", as URLSession joins them).
public struct AsyncHTTPClientSession: NetworkSession {
    /// The client requests go through.
    public let client: HTTPClient

    /// A session over `AsyncHTTPClientSession.sharedClient`, a process-wide client made with
    /// `recommendedConfiguration`. It is never shut down.
    public init() {
        self.client = Self.sharedClient
    }

    /// A session over the caller's client; the caller keeps owning it and shuts it down.
    ///
    /// A client made with AHC's default configuration retries failed connection attempts until its
    /// connect timeout, so a refused connection or an unknown host surfaces as the engine's
    /// `.timedOut` rather than as a prompt `.transport(...)` error; AHC's own tracing, when a tracer
    /// is bootstrapped, records the full URL, query included. `recommendedConfiguration` turns both
    /// off.
    public init(client: HTTPClient) {
        self.client = client
    }

    /// AHC's configuration as this library recommends it for `AsyncRequestEngine`:
    /// - connection attempts are not retried inside AHC (`retryConnectionEstablishment = false`), so
    ///   refused connections and DNS failures reach the engine at once, typed, and the engine's
    ///   retry policy, budget and circuit breaker decide what happens next;
    /// - AHC's own tracing is off (its spans carry the full URL, token-like query values included;
    ///   `ResilienceTracing` makes spans without them);
    /// - connect timeout 10 s, no read timeout (the engine times each attempt), redirects followed
    ///   (at most 20, no cycles) as URLSession follows them, decompression on with AHC's ratio limit.
    public static var recommendedConfiguration: HTTPClient.Configuration {
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .follow(max: 20, allowCycles: false),
            timeout: .init(connect: .seconds(10), read: nil),
            decompression: .enabled(limit: .ratio(25))
        )
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.tracing.tracer = nil
        return configuration
    }

    /// The client behind `AsyncHTTPClientSession()`: `recommendedConfiguration` on AHC's default
    /// event loop group, made on first use and kept for the life of the process.
    public static let sharedClient = HTTPClient(
        eventLoopGroup: HTTPClient.defaultEventLoopGroup,
        configuration: recommendedConfiguration
    )

    /// Loads `request` without a body limit. See `data(for:maximumBodySize:)`.
    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        try await data(for: request, maximumBodySize: nil)
    }

    /// Loads `request`; a body larger than `maximumBodySize` bytes (`nil`: no limit) fails with
    /// `NetworkError.responseTooLarge(limit:statusCode:)` as soon as the head announces it or the
    /// bytes received cross it. Throws `NetworkError` only.
    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        let outgoing = try RequestConversion.request(for: request)
        if Task.isCancelled { throw NetworkError.cancelled }
        let collector = ResponseCollector(limit: maximumBodySize.map { max(0, $0) }, expectsBody: outgoing.expectsBody, url: outgoing.url)
        // AHC's delegate API: its deadline bounds the whole exchange, body included (the async
        // `execute`'s ends at the response head), and its task can be cancelled from anywhere.
        let task = client.execute(request: outgoing.request, delegate: collector, deadline: outgoing.deadline)
        do {
            let collected = try await withTaskCancellationHandler {
                try await task.futureResult.get()
            } onCancel: {
                task.cancel()  // fails the request with `cancelled` and closes its connection
            }
            guard let http = ResponseConversion.httpURLResponse(collected) else { throw NetworkError.invalidResponse }
            return (collected.body, http)
        } catch {
            // AHC reports a cancelled request in several ways (`HTTPClientError.cancelled`, the last
            // connection error of a request still waiting for one, `CancellationError`): the caller
            // asked to stop, so that is the answer.
            if Task.isCancelled { throw NetworkError.cancelled }
            throw NetworkError(mappingAsyncHTTPClientError: error)
        }
    }

    /// True: the request's `timeoutInterval` bounds the whole exchange (AHC's deadline) and a
    /// cancelled caller's request is cancelled at once, so `AsyncRequestEngine` runs an unhedged
    /// request with no host limit in its caller's task, with no task or timer of its own.
    public var honorsTimeoutAndCancellation: Bool { true }
}
