import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A real HTTP/1.1 server on 127.0.0.1 for integration tests, with scripted responses and
/// injected faults (delays, held responses, abrupt closes, resets, garbage, truncated and endless
/// bodies).
///
/// It listens on an ephemeral port and serves from one background thread with non-blocking sockets
/// and `poll()`, so thousands of concurrent connections cost no threads. HTTP/1.1 connections are
/// kept alive unless the client sends `Connection: close`; pipelined requests are answered in order.
/// Every normal response carries `Date` and `Content-Length` (except 1xx and 204).
///
/// Routing: a route key is an exact path (the query is ignored), or a prefix when it ends with `*`
/// (`"/items/*"`). An exact match wins over prefixes, and the longest prefix wins. Unrouted paths
/// get `404` with an empty body.
///
/// Call `shutdown()` when done (it also runs on deinit). A route handler that captures the server
/// strongly keeps it alive, and then only `shutdown()` stops it.
public final class LoopbackHTTPServer: Sendable {
    /// Why the server could not start; each case carries the `errno` of the failed call.
    public enum Error: Swift.Error, Sendable, Equatable, CustomStringConvertible {
        /// `socket()` or `setsockopt()` on the listening socket failed.
        case socket(errno: Int32)
        /// Binding 127.0.0.1:0 failed.
        case bind(errno: Int32)
        /// `listen()` failed.
        case listen(errno: Int32)
        /// Reading back the bound port with `getsockname()` failed.
        case getsockname(errno: Int32)
        /// Creating the self-pipe that wakes the event loop failed.
        case pipe(errno: Int32)
        /// Making a descriptor non-blocking / close-on-exec failed.
        case fcntl(errno: Int32)

        /// The failed call and the system's message for its `errno`.
        public var description: String {
            let (call, code): (String, Int32) =
                switch self {
                case .socket(let code): ("socket", code)
                case .bind(let code): ("bind", code)
                case .listen(let code): ("listen", code)
                case .getsockname(let code): ("getsockname", code)
                case .pipe(let code): ("pipe", code)
                case .fcntl(let code): ("fcntl", code)
                }
            return "LoopbackHTTPServer: \(call) failed: \(String(cString: strerror(code))) (errno \(code))"
        }
    }

    /// The TCP port the server listens on (127.0.0.1 only).
    public let port: Int
    /// `http://127.0.0.1:PORT`.
    public let baseURL: URL

    private let state: LoopbackServerState
    private let wake: LoopbackWakePipe

    /// How many requests `requestLog` shows unless told otherwise: 10 000. Up to twice as many
    /// are held between trims (about 6 to 12 MB at 0.6 KB a request).
    public static let defaultRequestLogLimit = 10_000

    /// How many of the newest requests `requestLog` keeps (`Int.max`: all of them).
    public let requestLogLimit: Int

    /// Binds 127.0.0.1 on `port` — 0 (the default) for an ephemeral port — with a listen backlog
    /// of 4096, and starts serving on a background thread. Throws `LoopbackHTTPServer.Error` when a
    /// socket call fails (`.bind(errno: EADDRINUSE)` for a taken port, `EINVAL` for one out of range).
    ///
    /// `requestLogLimit` bounds `requestLog` to the newest requests (a server that serves for
    /// hours must not keep every request it saw); `hits(_:)` and `totalHits` keep counting all.
    /// Below 1 it is taken as 1.
    public init(port: Int = 0, requestLogLimit: Int = LoopbackHTTPServer.defaultRequestLogLimit) throws {
        guard (0...65_535).contains(port) else { throw Error.bind(errno: EINVAL) }
        let logLimit = max(1, requestLogLimit)
        self.requestLogLimit = logLimit
        let listener = try LoopbackSocket.makeListener(backlog: 4096, port: port)
        let wake: LoopbackWakePipe
        do {
            wake = try LoopbackWakePipe()
        } catch {
            LoopbackSocket.closeDescriptor(listener.fd)
            throw error
        }
        let state = LoopbackServerState()
        state.withLock { $0.logLimit = logLimit }
        self.port = listener.port
        self.baseURL = URL(string: "http://127.0.0.1:\(listener.port)") ?? URL(fileURLWithPath: "/")
        self.state = state
        self.wake = wake

        let thread = Thread {
            LoopbackEventLoop(listenFD: listener.fd, wake: wake, state: state).run()
        }
        thread.name = "LoopbackHTTPServer:\(listener.port)"
        thread.start()
    }

    deinit {
        shutdown()
    }

    /// `baseURL` followed by `path`, which may include a query (`"/a?b=1"`); a missing leading
    /// `/` is added, and characters not allowed in a URL are percent-encoded.
    public func url(_ path: String) -> URL {
        let suffix = path.hasPrefix("/") ? path : "/" + path
        let base = "http://127.0.0.1:\(port)"
        if let url = URL(string: base + suffix) { return url }
        var allowed = CharacterSet.urlPathAllowed
        allowed.insert(charactersIn: "?&=;%")
        if let encoded = suffix.addingPercentEncoding(withAllowedCharacters: allowed),
            let url = URL(string: base + encoded)
        {
            return url
        }
        return baseURL
    }

