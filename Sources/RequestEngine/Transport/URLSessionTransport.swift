import Dispatch
import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(CURLHandleRepair)
import CURLHandleRepair
#endif

/// The engine's default transport: a `URLSession` of its own whose delegate receives every body as
/// it arrives, so a size limit stops the transfer the moment it is crossed, and whose cancellation
/// never blocks the cancelling thread.
///
/// ```swift
/// let engine = AsyncRequestEngine()                                     // uses URLSessionTransport.shared
/// let custom = AsyncRequestEngine(session: URLSessionTransport(configuration: .ephemeral))
/// ```
///
/// What it guarantees, on Linux and Apple platforms alike:
/// - **Body limit** (`data(for:maximumBodySize:)`): a response whose `Content-Length` exceeds the
///   limit fails with `NetworkError.responseTooLarge(limit:)` as soon as its head arrives, before
///   any body byte is read (not for HEAD, 204 and 304, which carry no body); any other body fails
///   the same way as soon as the bytes received exceed the limit (a chunked or endless body). The
///   limit counts the body as delivered, after any content decoding. The transfer is then cancelled.
/// - **Cancellation**: a cancelled caller (or an engine timeout) is answered `URLError(.cancelled)`
///   at once; from that instant the transfer's bytes are dropped, so memory stops growing even while
///   the session takes its time to stop the transfer; the task's `cancel()` is handed to dedicated
///   threads, never run on the cancelling thread (nor on Dispatch's, which on Linux are the
///   cooperative pool's).
/// - **No caller waits for a busy session**: on Linux the task is also made and resumed on
///   dedicated threads, because corelibs-foundation's `resume()` waits for the session's serial
///   queue, which one flooding transfer can hold for seconds; the caller's thread (one of the
///   cooperative pool's) is never held, and its timeout and cancellation still answer at once.
/// - Redirects are followed, as by `URLSession`.
/// - On Linux its session has no `URLCache`, whatever the configuration says: with one,
///   corelibs-foundation can crash the process when a task is cancelled just after it starts.
///   For cached reads use `ResponseCache`. (A plain `URLSession` used as a `NetworkSession` keeps
///   its configuration's cache, and that risk.)
/// - Cookies are neither sent nor stored unless `usesCookies` says so (see `init(configuration:usesCookies:)`):
///   a cookie a shared jar added below the response cache would personalize a response the
///   cache stores as anonymous.
/// - It changes nothing outside itself. On Linux, corelibs-foundation's `URLSession` leaks about
///   180 bytes per request (the URL parts libcurl parsed, released with `curl_free`); a
///   long-running Linux process that sends through URLSession calls
///   `installFoundationLeakRepair()` once, or uses `AsyncHTTPClientSession` (Integrations).
///
/// Unlike a plain `URLSession` (which also conforms to `NetworkSession`), this transport sees the
/// body while it arrives; a plain session's body can only be checked once it has arrived whole.
public final class URLSessionTransport: NetworkSession {
    /// A transport over `URLSessionConfiguration.default`, shared by every engine made without a
    /// `session`.
    public static let shared = URLSessionTransport()

    /// Internal (not private) for tests.
    let session: URLSession
    private let delegate: URLSessionTransportDelegate
    /// Makes (and does not resume) the task for a request; the real session's data task, or a
    /// test double.
    private let makeTask: @Sendable (URLSession, URLRequest) -> any TransferTask

    /// A transport with a session of its own made from `configuration` (copied by `URLSession`).
    ///
    /// - Parameters:
    ///   - configuration: the session's configuration (copied; on Linux its `URLCache` is left out).
    ///   - usesCookies: whether the session sends the cookies of the configuration's
    ///     `httpCookieStorage` and stores the ones responses set (`URLSessionConfiguration.default`
    ///     has the process's shared jar). `false` by default: the transport then sends exactly the
    ///     headers the request has, so the layers above it (`CachedRequestEngine`, events, logs)
    ///     see the request as it is sent. With `true`, `credentialHeaders(for:)` tells a cache
    ///     above which `Cookie` the session will add, and the cache treats such a request as
    ///     credentialed (stored only under a partition, matched on the cookie as sent).
    public convenience init(configuration: URLSessionConfiguration = .default, usesCookies: Bool = false) {
        self.init(configuration: configuration, usesCookies: usesCookies) { session, request in session.dataTask(with: request) }
    }

