import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import RequestEngine
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `HTTPClientResponse` → `(Data, HTTPURLResponse)`, with the body limit.
enum ResponseConversion {
    /// Reads the body, failing with `responseTooLarge` the moment it crosses `limit`; leaving the
    /// loop early drops the body's iterator, which cancels the AHC request.
    static func collect(_ body: HTTPClientResponse.Body, limit: Int?, statusCode: Int) async throws -> Data {
        var collected: ByteBuffer?
        var owned = false  // whether `collected` is a buffer of our own rather than AHC's first chunk
        var count = 0
        for try await chunk in body {
            if let limit, chunk.readableBytes > limit - count {
                throw NetworkError.responseTooLarge(limit: limit, statusCode: statusCode)
            }
            count += chunk.readableBytes
            // Most bodies arrive in one chunk: keep it as it is, and copy only when a second one comes.
            guard var buffer = collected else {
                collected = chunk
                continue
            }
            collected = nil  // one reference, so the write below does not copy
            if !owned {
                var joined = ByteBuffer()
                joined.reserveCapacity(count)
                joined.writeImmutableBuffer(buffer)
                buffer = joined
                owned = true
            }
            buffer.writeImmutableBuffer(chunk)
            collected = buffer
        }
        guard let buffer = collected else { return Data() }
        return buffer.withUnsafeReadableBytes { Data($0) }
    }

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

    /// The response as URLSession would report it. Repeated fields are joined with ", ".
    ///
    /// Foundation's initializer is most of the adapter's cost on Linux (it canonicalises every
    /// header name through CFString: about 17 µs for nginx's eight headers; Benchmarks/README.md),
    /// so everything around it avoids work: the final URL is parsed again only after a redirect,
    /// and the version string is a constant for the usual versions.
    static func httpURLResponse(_ response: HTTPClientResponse, requestURL: URL) -> HTTPURLResponse? {
        var fields: [String: String] = [:]
        fields.reserveCapacity(response.headers.count)
        for (name, value) in response.headers {
            if let existing = fields[name] {
                fields[name] = existing + ", " + value
            } else {
                fields[name] = value
            }
        }
        return HTTPURLResponse(
            url: finalURL(response, requestURL: requestURL),
            statusCode: Int(response.status.code),
            httpVersion: versionString(response.version),
            headerFields: fields
        )
    }

    /// The URL after redirects. Without a redirect it is the request's own (AHC's `url` would parse
    /// the request's string again: about 2 µs a response).
    static func finalURL(_ response: HTTPClientResponse, requestURL: URL) -> URL {
        guard response.history.count > 1 else { return requestURL }
        return response.url ?? requestURL
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