    /// Stops accepting, closes every connection (held and delayed responses are never written),
    /// wakes every `waitFor...` caller, and waits for the server thread to finish; afterwards
    /// connecting to `port` is refused. Idempotent, and also run on deinit. Called from a route
    /// handler it does not wait: the server stops right after that request.
    public func shutdown() {
        state.shutdown(wake: wake)
    }

    // MARK: Routing

    /// Serves `path` with a script: the Nth request to this route gets `responses[N]`, and once the
    /// script is exhausted its last response repeats. An empty script answers 404. Replaces any
    /// earlier route with the same key and restarts the count.
    public func route(_ path: String, _ responses: [LoopbackResponse]) {
        state.withLock { $0.routes[path] = .scripted(responses, served: 0) }
    }

    /// Serves every request to `path` with `response` (same as `route(path, [response])`).
    public func route(_ path: String, _ response: LoopbackResponse) {
        route(path, [response])
    }

    /// Serves `path` with `handler`, called on the server thread for each request after the request
    /// is recorded in `requestLog` and `hits`. It must return quickly: it delays every connection.
    /// It may call this server's methods (except waiting ones).
    public func route(_ path: String, handler: @escaping @Sendable (LoopbackRequest) -> LoopbackResponse) {
        state.withLock { $0.routes[path] = .handler(handler) }
    }

    /// Removes the route with key `path` (exactly as it was registered, e.g. `"/items/*"`).
    public func removeRoute(_ path: String) {
        state.withLock { _ = $0.routes.removeValue(forKey: path) }
    }

    // MARK: Observation

    /// The newest parsed requests, at most `requestLogLimit`, in arrival order (unparseable
    /// ones, answered 400/431/505, are not included).
    public var requestLog: [LoopbackRequest] {
        state.withLock { fields in
            fields.log.count > fields.logLimit ? Array(fields.log.suffix(fields.logLimit)) : fields.log
        }
    }

    /// How many parsed requests had exactly this path (the query is not part of it). A `path` ending
    /// in `*` counts every path starting with what precedes the `*`, like a prefix route key.
    public func hits(_ path: String) -> Int {
        state.withLock { $0.hits(matching: path) }
    }

    /// How many requests were parsed in total.
    public var totalHits: Int {
        state.withLock { $0.totalHits }
    }

    /// Returns once `hits(path) >= count` (or `totalHits >= count` when `path` is nil; `path` may be
    /// a `*` prefix pattern as in `hits(_:)`), at once if
    /// that already holds. Requests count as soon as they are parsed, before their response is
    /// written, and a held response is already counted in `heldCount` when this returns.
    /// Also returns when the calling task is cancelled or the server shuts down. It never polls:
    /// the server thread resumes it.
    public func waitForHits(_ path: String?, atLeast count: Int) async {
        await state.wait(for: .hits(path: path, atLeast: count))
    }

    /// Returns once `openConnections <= count`, at once if that already holds (e.g. to see a
    /// client's disconnect processed). Also returns on cancellation or shutdown.
    public func waitForOpenConnections(atMost count: Int) async {
        await state.wait(for: .openConnections(atMost: count))
    }

    /// Returns once the server has written at least `count` bytes in all (`bytesSent`), or once
    /// `openConnections <= limit`, whichever comes first; at once if either already holds. Made for
    /// a client that should stop an endless body: it returns whether or not the client does, so
    /// a test can measure what a flood of a known size did to it without risking a hang. Also
    /// returns on cancellation or shutdown.
    public func waitForBytesSent(atLeast count: Int, orOpenConnectionsAtMost limit: Int) async {
        await state.wait(for: .bytesSent(atLeast: count, orOpenConnectionsAtMost: limit))
    }

    /// Bytes written to clients so far (response heads and bodies), counted as the kernel accepts them.
    public var bytesSent: Int {
        state.withLock { $0.bytesSent }
    }

    /// Releases the held responses waiting right now, for requests with path `path` (a `*` prefix
    /// pattern as in `hits(_:)`, or all paths when `nil`). Requests parsed afterwards are held
    /// again. Each released response is written after its `delay`, in order on its connection.
    /// `heldCount` drops at once.
    public func releaseHeld(_ path: String? = nil) {
        state.releaseHeld(path: path, wake: wake)
    }

    /// How many responses are held waiting for `releaseHeld`, for requests with path `path` (a `*`
    /// prefix pattern as in `hits(_:)`, or all when `nil`). A held response whose client disconnects
    /// stops counting once the server sees the disconnect.
    public func heldCount(_ path: String? = nil) -> Int {
        state.withLock { $0.heldCount(matching: path) }
    }

    /// Connections accepted and not yet closed.
    public var openConnections: Int {
        state.withLock { $0.openConnections }
    }

    /// The highest `openConnections` seen since the server started.
    public var peakOpenConnections: Int {
        state.withLock { $0.peakOpenConnections }
    }

    /// Connections accepted since the server started.
    public var acceptedConnections: Int {
        state.withLock { $0.acceptedConnections }
    }
}
