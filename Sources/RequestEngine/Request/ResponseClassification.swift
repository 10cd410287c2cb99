import Foundation
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What an HTTP response means for what follows — the one table the engine's retries, its circuit
/// breaker and the offline queue's replay all read, so they can never disagree:
///
/// | status | kind | `Retry-After` read |
/// | --- | --- | --- |
/// | 2xx | `success` | — |
/// | 408, 429, 5xx except 501 | `retryable` | on 429 and 503 |
/// | anything else | `permanent` | — |
package struct ResponseClassification: Sendable, Equatable {
    package enum Kind: Sendable, Equatable {
        case success
        /// Trying again may succeed (and counts against a circuit breaker).
        case retryable
        /// The same request would get the same answer.
        case permanent
    }

    package let kind: Kind
    /// The server's valid `Retry-After` on a 429 or 503 (uncapped), else `nil`.
    package let retryAfter: Duration?

    /// Classifies a status and, for 429 and 503, its `Retry-After` header value (an HTTP-date is
    /// measured from `now`).
    package init(status: Int, retryAfterHeader: @autoclosure () -> String?, now: @autoclosure () -> Date = Date()) {
        if (200...299).contains(status) {
            kind = .success
            retryAfter = nil
        } else if Self.isRetryable(status: status) {
            kind = .retryable
            retryAfter = status == 429 || status == 503 ? RetryAfter.delay(headerValue: retryAfterHeader(), now: now()) : nil
        } else {
            kind = .permanent
            retryAfter = nil
        }
    }

    /// Classifies a response (its status and `Retry-After`).
    package init(_ response: HTTPURLResponse, now: @autoclosure () -> Date = Date()) {
        self.init(
            status: response.statusCode,
            retryAfterHeader: response.value(forHTTPHeaderField: HTTPHeader.retryAfter),
            now: now()
        )
    }

    /// Classifies a response head (its status and `Retry-After`).
    package init(_ head: ResponseHead, now: @autoclosure () -> Date = Date()) {
        self.init(status: head.statusCode, retryAfterHeader: head.value(forHTTPHeaderField: HTTPHeader.retryAfter), now: now())
    }

    /// Whether a response with this status is worth trying again: 408, 429 and 5xx except 501.
    package static func isRetryable(status: Int) -> Bool {
        (500...599).contains(status) && status != 501 || status == 408 || status == 429
    }
}
