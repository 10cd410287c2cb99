import Foundation

/// What `LoopbackHTTPServer` answers to one request: a normal HTTP response, or an injected fault.
///
/// Responses are values: build one with the initialiser or a factory (`.ok`, `.status`, `.json`,
/// `.closeWithoutResponse`, `.reset`, `.raw`, `.partialBodyThenClose`, `.endlessChunkedBody`) and
/// refine it with
/// `delayed(by:)` and `held()`.
public struct LoopbackResponse: Sendable, Equatable {
    /// The status code written in the status line (`.http`, `.partialBodyThenClose` and
    /// `.endlessChunkedBody` only).
    public var status: Int
    /// Extra response headers, written as given. The server adds `Date` and `Content-Length`
    /// unless present here (any letter case), and `Connection: close` when it closes the connection.
    /// A `Connection: close` header here makes the server close the connection after the response.
    public var headers: [String: String]
    /// The response body. Not written for HEAD requests and for 1xx, 204 and 304 statuses.
    public var body: Data
    /// Wall-clock time between the request being parsed (or released, when held) and the response
    /// being written. The server thread keeps serving other connections meanwhile; later pipelined
    /// responses on the same connection wait behind this one. Negative values count as zero.
    public var delay: Duration
    /// When `true`, the response is not written until `LoopbackHTTPServer.releaseHeld(_:)` releases
    /// it; `delay`, if any, starts counting at the release.
    public var isHeld: Bool
    /// What goes on the wire: a normal response or a fault.
    public var kind: Kind

    /// What the server puts on the wire for a response.
    public enum Kind: Sendable, Equatable {
        /// A normal response: status line, headers (with `Content-Length` and `Date`), body.
        case http
        /// Closes the socket without writing anything: the client sees the connection end with no reply.
        case closeWithoutResponse
        /// Sets `SO_LINGER {1, 0}` and closes: the kernel sends a TCP RST, the client sees ECONNRESET.
        case reset
        /// Writes exactly these bytes, then closes the connection (garbage or non-HTTP replies).
        case raw(Data)
        /// Writes the status line and headers announcing `Content-Length` of the whole body, then
        /// only the first half of the body (rounded down), then closes the connection.
        case partialBodyThenClose
        /// Writes the status line and headers with `Transfer-Encoding: chunked` (no
        /// `Content-Length`), then `chunk` as one chunk after another, never the last chunk: as fast
        /// as the client reads when `interval` is zero, else one chunk per `interval`. It stops only
        /// when the client closes the connection (or the server shuts down), which the server then
        /// counts in `openConnections`. A HEAD request gets the head alone.
        case endlessChunkedBody(chunk: Data, interval: Duration)
    }

    /// A normal (`.http`) response, written at once (after `delay`) and not held.
    public init(status: Int = 200, headers: [String: String] = [:], body: Data = Data(), delay: Duration = .zero) {
        self.status = status
        self.headers = headers
        self.body = body
        self.delay = delay
        self.isHeld = false
        self.kind = .http
    }

    /// `200 OK` with `body` encoded as UTF-8 and no extra headers.
    public static func ok(_ body: String = "") -> LoopbackResponse {
        LoopbackResponse(status: 200, body: Data(body.utf8))
    }

    /// A response with the given status, headers and UTF-8 body (e.g. `.status(503, headers: ["Retry-After": "1"])`).
    public static func status(_ code: Int, headers: [String: String] = [:], body: String = "") -> LoopbackResponse {
        LoopbackResponse(status: code, headers: headers, body: Data(body.utf8))
    }

    /// A response whose body is `json` (UTF-8) with `Content-Type: application/json`.
    public static func json(_ json: String, status: Int = 200) -> LoopbackResponse {
        LoopbackResponse(status: status, headers: ["Content-Type": "application/json"], body: Data(json.utf8))
    }

    /// Closes the connection without writing a response (see `Kind.closeWithoutResponse`).
    public static var closeWithoutResponse: LoopbackResponse {
        var response = LoopbackResponse()
        response.kind = .closeWithoutResponse
        return response
    }

    /// Resets the connection with a TCP RST (see `Kind.reset`).
    public static var reset: LoopbackResponse {
        var response = LoopbackResponse()
        response.kind = .reset
        return response
    }

    /// Writes `bytes` verbatim and closes the connection (see `Kind.raw`).
    public static func raw(_ bytes: Data) -> LoopbackResponse {
        var response = LoopbackResponse()
        response.kind = .raw(bytes)
        return response
    }

    /// Announces `body.count` bytes but writes only the first half, then closes
    /// (see `Kind.partialBodyThenClose`).
    public static func partialBodyThenClose(status: Int = 200, headers: [String: String] = [:], body: Data) -> LoopbackResponse {
        var response = LoopbackResponse(status: status, headers: headers, body: body)
        response.kind = .partialBodyThenClose
        return response
    }

    /// A body that never ends (see `Kind.endlessChunkedBody`): `chunk` (non-empty; 16 KiB of `a` by
    /// default) again and again, as fast as the client reads, or one per `interval`.
    public static func endlessChunkedBody(
        status: Int = 200,
        headers: [String: String] = [:],
        chunk: Data = Data(repeating: UInt8(ascii: "a"), count: 16 * 1024),
        interval: Duration = .zero
    ) -> LoopbackResponse {
        var response = LoopbackResponse(status: status, headers: headers)
        response.kind = .endlessChunkedBody(chunk: chunk.isEmpty ? Data([UInt8(ascii: "a")]) : chunk, interval: max(.zero, interval))
        return response
    }

    /// A copy written `delay` later than it would have been (replaces any earlier delay).
    public func delayed(by delay: Duration) -> LoopbackResponse {
        var copy = self
        copy.delay = delay
        return copy
    }

    /// A copy that waits for `LoopbackHTTPServer.releaseHeld(_:)` before being written.
    public func held() -> LoopbackResponse {
        var copy = self
        copy.isHeld = true
        return copy
    }
}
