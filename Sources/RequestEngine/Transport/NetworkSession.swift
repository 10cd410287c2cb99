import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The one call the engine needs from a transport. `URLSessionTransport` (the engine's default)
/// and `URLSession` conform on Linux and Apple platforms; tests use `ScriptedNetworkSession` from
/// `ResilienceTesting`.
///
/// Implementations must honour task cancellation promptly (both conformers here do, without
/// blocking the cancelling thread): the engine cancels the call when its timeout fires or when
/// every caller waiting on it is cancelled.
public protocol NetworkSession: Sendable {
    func data(for request: URLRequest) async throws -> (Data, URLResponse)

    /// Whether this session bounds each call itself, so that `AsyncRequestEngine` may run a
    /// request in its caller's task, with no task and no timer of its own (a shared read in the
    /// task of the caller that starts it; Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md, "Threading and cost"):
    /// - the request's `timeoutInterval` bounds the **whole** call (not an idle interval), and a
    ///   call past it throws a timeout (`NetworkError.timedOut`, or `URLError(.timedOut)`);
    /// - when the calling task is cancelled, the call returns promptly (its caller does not wait
    ///   for the transfer to wind down).
    ///
    /// The default is `false`: the engine then runs each request in a task of its own and times
    /// attempts on its own clock. `AsyncHTTPClientSession` says `true`; `URLSession` and
    /// `URLSessionTransport` do not (URLSession's `timeoutInterval` is an idle timeout).
    var honorsTimeoutAndCancellation: Bool { get }

    /// Like `data(for:)`, but a body larger than `maximumBodySize` bytes (`nil`: no limit) fails
    /// with `NetworkError.responseTooLarge(limit:)`. The engine calls this one.
    ///
    /// The default implementation calls `data(for:)` and checks the size once the whole body has
    /// arrived, so it bounds what the caller gets, not what the transfer holds meanwhile. A
    /// transport that can see the body as it arrives should stop the transfer as soon as the limit
    /// is crossed, as `URLSessionTransport` does.
    func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse)

    /// Like `data(for:maximumBodySize:)`, answering with the response's head as received
    /// (`ResponseHead`: fields in order, repeated ones separate). The engine calls this one.
    ///
    /// The default calls `data(for:maximumBodySize:)` and wraps its `HTTPURLResponse` (any other
    /// response throws `NetworkError.invalidResponse`). A session that reads a response's fields
    /// itself — `AsyncHTTPClientSession` — answers with them and builds no Foundation response
    /// unless someone asks for one (`ResponseHead.httpURLResponse`).
    func dataWithHead(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, ResponseHead)

    /// The credential header fields this session adds on its own to a request for `url` that
    /// carries none of them (a `Cookie` from its cookie store), so that a cache above it sees the
    /// request as it is sent: `CachedRequestEngine` stores a response to such a request only
    /// under a partition, and matches `Vary: Cookie` on these values. Values are read, never
    /// kept or logged.
    ///
    /// The default is none. `URLSession` answers from its configuration's cookie store (when
    /// `httpShouldSetCookies`); `URLSessionTransport` adds none unless made with `usesCookies: true`.
    func credentialHeaders(for url: URL) -> [String: String]
}

extension NetworkSession {
    public var honorsTimeoutAndCancellation: Bool { false }

    public func credentialHeaders(for url: URL) -> [String: String] { [:] }

    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        let (data, response) = try await data(for: request)
        if let maximumBodySize, data.count > maximumBodySize {
            throw NetworkError.responseTooLarge(limit: maximumBodySize, statusCode: (response as? HTTPURLResponse)?.statusCode)
        }
        return (data, response)
    }

    public func dataWithHead(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, ResponseHead) {
        let (data, response) = try await data(for: request, maximumBodySize: maximumBodySize)
        guard let http = response as? HTTPURLResponse else { throw NetworkError.invalidResponse }
        return (data, ResponseHead(http))
    }
}

extension URLSession: NetworkSession {
    /// The `Cookie` its configuration's cookie store holds for `url`, when the session sends
    /// cookies (`httpShouldSetCookies`; `URLSessionConfiguration.default` does, from the shared
    /// store).
    public func credentialHeaders(for url: URL) -> [String: String] {
        CookieHeaders.adding(from: configuration, for: url)
    }

    /// Loads `request` with a completion-handler data task, like Foundation's `data(for:delegate:)`,
    /// except that neither the calling nor the cancelling thread ever waits for the session: the
    /// caller gets `URLError(.cancelled)` at once, and on Linux the task is made, resumed and
    /// cancelled on dedicated threads (there `dataTask(with:)`, `resume()` and `cancel()` wait for
    /// the session's work queue, which a busy transfer can hold for seconds).
    ///
    /// The body is collected by Foundation, so a size limit (`data(for:maximumBodySize:)`) can only
    /// be checked once it has arrived whole. To stop an oversized body while it is received, use
    /// `URLSessionTransport(configuration: session.configuration)` instead.
    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let transfer = SessionTransfer(limit: nil)
        return try await transfer.run { [self] in
            dataTask(with: request) { data, response, error in
                transfer.complete(data: data ?? Data(), response: response, error: error)
            }
        }
    }
}

/// The `Cookie` a session made from a configuration adds to a request.
enum CookieHeaders {
    static func adding(from configuration: URLSessionConfiguration, for url: URL) -> [String: String] {
        guard configuration.httpShouldSetCookies, let storage = configuration.httpCookieStorage,
            let cookies = storage.cookies(for: url), !cookies.isEmpty
        else { return [:] }
        return HTTPCookie.requestHeaderFields(with: cookies)
    }
}
