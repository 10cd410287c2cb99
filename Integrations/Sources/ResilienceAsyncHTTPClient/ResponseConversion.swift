import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The response of one AHC request, collected as it arrives: the head of the last response (after
/// redirects), the URL that answered it, and the body, with the body limit.
final class ResponseCollector: HTTPClientResponseDelegate {
    struct Collected: Sendable {
        var head: HTTPResponseHead
        /// The URL that answered (the request's own unless a redirect was followed).
        var url: URL
        var body: Data
    }

    private struct State {
        var head: HTTPResponseHead?
        /// Whether any response head arrived, a redirect's included.
        var visited = false
        var url: URL
        var body: ByteBuffer?
        /// Whether `body` is a buffer of our own rather than AHC's first chunk.
        var owned = false
        var count = 0
    }

    private let limit: Int?
    private let expectsBody: Bool
    /// AHC calls a delegate on its request's event loop, one call at a time; the lock is for the
    /// compiler's sake and is never contended.
    private let state: Mutex<State>

    init(limit: Int?, expectsBody: Bool, url: URL) {
        self.limit = limit
        self.expectsBody = expectsBody
        self.state = Mutex(State(url: url))
    }

    /// Whether a response head has arrived (AHC reports every head here, a redirect's included):
    /// after a failure, false means the connection ended before the server answered.
    var receivedResponseHead: Bool {
        state.withLock { $0.visited }
    }

    func didVisitURL(task: HTTPClient.Task<Collected>, _ request: HTTPClient.Request, _ head: HTTPResponseHead) {
        state.withLock { state in
            state.url = request.url
            state.visited = true
        }
    }

    /// A `Content-Length` above the limit fails the request as soon as the head arrives (not for
    /// HEAD, 1xx, 204 and 304, whose length describes no body).
    func didReceiveHead(task: HTTPClient.Task<Collected>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        let status = Int(head.status.code)
        if let limit, expectsBody, ResponseConversion.statusAllowsBody(status),
            let declared = ResponseConversion.contentLength(head.headers), declared > limit
        {
            return task.eventLoop.makeFailedFuture(NetworkError.responseTooLarge(limit: limit, statusCode: status))
        }
        state.withLock { $0.head = head }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    /// Fails the request the moment the body crosses the limit. Most bodies arrive in one chunk:
    /// that chunk is kept as it is, and a buffer of our own is made only when a second one comes.
    func didReceiveBodyPart(task: HTTPClient.Task<Collected>, _ chunk: ByteBuffer) -> EventLoopFuture<Void> {
        let tooLarge = state.withLock { state -> Int? in
            if let limit, chunk.readableBytes > limit - state.count {
                return Int(state.head?.status.code ?? 0)
            }
            state.count += chunk.readableBytes
            guard var buffer = state.body else {
                state.body = chunk
                return nil
            }
            state.body = nil  // one reference, so the write below does not copy
            if !state.owned {
                var joined = ByteBuffer()
                joined.reserveCapacity(state.count)
                joined.writeImmutableBuffer(buffer)
                buffer = joined
                state.owned = true
            }
            buffer.writeImmutableBuffer(chunk)
            state.body = buffer
            return nil
        }
        if let tooLarge, let limit {
            return task.eventLoop.makeFailedFuture(NetworkError.responseTooLarge(limit: limit, statusCode: tooLarge))
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didFinishRequest(task: HTTPClient.Task<Collected>) throws -> Collected {
        try state.withLock { state in
            guard let head = state.head else { throw NetworkError.invalidResponse }
            let body = state.body.map { buffer in buffer.withUnsafeReadableBytes { Data($0) } } ?? Data()
            return Collected(head: head, url: state.url, body: body)
        }
    }
}

/// AHC's response parts → what the engine reads.
enum ResponseConversion {
    /// The `Content-Length` value, when there is exactly one valid one.
    static func contentLength(_ headers: HTTPHeaders) -> Int? {
        let values = headers["content-length"]
        guard values.count == 1, let value = Int(values[0]), value >= 0 else { return nil }
        return value
    }

    /// 1xx, 204 and 304 responses have no body whatever their `Content-Length` says.
    static func statusAllowsBody(_ status: Int) -> Bool {
        !(100..<200).contains(status) && status != 204 && status != 304
    }

    /// The response's head: the status and every field as AHC received it (in order, repeated
    /// ones separate); `nil` for a status outside 100...999. No Foundation response is built here.
    static func head(_ collected: ResponseCollector.Collected) -> ResponseHead? {
        var fields: [ResponseHead.Field] = []
        fields.reserveCapacity(collected.head.headers.count)
        for (name, value) in collected.head.headers {
            fields.append(ResponseHead.Field(name: name, value: value))
        }
        return ResponseHead(
            url: collected.url,
            statusCode: Int(collected.head.status.code),
            httpVersion: versionString(collected.head.version),
            fields: fields
        )
    }

    static func versionString(_ version: HTTPVersion) -> String {
        switch (version.major, version.minor) {
        case (1, 1): return "HTTP/1.1"
        case (2, _): return "HTTP/2"
        case (1, 0): return "HTTP/1.0"
        default: return "HTTP/\(version.major).\(version.minor)"
        }
    }
}
