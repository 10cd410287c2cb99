import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `URLRequest` → `HTTPClientRequest`, plus what the response handling needs to know.
enum RequestConversion {
    struct Outgoing {
        var request: HTTPClientRequest
        var url: URL
        var deadline: NIODeadline
        /// False for HEAD, whose `Content-Length` describes a body that is not sent.
        var expectsBody: Bool
    }

    /// Throws `NetworkError.invalidRequest` for a request without a URL or method AHC can send
    /// (the engine has validated its requests already; this guards direct callers).
    static func request(for request: URLRequest) throws(NetworkError) -> Outgoing {
        guard let url = request.url else { throw .invalidRequest(reason: "the request has no URL") }
        let methodName = request.httpMethod ?? "GET"
        var outgoing = HTTPClientRequest(url: url.absoluteString)
        let method = NIOHTTP1.HTTPMethod(rawValue: methodName)
        outgoing.method = method
        if let fields = request.allHTTPHeaderFields, !fields.isEmpty {
            outgoing.headers.reserveCapacity(fields.count)
            for (name, value) in fields {
                outgoing.headers.add(name: name, value: value)
            }
        }
        if let body = request.httpBody {
            outgoing.body = .bytes(ByteBuffer(bytes: body))
        }
        return Outgoing(request: outgoing, url: url, deadline: deadline(request.timeoutInterval), expectsBody: method != .HEAD)
    }

    /// The deadline for a `timeoutInterval`: none for an infinite, NaN or non-positive one.
    static func deadline(_ timeout: TimeInterval) -> NIODeadline {
        guard timeout.isFinite, timeout > 0 else { return .distantFuture }
        // Past about 292 years NIO's nanoseconds overflow; treat that as no deadline.
        guard timeout < 9_000_000_000 else { return .distantFuture }
        return .now() + .nanoseconds(Int64(timeout * 1_000_000_000))
    }
}
