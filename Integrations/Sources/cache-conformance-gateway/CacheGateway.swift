import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import RequestEngine
import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// An HTTP/1.1 server whose every answer is `engine.response(for:)` for the same request sent to
/// `upstream`: status, headers and body as the engine returns them (without a body for HEAD).
///
/// - A request the engine cannot express (a method outside `HTTPMethod`, such as `M-SEARCH`) is
///   answered `501` without reaching the engine or the origin.
/// - When the engine throws (no HTTP response: the origin closed the connection, refused it, timed
///   out), the answer is `502` with the error in the body, as a proxy would answer.
/// - Connections are kept alive as the client asks; requests on one connection are answered in
///   order, connections concurrently.
struct CacheGateway: Sendable {
    let upstream: URL
    let engine: CachedRequestEngine

    /// Serves until the process ends; `onListening` gets the bound port (useful with port 0).
    func run(host: String, port: Int, onListening: @Sendable (Int) -> Void) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: host, port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    return try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                        wrappingChannelSynchronously: channel
                    )
                }
            }
        onListening(server.channel.localAddress?.port ?? port)
        try await withThrowingDiscardingTaskGroup { group in
            try await server.executeThenClose { connections in
                for try await connection in connections {
                    group.addTask { await serve(connection) }
                }
            }
        }
    }

    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async {
        do {
            try await connection.executeThenClose { inbound, outbound in
                var head: HTTPRequestHead?
                var body = ByteBuffer()
                for try await part in inbound {
                    switch part {
                    case .head(let requestHead):
                        head = requestHead
                        body.clear()
                    case .body(var chunk):
                        body.writeBuffer(&chunk)
                    case .end:
                        guard let requestHead = head else { continue }
                        head = nil
                        let reply = await answer(requestHead, body: body)
                        try await write(reply, to: outbound, keepAlive: requestHead.isKeepAlive)
                        if !requestHead.isKeepAlive { return }
                    }
                }
            }
        } catch {
            // The client went away mid-exchange: only this connection ends.
        }
    }

    private func answer(_ head: HTTPRequestHead, body: ByteBuffer) async -> Reply {
        let request: ForwardedRequest
        do {
            request = try ForwardedRequest(head: head, body: body, upstream: upstream)
        } catch {
            return Self.failure(501, "\(error)", head: head)
        }
        do {
            let (data, response) = try await engine.response(for: request)
            return Reply(response, body: data, isHead: request.method == .head)
        } catch {
            return Self.failure(502, "no response from the engine: \(error)", head: head)
        }
    }

    /// A reply the gateway makes itself, also logged on standard error (the suite shows statuses only).
    private static func failure(_ status: Int, _ reason: String, head: HTTPRequestHead) -> Reply {
        let line = "cache-conformance-gateway: \(status) for \(head.method.rawValue) \(head.uri): \(reason)"
        FileHandle.standardError.write(Data((line + "\n").utf8))
        return Reply(status: status, text: line)
    }

    private func write(_ reply: Reply, to outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>, keepAlive: Bool) async throws {
        var headers = HTTPHeaders(reply.headers)
        if !keepAlive { headers.replaceOrAdd(name: "connection", value: "close") }
        let status = HTTPResponseStatus(statusCode: reply.status)
        try await outbound.write(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers)))
        if !reply.body.isEmpty {
            try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: reply.body))))
        }
        try await outbound.write(.end(nil))
    }
}

/// What the gateway writes back: the engine's response with this connection's framing.
struct Reply: Sendable {
    /// Response fields that describe the connection they arrived on, not the response: the
    /// gateway's own connection replaces them (RFC 9110 §7.6.1), and `Content-Length` is set for
    /// the body actually sent.
    static let connectionFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length",
    ]

    var status: Int
    var headers: [(String, String)]
    var body: Data

    init(status: Int, text: String) {
        self.status = status
        self.body = Data((text + "\n").utf8)
        self.headers = [("Content-Type", "text/plain"), ("Content-Length", String(body.count))]
    }

    init(_ response: HTTPURLResponse, body: Data, isHead: Bool) {
        var headers: [(String, String)] = []
        var contentLength: String?
        for (key, value) in response.allHeaderFields {
            guard let name = key as? String, let value = value as? String else { continue }
            let lowercased = name.lowercased()
            if lowercased == "content-length" { contentLength = value }
            if Self.connectionFields.contains(lowercased) { continue }
            headers.append((name, value))
        }
        let hasNoBody = (100..<200).contains(response.statusCode) || response.statusCode == 204 || response.statusCode == 304
        if isHead {
            // The length of the body a GET would have had, as the engine reported it.
            if let contentLength { headers.append(("Content-Length", contentLength)) }
        } else if !hasNoBody {
            headers.append(("Content-Length", String(body.count)))
        }
        self.status = response.statusCode
        self.headers = headers
        self.body = isHead || hasNoBody ? Data() : body
    }
}
