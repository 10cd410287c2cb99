import Foundation
import HTTPTypes
import OpenAPIRuntime
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Between swift-http-types' values, which generated code speaks, and the Foundation types the
/// stack speaks.
enum HTTPConversion {
    /// The stack's method for `method`, or `invalidRequest` for one the engine does not send.
    static func method(_ method: HTTPRequest.Method) throws -> RequestEngine.HTTPMethod {
        guard let converted = RequestEngine.HTTPMethod(rawValue: method.rawValue) else {
            throw ResilienceTransportError.invalidRequest(reason: "the engine does not send \(method.rawValue) requests")
        }
        return converted
    }

    /// `baseURL` with `path` (the request's path and query, from `/`) appended, as the runtime's
    /// own transports join them: a base URL's trailing `/` is dropped first.
    static func url(baseURL: URL, path: String?) throws -> URL {
        var base = baseURL.absoluteString
        if base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base + (path ?? "")), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            url.host?.isEmpty == false
        else {
            throw ResilienceTransportError.invalidRequest(reason: "the base URL and path do not make an absolute http or https URL")
        }
        return url
    }

    /// One header per field name (the first field's spelling), repeated fields' values joined in
    /// order with `", "`, or `"; "` for `Cookie` (RFC 9110 §5.3, RFC 6265 §5.4).
    static func headers(_ fields: HTTPFields) -> [String: String] {
        var headers: [String: String] = [:]
        headers.reserveCapacity(fields.count)
        var spelling: [HTTPField.Name: String] = [:]
        for field in fields {
            if let name = spelling[field.name] {
                let separator = field.name == .cookie ? "; " : ", "
                headers[name, default: ""] += separator + field.value
            } else {
                spelling[field.name] = field.name.rawName
                headers[field.name.rawName] = field.value
            }
        }
        return headers
    }

    /// The body's bytes, at most `limit` of them; a longer body throws `requestBodyTooLarge`
    /// (a body of known length before any byte is read).
    static func collect(_ body: HTTPBody, upTo limit: Int) async throws -> Data {
        var data = Data()
        if case .known(let length) = body.length {
            guard length <= Int64(limit) else { throw ResilienceTransportError.requestBodyTooLarge(limit: limit) }
            data.reserveCapacity(Int(length))
        }
        for try await chunk in body {
            guard chunk.count <= limit - data.count else { throw ResilienceTransportError.requestBodyTooLarge(limit: limit) }
            data.append(contentsOf: chunk)
        }
        return data
    }

    /// The response's status and header fields, in the order the head gives them. Names
    /// swift-http-types does not accept are left out.
    static func response(_ head: ResponseHead) throws -> HTTPResponse {
        guard (100...999).contains(head.statusCode) else {
            throw ResilienceTransportError.invalidResponse(reason: "the response status \(head.statusCode) is not an HTTP status")
        }
        var fields = HTTPFields()
        let received = head.fields
        fields.reserveCapacity(received.count)
        for field in received {
            guard let name = HTTPField.Name(field.name) else { continue }
            fields.append(HTTPField(name: name, value: field.value))
        }
        return HTTPResponse(status: .init(code: head.statusCode), headerFields: fields)
    }
}
