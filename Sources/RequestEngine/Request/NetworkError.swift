import Foundation
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Every failure the engine reports. Switch on it; `isRetryable` says whether trying again can help.
public enum NetworkError: Error, Sendable {
    /// The server answered with a status outside 200–299. `data` is the response body.
    case httpError(statusCode: Int, data: Data?)
    /// The device has no usable network path (`URLError.notConnectedToInternet` and kin).
    case noConnection
    /// An attempt took longer than the request's `timeout` (or the transport timed out).
    case timedOut
    /// The caller's task was cancelled.
    case cancelled
    /// The server could not be reached or the connection broke: refused, reset, DNS failure,
    /// connection lost, TLS handshake failure. See `TransportFailure`.
    case transport(TransportFailure)
    /// The reply was not a valid HTTP response (garbage bytes, a non-HTTP protocol).
    case invalidResponse
    /// The circuit breaker is open: the call was not made.
    case circuitOpen
    /// The request cannot be sent as built (bad URL scheme, no host, a header value with CR/LF,
    /// a non-positive timeout). Nothing was sent.
    case invalidRequest(reason: String)
    /// The response body exceeded `limit` bytes (`AsyncRequestEngine.Configuration.maximumResponseBodySize`
    /// or the request's `maximumResponseBodySize`): the transfer was stopped and nothing of the body
    /// is returned. `statusCode` is the response's status (the server did answer: a 201 here means
    /// the request took effect). Not retryable by the engine: the same request would get the same body.
    case responseTooLarge(limit: Int, statusCode: Int?)
    /// Any other error from the session.
    case underlying(any Error)
    /// The request's total deadline (`NetworkRequest.deadline`, or the engine's
    /// `Configuration.deadline`) passed: the attempt in flight was cancelled, or it passed before
    /// an attempt could start. Distinct from `timedOut`, which is one attempt's own limit.
    case deadlineExceeded
    /// A limiter refused the attempt without sending it: the host's concurrency limit and its wait
    /// line were full (`Configuration.limits.concurrencyPerHost`), or the host's token bucket was empty
    /// (`Configuration.limits.ratePerHost`). The `LimiterRejection` says which limit and, for a rate
    /// limit, when a token is due.
    case limited(LimiterRejection)
    /// The server redirected more often than the transport follows, or in a loop (URLSession's
    /// `httpTooManyRedirects`; AsyncHTTPClient's redirect limit or cycle). Not retryable: the
    /// same request would be sent round the same redirects.
    case tooManyRedirects
    /// The response's header block was larger than the transport accepts (libcurl under
    /// URLSession on Linux: a line over 100 KiB or 300 KiB in all; SwiftNIO's parser under
    /// AsyncHTTPClient: 80 KiB). Nothing of the response is returned. Not retryable: the same
    /// request would get the same headers.
    case responseHeadersTooLarge

    /// Whether trying again may succeed: 5xx except 501, 408, 429, `noConnection`, `timedOut` and
    /// transport failures other than TLS. Never `cancelled`, other 4xx, `invalidResponse`,
    /// `invalidRequest`, `circuitOpen`, `responseTooLarge`, `underlying`, `tooManyRedirects`,
    /// `responseHeadersTooLarge`, `deadlineExceeded` or `limited` (both say the caller's own
    /// limits were reached: retrying would only add load).
    public var isRetryable: Bool {
        switch self {
        case .httpError(let statusCode, _):
            return ResponseClassification.isRetryable(status: statusCode)
        case .noConnection, .timedOut:
            return true
        case .transport(let failure):
            return failure != .secureConnectionFailed
        case .cancelled, .invalidResponse, .circuitOpen, .invalidRequest, .responseTooLarge, .underlying,
            .deadlineExceeded, .limited, .tooManyRedirects, .responseHeadersTooLarge:
            return false
        }
    }

    /// The HTTP status code for `.httpError`, else `nil`.
    public var statusCode: Int? {
        if case .httpError(let statusCode, _) = self { return statusCode }
        return nil
    }
}

/// Why a connection to the server failed or broke.
public enum TransportFailure: String, Sendable, Hashable, Codable {
    /// Nothing listens, or the host refused the connection (`URLError.cannotConnectToHost`).
    case cannotConnectToHost
    /// The connection was reset or dropped before the response completed
    /// (`URLError.networkConnectionLost`; on Linux also libcurl's "Empty reply from server" and
    /// "transfer closed with N bytes remaining to read", a body shorter than its `Content-Length`).
    case connectionLost
    /// The host name could not be resolved (`cannotFindHost`, `dnsLookupFailed`).
    case dnsFailure
    /// The TLS handshake failed (bad certificate, protocol mismatch). Not retryable.
    case secureConnectionFailed
}

