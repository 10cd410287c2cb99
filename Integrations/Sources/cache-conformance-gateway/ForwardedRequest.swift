import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine

/// A request received by the gateway, as the `NetworkRequest` the engine sends to the origin: the
/// same method, target, end-to-end header fields and body.
struct ForwardedRequest: NetworkRequest {
    enum Failure: Error, CustomStringConvertible {
        /// `HTTPMethod` has no case for it, so the engine cannot send it.
        case unsupportedMethod(String)
        case invalidTarget(String)

        var description: String {
            switch self {
            case .unsupportedMethod(let method): return "the engine cannot send method \(method)"
            case .invalidTarget(let target): return "cannot forward request target \(target)"
            }
        }
    }

    /// Request fields about this hop, never forwarded (RFC 9110 §7.6.1): the engine's transport
    /// opens its own connection to the origin, sets `Host` from the URL and `Content-Length` from
    /// the body. Names listed in the request's `Connection` field are dropped too.
    static let hopFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
        "content-length",
    ]

    let url: URL
    let method: RequestEngine.HTTPMethod
    let headers: [String: String]
    let body: Data?
    /// Longer than the suite's own 10 s limit per request, so the suite decides when to give up.
    let timeout: TimeInterval = 20

    init(head: HTTPRequestHead, body: ByteBuffer, upstream: URL) throws(Failure) {
        guard let method = RequestEngine.HTTPMethod(rawValue: head.method.rawValue) else {
            // NIO spells M-SEARCH without its hyphen.
            throw .unsupportedMethod(head.method == .MSEARCH ? "M-SEARCH" : head.method.rawValue)
        }
        guard head.uri.hasPrefix("/"), let url = URL(string: upstream.absoluteString + head.uri) else {
            throw .invalidTarget(head.uri)
        }
        self.url = url
        self.method = method
        self.headers = Self.endToEndFields(of: head.headers)
        self.body = body.readableBytes > 0 ? Data(body.readableBytesView) : nil
    }

    /// The fields to forward, repeated names joined with ", " in the order received (the engine
    /// takes one value per name; RFC 9110 §5.3 makes the two forms equivalent).
    static func endToEndFields(of fields: HTTPHeaders) -> [String: String] {
        var dropped = hopFields
        for listed in fields["connection"] {
            for name in listed.split(separator: ",") {
                dropped.insert(name.trimmingCharacters(in: .whitespaces).lowercased())
            }
        }
        var names: [String: String] = [:]  // lower-cased name → the spelling first received
        var joined: [String: String] = [:]
        for (name, value) in fields {
            let lowercased = name.lowercased()
            if dropped.contains(lowercased) || lowercased.hasPrefix("proxy-") { continue }
            if let existing = joined[lowercased] {
                joined[lowercased] = existing + ", " + value
            } else {
                names[lowercased] = name
                joined[lowercased] = value
            }
        }
        var forwarded: [String: String] = [:]
        for (lowercased, value) in joined {
            forwarded[names[lowercased] ?? lowercased] = value
        }
        return forwarded
    }
}
