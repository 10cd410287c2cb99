import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `URLRequest` → `HTTPClient.Request`, plus what the response handling needs to know.
enum RequestConversion {
    struct Outgoing {
        var request: HTTPClient.Request
        var url: URL
        /// When the whole exchange must have ended (body included); nil for no limit.
        var deadline: NIODeadline?
        /// False for HEAD, whose `Content-Length` describes a body that is not sent.
        var expectsBody: Bool
    }

    /// Throws `NetworkError.invalidRequest` for a request without a URL or method AHC can send
    /// (the engine has validated its requests already; this guards direct callers).
    static func request(for request: URLRequest) throws(NetworkError) -> Outgoing {
        guard let url = request.url else { throw .invalidRequest(reason: "the request has no URL") }
        let method = NIOHTTP1.HTTPMethod(rawValue: request.httpMethod ?? "GET")
        var headers = HTTPHeaders()
        if let fields = request.allHTTPHeaderFields, !fields.isEmpty {
            headers.reserveCapacity(fields.count)
            for (name, value) in fields {
                headers.add(name: name, value: value)
            }
        }
        let outgoing: HTTPClient.Request
        do {
            outgoing = try HTTPClient.Request(url: url, method: method, headers: headers, body: request.httpBody.map { .data($0) })
        } catch {
            throw NetworkError(mappingAsyncHTTPClientError: error)
        }
        return Outgoing(request: outgoing, url: url, deadline: deadline(request.timeoutInterval), expectsBody: method != .HEAD)
    }

    /// Whether sending `request` twice is as safe as sending it once: an idempotent method (RFC 9110
    /// §9.2.2: GET, HEAD, OPTIONS, PUT, DELETE, TRACE), or a request with a non-empty
    /// `Idempotency-Key` header (name compared case-insensitively), which the engine's retries
    /// honour the same way.
    static func maySendTwice(_ request: HTTPClient.Request) -> Bool {
        switch request.method {
        case .GET, .HEAD, .OPTIONS, .PUT, .DELETE, .TRACE:
            return true
        default:
            return request.headers[HTTPHeader.idempotencyKey].contains { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
        }
    }

    /// The deadline for a `timeoutInterval`: none for an infinite, NaN or non-positive one.
    static func deadline(_ timeout: TimeInterval) -> NIODeadline? {
        guard timeout.isFinite, timeout > 0 else { return nil }
        // Past about 292 years NIO's nanoseconds overflow; treat that as no deadline.
        guard timeout < 9_000_000_000 else { return nil }
        return .now() + .nanoseconds(Int64(timeout * 1_000_000_000))
    }
}
