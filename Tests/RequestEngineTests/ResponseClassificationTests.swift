import Foundation
import Testing

@testable import RequestEngine

@Suite("ResponseClassification: the one status table of retries, breaker and queue replay")
struct ResponseClassificationTests {
    @Test func everyStatusFallsInExactlyTheDocumentedKind() {
        for status in 100...599 {
            let kind = ResponseClassification(status: status, retryAfterHeader: nil).kind
            let expected: ResponseClassification.Kind =
                (200...299).contains(status)
                ? .success
                : ((500...599).contains(status) && status != 501 || status == 408 || status == 429)
                    ? .retryable
                    : .permanent
            #expect(kind == expected, "\(status)")
            #expect(NetworkError.httpError(statusCode: status, data: nil).isRetryable == (kind == .retryable), "\(status)")
        }
    }

    @Test func retryAfterIsReadOnlyOn429And503() {
        #expect(ResponseClassification(status: 429, retryAfterHeader: "7").retryAfter == .seconds(7))
        #expect(ResponseClassification(status: 503, retryAfterHeader: "2").retryAfter == .seconds(2))
        #expect(ResponseClassification(status: 500, retryAfterHeader: "7").retryAfter == nil)
        #expect(ResponseClassification(status: 200, retryAfterHeader: "7").retryAfter == nil)
        #expect(ResponseClassification(status: 404, retryAfterHeader: "7").retryAfter == nil)
        #expect(ResponseClassification(status: 429, retryAfterHeader: "soon").retryAfter == nil)
    }

    @Test func anHTTPDateIsMeasuredFromTheGivenNow() {
        let now = Date(timeIntervalSince1970: 1_000_000_000)
        let header = "Sun, 09 Sep 2001 01:47:00 GMT"  // 2001-09-09T01:46:40Z + 20 s
        #expect(ResponseClassification(status: 503, retryAfterHeader: header, now: now).retryAfter == .seconds(20))
    }

    @Test func theHeaderIsNotReadForStatusesThatNeverUseIt() {
        var reads = 0
        _ = ResponseClassification(
            status: 500,
            retryAfterHeader: {
                reads += 1; return "1"
            }())
        _ = ResponseClassification(
            status: 200,
            retryAfterHeader: {
                reads += 1; return "1"
            }())
        #expect(reads == 0)
    }
}