    /// For tests: `makeTask` stands in for `URLSession.dataTask(with:)`.
    init(
        configuration: URLSessionConfiguration,
        usesCookies: Bool = false,
        makeTask: @escaping @Sendable (URLSession, URLRequest) -> any TransferTask
    ) {
        let delegate = URLSessionTransportDelegate()
        // A copy: the caller's configuration is left alone.
        let configuration = (configuration.copy() as? URLSessionConfiguration) ?? configuration
        if !usesCookies {
            configuration.httpCookieStorage = nil
            configuration.httpShouldSetCookies = false
            configuration.httpCookieAcceptPolicy = .never
        }
        #if canImport(FoundationNetworking)
        // corelibs-foundation traps ("Trying to access a behaviour for a task that in not in the
        // registry") when a task is cancelled just after it starts while its session has a
        // `URLCache`: the cache lookup runs on a background queue, unordered against the cancel.
        // Seen here 1 in 6 runs of 3 000 start-then-cancel rounds; never without the cache. So the
        // transport's own session has none; caching is the ResponseCache layer's job.
        configuration.urlCache = nil
        #endif
        let queue = OperationQueue()
        queue.name = "Resilience.URLSessionTransport.delegate"
        queue.maxConcurrentOperationCount = 1
        self.delegate = delegate
        self.session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: queue)
        self.makeTask = makeTask
    }

    /// Mends corelibs-foundation's leak of about 180 bytes per `URLSession` request on Linux, for
    /// the whole process, from now on: FoundationNetworking releases the URL parts libcurl parsed
    /// for every transfer with `curl_free` instead of `curl_url_cleanup`. The repair points
    /// libFoundationNetworking.so's own libcurl entries (`curl_url`, `curl_free`, and
    /// `curl_url_cleanup` where it imports it) at wrappers that release those parts; it makes those
    /// entries' pages of that library writable for the moment it changes them, and changes no other
    /// library's. It then covers every `URLSession` in the process, this transport's and others.
    ///
    /// Call it once, early, in a long-running Linux process that sends many requests through
    /// URLSession (a service, a soak test); an app on Apple platforms never needs it, and a
    /// Linux service is better served by `AsyncHTTPClientSession` (Integrations), which does not
    /// leak. Nothing in the package calls it for you. Later calls return the first one's answer.
    /// Benchmarks/Repro/README.md has the reproduction and the figures.
    ///
    /// - Returns: whether the repair is in place: `false` on Apple platforms (nothing to mend),
    ///   where FoundationNetworking is linked statically, or where its entries are not where
    ///   expected (then nothing was changed).
    @discardableResult
    public static func installFoundationLeakRepair() -> Bool {
        #if canImport(CURLHandleRepair)
        curl_handle_repair_install() == 1
        #else
        false
        #endif
    }

    deinit {
        // The session keeps its delegate until invalidated. No call can be in flight: each holds
        // the transport.
        session.finishTasksAndInvalidate()
    }

    /// Loads `request` without a body limit. See `data(for:maximumBodySize:)`.
    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        try await data(for: request, maximumBodySize: nil)
    }

    /// Loads `request`; a body larger than `maximumBodySize` bytes (`nil`: no limit) fails with
    /// `NetworkError.responseTooLarge(limit:)` as soon as the head announces it or the bytes received
    /// cross it, and the transfer is stopped. Throws `URLError(.cancelled)` at once when the calling
    /// task is cancelled, and the `URLError`s of `URLSession` otherwise.
    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        let transfer = SessionTransfer(
            limit: maximumBodySize.map { max(0, $0) },
            expectsBody: request.httpMethod?.uppercased() != "HEAD"
        )
        // The closure holds the transport itself: on Linux it runs later, on a pool thread, even
        // for a caller already answered, and a transport released meanwhile would have
        // invalidated its session, on which `dataTask(with:)` traps ("Session invalidated").
        return try await transfer.run { [self] in
            let task = makeTask(session, request)
            // Registered before it is resumed, so the delegate finds it from its first event.
            delegate.register(transfer, for: task.taskIdentifier)
            return task
        }
    }

    /// The `Cookie` the session adds to a request for `url`: none unless the transport was made
    /// with `usesCookies: true` and its cookie store holds one for `url`.
    public func credentialHeaders(for url: URL) -> [String: String] {
        CookieHeaders.adding(from: session.configuration, for: url)
    }

    /// Transfers whose task has not ended yet (for tests): a cancelled one stays until the session
    /// reports its end.
    var transfersInFlight: Int { delegate.count }
}

/// The session delegate: routes each task's events to its transfer, by task identifier.
///
/// It runs on the transport's serial delegate queue and only takes short locks, so a transfer
/// whose caller has gone costs a dictionary look-up per chunk of bytes until its task ends.
final class URLSessionTransportDelegate: NSObject, URLSessionDataDelegate, Sendable {
    private let transfers = Locked<[Int: SessionTransfer]>([:])

    func register(_ transfer: SessionTransfer, for taskIdentifier: Int) {
        transfers.withLock { $0[taskIdentifier] = transfer }
    }

    var count: Int { transfers.withLock { $0.count } }

    func urlSession(
        _ session: URLSession,
        dataTask: URLSessionDataTask,
        didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        transfer(for: dataTask)?.receive(response: response)
        // Always `.allow`: corelibs-foundation does not honour `.cancel` here (the body is still
        // delivered and the task completes without error); a transfer that must stop is cancelled.
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        transfer(for: dataTask)?.receive(data: data)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let transfer = transfers.withLock { $0.removeValue(forKey: task.taskIdentifier) }
        transfer?.complete(data: nil, response: task.response, error: error)
    }

    private func transfer(for task: URLSessionTask) -> SessionTransfer? {
        let identifier = task.taskIdentifier
        return transfers.withLock { $0[identifier] }
    }
}
