import AsyncHTTPClient
import Foundation
import IntegrationTestSupport
import NIOCore
import NIOHTTP1
import NIOSSL
import RequestEngine
import ResilienceAsyncHTTPClient
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `NetworkError(mappingAsyncHTTPClientError:)` case by case, for the errors no loopback server can
/// provoke on demand (the end-to-end cases are in AsyncHTTPClientSessionTests).
@Suite("AsyncHTTPClient error mapping")
struct ErrorMappingTests {
    static let cases: [(String, any Error, String)] = [
        ("readTimeout", HTTPClientError.readTimeout, "timedOut"),
        ("writeTimeout", HTTPClientError.writeTimeout, "timedOut"),
        ("connectTimeout", HTTPClientError.connectTimeout, "timedOut"),
        ("deadlineExceeded", HTTPClientError.deadlineExceeded, "timedOut"),
        ("getConnectionFromPoolTimeout", HTTPClientError.getConnectionFromPoolTimeout, "timedOut"),
        ("tlsHandshakeTimeout", HTTPClientError.tlsHandshakeTimeout, "transport(secureConnectionFailed)"),
        ("cancelled", HTTPClientError.cancelled, "cancelled"),
        ("CancellationError", CancellationError(), "cancelled"),
        ("remoteConnectionClosed", HTTPClientError.remoteConnectionClosed, "transport(connectionLost)"),
        ("ECONNREFUSED", IOError(errnoCode: ECONNREFUSED, reason: "connect"), "transport(cannotConnectToHost)"),
        ("ECONNRESET", IOError(errnoCode: ECONNRESET, reason: "read"), "transport(connectionLost)"),
        ("EPIPE", IOError(errnoCode: EPIPE, reason: "write"), "transport(connectionLost)"),
        ("ETIMEDOUT", IOError(errnoCode: ETIMEDOUT, reason: "connect"), "timedOut"),
        ("ChannelError.connectTimeout", ChannelError.connectTimeout(.seconds(1)), "timedOut"),
        ("ChannelError.eof", ChannelError.eof, "transport(connectionLost)"),
        ("ChannelError.ioOnClosedChannel", ChannelError.ioOnClosedChannel, "transport(connectionLost)"),
        ("HTTPParserError.invalidEOFState", HTTPParserError.invalidEOFState, "transport(connectionLost)"),
        ("HTTPParserError.invalidVersion", HTTPParserError.invalidVersion, "invalidResponse"),
        ("NIOSSLError.handshakeFailed", NIOSSLError.handshakeFailed(.sslError([])), "transport(secureConnectionFailed)"),
        ("NIOSSLError.uncleanShutdown", NIOSSLError.uncleanShutdown, "transport(connectionLost)"),
        ("invalidURL", HTTPClientError.invalidURL, "invalidRequest"),
        ("unsupportedScheme", HTTPClientError.unsupportedScheme("ftp"), "invalidRequest"),
        ("NetworkError passes through", NetworkError.responseTooLarge(limit: 5, statusCode: 200), "responseTooLarge(5)"),
    ]

    @Test(arguments: cases.indices)
    func eachErrorMapsAsTheURLSessionPathMapsTheSameFailure(index: Int) {
        let (name, error, expected) = Self.cases[index]
        #expect(NetworkError(mappingAsyncHTTPClientError: error).caseName == expected, "\(name)")
    }

    @Test func anUnknownErrorIsUnderlyingAndNotRetried() {
        struct Strange: Error {}
        let mapped = NetworkError(mappingAsyncHTTPClientError: Strange())
        guard case .underlying(let inner) = mapped else {
            Issue.record("expected underlying, got \(mapped)")
            return
        }
        #expect(inner is Strange)
        #expect(!mapped.isRetryable)
    }
}
