import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine
import Synchronization

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
/// - The response is a `ResponseHead` (`dataWithHead(for:maximumBodySize:)`, what the engine
///   calls) with the final URL (after redirects), the status and the fields as received (in
///   order, repeated ones separate); no `HTTPURLResponse` is built unless it is asked for
///   (`data(for:)`, `AsyncRequestEngine.response(for:)`), and then repeated fields are joined with
///   ", ", as URLSession joins them.
/// - **A connection lost before the response** (closed by the server, reset, or failed on
///   write, with no byte of a response head parsed) — typically a kept-alive connection from
///   AHC's pool that the server was closing as the request went out — is not yet an error: when
///   the request may be sent twice (GET, HEAD, OPTIONS, PUT, DELETE, TRACE, or a non-empty
///   `Idempotency-Key` header), the session sends it again at once, once, as browsers and
///   URLSession do. The second send shares the request's deadline and the caller's cancellation;
///   if its connection is lost too, that is the error. The engine sees one call, so neither its
///   retry policy nor its retry budget is touched; `staleConnectionRetries` counts these sends.
///   A connection lost after a response head arrived (a redirect's included), a POST or PATCH
///   without a key, a timeout and a cancellation are never sent again here.
public struct AsyncHTTPClientSession: NetworkSession {
    /// The client requests go through.
    public let client: HTTPClient

    /// Shared by copies of the session.
    private let resends = ResendCounter()

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
    /// bytes received cross it. A request whose connection is lost before any response byte
    /// arrived is sent again at once, once, when it may be sent twice (see the type's description).
    /// Throws `NetworkError` only.
    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        let (data, head) = try await dataWithHead(for: request, maximumBodySize: maximumBodySize)
        return (data, head.httpURLResponse)
    }

    /// `data(for:maximumBodySize:)`, answering with the response's fields as received and no
    /// `HTTPURLResponse` (Foundation's initializer is most of this adapter's cost on Linux: it
    /// canonicalises every name and parses `Content-Type`; Benchmarks/README.md). Throws
    /// `NetworkError` only.
    public func dataWithHead(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, ResponseHead) {
        let outgoing = try RequestConversion.request(for: request)
        let limit = maximumBodySize.map { max(0, $0) }
        let first: SendFailure
        do {
            return try await send(outgoing, limit: limit)
        } catch {
            first = error
        }
        guard first.connectionLostBeforeResponse, RequestConversion.maySendTwice(outgoing.request) else { throw first.error }
        // The connection ended before the server answered (most often a kept-alive one it was
        // closing as the request went out). The server may have seen the request, but this one has
        // the same effect sent twice. `outgoing.deadline` was set once: it bounds both sends.
        resends.add()
        do {
            return try await send(outgoing, limit: limit)
        } catch {
            throw error.error
        }
    }

    /// How many requests this session has sent a second time because their connection was lost
    /// before any response byte arrived (see the type's description). Copies of the session share
    /// the count; every `AsyncHTTPClientSession` made with an initializer starts its own at zero.
    /// Those second sends appear nowhere else: the engine, its events and its metrics see one call.
    public var staleConnectionRetries: Int { resends.value }

    /// True: the request's `timeoutInterval` bounds the whole exchange (AHC's deadline) and a
    /// cancelled caller's request is cancelled at once, so `AsyncRequestEngine` runs an unhedged
    /// request with no host limit in its caller's task, with no task or timer of its own.
    public var honorsTimeoutAndCancellation: Bool { true }

    /// Why one send failed: its `NetworkError`, and whether the connection was lost before any
    /// response byte arrived (so that sending again is safe for a request allowed to go twice).
    private struct SendFailure: Error {
        var error: NetworkError
        var connectionLostBeforeResponse = false
    }

    /// One exchange over AHC.
    private func send(_ outgoing: RequestConversion.Outgoing, limit: Int?) async throws(SendFailure) -> (Data, ResponseHead) {
        if Task.isCancelled { throw SendFailure(error: .cancelled) }
        let collector = ResponseCollector(limit: limit, expectsBody: outgoing.expectsBody, url: outgoing.url)
        // AHC's delegate API: its deadline bounds the whole exchange, body included (the async
        // `execute`'s ends at the response head), and its task can be cancelled from anywhere.
        let task = client.execute(request: outgoing.request, delegate: collector, deadline: outgoing.deadline)
        let collected: ResponseCollector.Collected
        do {
            collected = try await withTaskCancellationHandler {
                try await task.futureResult.get()
            } onCancel: {
                task.cancel()  // fails the request with `cancelled` and closes its connection
            }
        } catch {
            // AHC reports a cancelled request in several ways (`HTTPClientError.cancelled`, the last
            // connection error of a request still waiting for one, `CancellationError`): the caller
            // asked to stop, so that is the answer.
            if Task.isCancelled { throw SendFailure(error: .cancelled) }
            throw SendFailure(
                error: NetworkError(mappingAsyncHTTPClientError: error),
                connectionLostBeforeResponse: !collector.receivedResponseHead && NetworkError.isConnectionLostBeforeResponse(error)
            )
        }
        guard let head = ResponseConversion.head(collected) else { throw SendFailure(error: .invalidResponse) }
        return (collected.body, head)
    }
}

/// The count behind `AsyncHTTPClientSession.staleConnectionRetries`, shared by a session's copies.
private final class ResendCounter: Sendable {
    private let count = Atomic<Int>(0)

    var value: Int { count.load(ordering: .relaxed) }

    func add() {
        count.add(1, ordering: .relaxed)
    }
}