extension NetworkError {
    /// Maps any error from a `NetworkSession` to a `NetworkError`, the same way on Linux and Apple platforms.
    public init(mapping error: any Error) {
        switch error {
        case let error as NetworkError:
            self = error
        case is CancellationError:
            self = .cancelled
        case let error as URLError:
            self = NetworkError(urlError: error)
        default:
            self = .underlying(error)
        }
    }

    private init(urlError: URLError) {
        switch urlError.code {
        case .notConnectedToInternet, .dataNotAllowed, .internationalRoamingOff:
            self = .noConnection
        case .timedOut:
            self = .timedOut
        case .cancelled:
            self = .cancelled
        case .cannotConnectToHost:
            self = .transport(.cannotConnectToHost)
        case .networkConnectionLost:
            self = .transport(.connectionLost)
        case .cannotFindHost, .dnsLookupFailed:
            self = .transport(.dnsFailure)
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
            .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
            .clientCertificateRequired:
            self = .transport(.secureConnectionFailed)
        case .badServerResponse:
            // libcurl (Linux) reports a connection closed before any reply byte as "Empty reply from
            // server" under badServerResponse; Apple platforms report networkConnectionLost.
            self = Self.isEmptyReply(urlError) ? .transport(.connectionLost) : .invalidResponse
        case .httpTooManyRedirects:
            self = .tooManyRedirects
        case .unknown:
            // libcurl (Linux) reports a body cut short by the connection closing (CURLE_PARTIAL_FILE)
            // under code -1 with its own message; Apple platforms report networkConnectionLost.
            // Headers too large for libcurl come under code -1 too.
            if Self.isTruncatedBody(urlError) {
                self = .transport(.connectionLost)
            } else if Self.isOversizedHeader(urlError) {
                self = .responseHeadersTooLarge
            } else {
                self = .underlying(urlError)
            }
        case .unsupportedURL, .cannotParseResponse, .zeroByteResource, .cannotDecodeRawData,
            .cannotDecodeContentData:
            // The engine validates URLs before sending, so unsupportedURL here means libcurl rejected
            // the reply (e.g. "Received HTTP/0.9 when not allowed" for non-HTTP bytes).
            self = .invalidResponse
        default:
            self = .underlying(urlError)
        }
    }

    /// libcurl's messages for CURLE_PARTIAL_FILE: "transfer closed with 500 bytes remaining to
    /// read" (a body shorter than its `Content-Length`) and "transfer closed with outstanding read
    /// data remaining" (a chunked body without its last chunk).
    private static func isTruncatedBody(_ error: URLError) -> Bool {
        #if os(Linux) || os(Android) || os(Windows)
        return error.localizedDescription.range(of: "transfer closed with", options: [.caseInsensitive, .anchored]) != nil
        #else
        return false
        #endif
    }

    /// libcurl's messages for a response header block it refuses: "Too large response headers:
    /// N > 307200" (300 KiB in all), and "Out of memory" (CURLE_OUT_OF_MEMORY), which is what it
    /// reports for a single header line over its 100 KiB buffer — a transfer reports no other
    /// allocation failure this way that a process could survive to see.
    private static func isOversizedHeader(_ error: URLError) -> Bool {
        #if os(Linux) || os(Android) || os(Windows)
        let message = error.localizedDescription
        return message.range(of: "too large response headers", options: [.caseInsensitive, .anchored]) != nil
            || message.caseInsensitiveCompare("Out of memory") == .orderedSame
        #else
        return false
        #endif
    }

    private static func isEmptyReply(_ error: URLError) -> Bool {
        #if os(Linux) || os(Android) || os(Windows)
        return error.localizedDescription.localizedCaseInsensitiveContains("empty reply")
        #else
        return false
        #endif
    }
}

extension NetworkError: CustomStringConvertible {
    /// A one-line description without response bodies, headers or URLs (they may hold secrets).
    public var description: String {
        switch self {
        case .httpError(let statusCode, let data):
            return "HTTP \(statusCode) (\(data?.count ?? 0) body bytes)"
        case .noConnection: return "no network connection"
        case .timedOut: return "timed out"
        case .cancelled: return "cancelled"
        case .transport(let failure): return "transport failure: \(failure.rawValue)"
        case .invalidResponse: return "invalid (non-HTTP) response"
        case .circuitOpen: return "circuit breaker open"
        case .invalidRequest(let reason): return "invalid request: \(reason)"
        case .responseTooLarge(let limit, let status):
            return "response body larger than \(limit) bytes" + (status.map { " (HTTP \($0))" } ?? "")
        case .underlying(let error):
            if let urlError = error as? URLError { return "URL error \(urlError.code.rawValue)" }
            return "underlying error: \(type(of: error))"
        case .deadlineExceeded: return "total deadline exceeded"
        case .limited(let rejection): return "limited: \(rejection)"
        case .tooManyRedirects: return "too many redirects"
        case .responseHeadersTooLarge: return "response headers larger than the transport accepts"
        }
    }
}
