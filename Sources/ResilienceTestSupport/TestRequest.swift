import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A request for tests. The timeout defaults to infinity so that only backoff sleeps sit on the
/// ManualClock (a finite timeout adds a timer sleeper per attempt).
package struct TestRequest: NetworkRequest {
    package var url: URL
    package var method: HTTPMethod = .get
    package var headers: [String: String] = [:]
    package var body: Data? = nil
    package var timeout: TimeInterval = .infinity
    package var maximumResponseBodySize: Int? = nil
    package var deadline: Duration? = nil

    package init(_ path: String = "/resource", method: HTTPMethod = .get, headers: [String: String] = [:], body: Data? = nil, timeout: TimeInterval = .infinity) {
        url = URL(string: "https://api.example.test\(path)")!
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
    }

    package init(url: URL, method: HTTPMethod = .get, headers: [String: String] = [:], timeout: TimeInterval = .infinity) {
        self.url = url
        self.method = method
        self.headers = headers
        self.timeout = timeout
    }
}

/// A policy that returns whatever it was given, for hostile-delay tests.
package struct ListPolicy: RetryPolicy {
    package let delays: [TimeInterval]
    package init(delays: [TimeInterval]) { self.delays = delays }
    package func delay(forAttempt attempt: Int) -> TimeInterval? {
        attempt < delays.count ? delays[attempt] : nil
    }
}
