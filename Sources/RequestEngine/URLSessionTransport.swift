import Dispatch
import Foundation
import ResilienceCore
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
/// - On Linux, making one mends corelibs-foundation's leak of about 180 bytes per request, once
///   for the process: every transfer there releases the URL parts libcurl parsed with `curl_free`
///   instead of `curl_url_cleanup`, for as long as the process runs. The transport points
///   FoundationNetworking's own libcurl entries (`curl_url`, `curl_free`) at wrappers that
///   release those parts, and changes nothing else (module CURLHandleRepair; Benchmarks/Repro/).
///   This covers every `URLSession` in the process, the transport's and others, from then on.
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
    public convenience init(configuration: URLSessionConfiguration = .default) {
        self.init(configuration: configuration) { session, request in session.dataTask(with: request) }
    }

    /// For tests: `makeTask` stands in for `URLSession.dataTask(with:)`.
    init(
        configuration: URLSessionConfiguration,
        makeTask: @escaping @Sendable (URLSession, URLRequest) -> any TransferTask
    ) {
        let delegate = URLSessionTransportDelegate()
        #if canImport(CURLHandleRepair)
        _ = curl_handle_repair_install()
        #endif
        #if canImport(FoundationNetworking)
        // corelibs-foundation traps ("Trying to access a behaviour for a task that in not in the
        // registry") when a task is cancelled just after it starts while its session has a
        // `URLCache`: the cache lookup runs on a background queue, unordered against the cancel.
        // Seen here 1 in 6 runs of 3 000 start-then-cancel rounds; never without the cache. So the
        // transport's own session (a copy: the caller's configuration is left alone) has none;
        // caching is the ResponseCache layer's job.
        let configuration = (configuration.copy() as? URLSessionConfiguration) ?? configuration
        configuration.urlCache = nil
        #endif
        let queue = OperationQueue()
        queue.name = "Resilience.URLSessionTransport.delegate"
        queue.maxConcurrentOperationCount = 1
        self.delegate = delegate
        self.session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: queue)
        self.makeTask = makeTask
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
