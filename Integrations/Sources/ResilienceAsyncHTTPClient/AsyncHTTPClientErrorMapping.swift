import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import RequestEngine

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

extension NetworkError {
    /// Maps an error thrown by AsyncHTTPClient (or by SwiftNIO beneath it) onto the case the
    /// URLSession path reports for the same failure (`NetworkError(mapping:)`):
    ///
    /// | AHC / NIO | `NetworkError` |
    /// | --- | --- |
    /// | `ECONNREFUSED` (alone or in a `NIOConnectionError`), `ENETUNREACH`, `EHOSTUNREACH` | `.transport(.cannotConnectToHost)` |
    /// | `NIOConnectionError` whose DNS look-ups failed and found no address | `.transport(.dnsFailure)` |
    /// | `remoteConnectionClosed`, `ECONNRESET`, `EPIPE`, EOF or I/O on a closed channel, a body cut short, TLS closed uncleanly | `.transport(.connectionLost)` |
    /// | any other `NIOSSLError`, `BoringSSLError`, `NIOSSLExtraError`, `tlsHandshakeTimeout` | `.transport(.secureConnectionFailed)` |
    /// | `readTimeout`, `writeTimeout`, `connectTimeout`, `deadlineExceeded`, `getConnectionFromPoolTimeout`, `ETIMEDOUT` | `.timedOut` |
    /// | `cancelled`, `CancellationError` | `.cancelled` |
    /// | `redirectLimitReached`, `redirectCycleDetected` | `.tooManyRedirects` |
    /// | `HTTPParserError.headerOverflow` (a header block over NIO's 80 KiB) | `.responseHeadersTooLarge` |
    /// | `HTTPParserError.invalidEOFState` (the connection closed inside a message) | `.transport(.connectionLost)` |
    /// | any other `HTTPParserError` (bytes that are not HTTP) | `.invalidResponse` |
    /// | `invalidURL`, `emptyHost`, `emptyScheme`, `unsupportedScheme`, invalid header names or values | `.invalidRequest` |
    /// | a `NetworkError` | itself |
    /// | anything else | `.underlying(error)` |
    public init(mappingAsyncHTTPClientError error: any Error) {
        switch error {
        case let error as NetworkError:
            self = error
        case is CancellationError:
            self = .cancelled
        case let error as HTTPClientError:
            self = Self.map(error)
        case let error as NIOConnectionError:
            self = Self.map(error)
        case let error as IOError:
            self = Self.map(errno: error.errnoCode) ?? .underlying(error)
        case let error as ChannelError:
            self = Self.map(error) ?? .underlying(error)
        case let error as HTTPParserError:
            // The connection ended inside a message: a body shorter than its Content-Length or a
            // chunked body without its last chunk, which the URLSession path reports the same way.
            switch error {
            case .invalidEOFState: self = .transport(.connectionLost)
            case .headerOverflow: self = .responseHeadersTooLarge
            default: self = .invalidResponse
            }
        case let error as NIOSSLError:
            if case .uncleanShutdown = error {
                self = .transport(.connectionLost)
            } else {
                self = .transport(.secureConnectionFailed)
            }
        case is BoringSSLError, is NIOSSLExtraError:
            self = .transport(.secureConnectionFailed)
        default:
            self = .underlying(error)
        }
    }

    /// Whether `error` says the connection ended with no byte of a response parsed: it maps to
    /// `.transport(.connectionLost)` (closed by the server, reset, a write or read on a closed
    /// channel, TLS closed uncleanly) and is neither the parser's end of input inside a message
    /// (bytes had arrived) nor a body length mismatch (the request's framing, which a second send
    /// would repeat). The caller also checks that no response head arrived.
    static func isConnectionLostBeforeResponse(_ error: any Error) -> Bool {
        switch error {
        case is HTTPParserError:
            return false
        case let error as HTTPClientError where error == .bodyLengthMismatch:
            return false
        default:
            guard case .transport(.connectionLost) = NetworkError(mappingAsyncHTTPClientError: error) else { return false }
            return true
        }
    }

    private static func map(_ error: HTTPClientError) -> NetworkError {
        switch error {
        case .cancelled, .requestStreamCancelled:
            return .cancelled
        case .readTimeout, .writeTimeout, .connectTimeout, .deadlineExceeded, .getConnectionFromPoolTimeout,
            .socksHandshakeTimeout, .httpProxyHandshakeTimeout:
            return .timedOut
        case .tlsHandshakeTimeout:
            return .transport(.secureConnectionFailed)
        case .redirectLimitReached, .redirectCycleDetected:
            return .tooManyRedirects
        case .remoteConnectionClosed, .bodyLengthMismatch, .uncleanShutdown:
            return .transport(.connectionLost)
        case .invalidURL, .emptyHost, .emptyScheme, .missingSocketPath:
            return .invalidRequest(reason: "AsyncHTTPClient cannot send to this URL (\(error.shortDescription))")
        case .traceRequestWithBody:
            return .invalidRequest(reason: "AsyncHTTPClient rejected the request (\(error.shortDescription))")
        default:
            if error.shortDescription.hasPrefix("Unsupported scheme") {
                return .invalidRequest(reason: "URL scheme must be http or https")
            }
            if error.shortDescription.hasPrefix("Invalid header field") {
                return .invalidRequest(reason: "AsyncHTTPClient rejected a header (\(error.shortDescription))")
            }
            return .underlying(error)
        }
    }

    private static func map(_ error: NIOConnectionError) -> NetworkError {
        let failures = error.connectionErrors.map(\.error)
        if failures.isEmpty {
            // No address to try: both look-ups failed (or found nothing).
            return error.dnsAError != nil || error.dnsAAAAError != nil ? .transport(.dnsFailure) : .transport(.cannotConnectToHost)
        }
        for failure in failures {
            if let io = failure as? IOError, let mapped = map(errno: io.errnoCode) { return mapped }
            if let channel = failure as? ChannelError, let mapped = map(channel) { return mapped }
        }
        return .transport(.cannotConnectToHost)
    }

    private static func map(errno code: CInt) -> NetworkError? {
        switch code {
        case ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, EADDRNOTAVAIL:
            return .transport(.cannotConnectToHost)
        case ECONNRESET, EPIPE, ECONNABORTED, ENOTCONN:
            return .transport(.connectionLost)
        case ETIMEDOUT:
            return .timedOut
        default:
            return nil
        }
    }

    private static func map(_ error: ChannelError) -> NetworkError? {
        switch error {
        case .connectTimeout:
            return .timedOut
        case .eof, .ioOnClosedChannel, .alreadyClosed, .outputClosed, .inputClosed:
            return .transport(.connectionLost)
        default:
            return nil
        }
    }
}
