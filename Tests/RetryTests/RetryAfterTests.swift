import Foundation
import Testing

@testable import Retry

@Suite("RetryAfter")
struct RetryAfterTests {
    /// Sun, 06 Nov 1994 08:49:37 GMT, the RFC 9110 example date.
    static let exampleDate = Date(timeIntervalSince1970: 784_111_777)

    // MARK: delay-seconds

    @Test func delaySecondsParsesAndBecomesThatDelay() throws {
        let value = try #require(RetryAfter(headerValue: "120"))
        #expect(value == .delaySeconds(120))
        #expect(value.delay(from: Self.exampleDate) == .seconds(120))
    }

    @Test func surroundingWhitespaceIsIgnored() {
        #expect(RetryAfter(headerValue: " 5 ") == .delaySeconds(5))
        #expect(RetryAfter(headerValue: "\t7\t") == .delaySeconds(7))
    }

    @Test func zeroSecondsMeansRetryNow() throws {
        let value = try #require(RetryAfter(headerValue: "0"))
        #expect(value == .delaySeconds(0))
        #expect(value.delay(from: Self.exampleDate) == .zero)
    }

    @Test func leadingZerosAreDecimalNotOctal() {
        #expect(RetryAfter(headerValue: "0010") == .delaySeconds(10))
    }

    @Test func thirtyDigitNumberSaturatesAtIntMax() throws {
        let value = try #require(RetryAfter(headerValue: "123456789012345678901234567890"))
        #expect(value == .delaySeconds(.max))
        #expect(value.delay(from: Self.exampleDate) == .seconds(Int.max))
    }

    // MARK: HTTP-date

    @Test(arguments: [
        "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  // RFC 850
        "Sun Nov  6 08:49:37 1994",  // asctime
    ])
    func allThreeHTTPDateFormsParseToTheSameInstant(header: String) throws {
        let value = try #require(RetryAfter(headerValue: header))
        #expect(value == .httpDate(Self.exampleDate))
        guard case .httpDate(let date) = value else { return }
        #expect(date.timeIntervalSince1970 == 784_111_777)
    }

    @Test func monthAndDayNamesAreCaseInsensitive() {
        #expect(RetryAfter(headerValue: "SUN, 06 NOV 1994 08:49:37 GMT") == .httpDate(Self.exampleDate))
        #expect(RetryAfter(headerValue: "sunday, 06-nov-94 08:49:37 GMT") == .httpDate(Self.exampleDate))
    }

    @Test func epochParsesToZero() {
        #expect(RetryAfter(headerValue: "Thu, 01 Jan 1970 00:00:00 GMT") == .httpDate(Date(timeIntervalSince1970: 0)))
    }

    @Test func pastDateMeansRetryNow() throws {
        let value = try #require(RetryAfter(headerValue: "Sun, 06 Nov 1994 08:49:37 GMT"))
        #expect(value.delay(from: Self.exampleDate.addingTimeInterval(1)) == .zero)
        #expect(value.delay(from: Self.exampleDate.addingTimeInterval(86_400 * 365 * 30)) == .zero)
    }

    @Test func dateEqualToNowMeansRetryNow() throws {
        let value = try #require(RetryAfter(headerValue: "Sun, 06 Nov 1994 08:49:37 GMT"))
        #expect(value.delay(from: Self.exampleDate) == .zero)
    }

    @Test func futureDateGivesTheExactDelayFromNow() throws {
        let value = try #require(RetryAfter(headerValue: "Sun, 06 Nov 1994 08:49:37 GMT"))
        #expect(value.delay(from: Self.exampleDate.addingTimeInterval(-120)) == .seconds(120))
        #expect(value.delay(from: Self.exampleDate.addingTimeInterval(-0.5)) == .milliseconds(500))
        #expect(value.delay(from: Self.exampleDate.addingTimeInterval(-86_400)) == .seconds(86_400))
    }

    @Test func farFutureDateDoesNotTrap() throws {
        let value = try #require(RetryAfter(headerValue: "Fri, 31 Dec 9999 23:59:59 GMT"))
        #expect(value.delay(from: Self.exampleDate) > .seconds(250_000_000_000))
    }

    @Test func staticDelayParsesAndMeasuresFromNow() {
        let now = Self.exampleDate.addingTimeInterval(-30)
        #expect(RetryAfter.delay(headerValue: "Sun, 06 Nov 1994 08:49:37 GMT", now: now) == .seconds(30))
        #expect(RetryAfter.delay(headerValue: "45", now: now) == .seconds(45))
        #expect(RetryAfter.delay(headerValue: nil, now: now) == nil)
        #expect(RetryAfter.delay(headerValue: "soon", now: now) == nil)
    }

    // MARK: Rejections

    @Test(arguments: [
        "",
        "   ",
        "abc",
        "-5",
        "+5",
        "1.5",
        "1e3",
        "5 s",
        "٣",  // Arabic-Indic digit three
        "Sun, 06 Nov 1994 08:49:37 PST",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 gmt",
        "Sun, 31 Feb 1994 08:49:37 GMT",
        "Sun, 31 Apr 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:00:00 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Nov 1994 08:49 GMT",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 November 1994 08:49:37 GMT",
        "Foo, 06 Nov 1994 08:49:37 GMT",
        "Sun 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 31-Feb-94 08:49:37 GMT",
        "Sun Nov 31 08:49:37 1994",
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 08:49:37 1994 GMT",
        "2024-02-29T12:00:00Z",
    ])
    func garbageIsRejected(header: String) {
        #expect(RetryAfter(headerValue: header) == nil)
        #expect(RetryAfter.delay(headerValue: header, now: Self.exampleDate) == nil)
    }

    @Test(arguments: [
        "Sun, +6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 +8:49:37 GMT",
        "Sun Nov +6 08:49:37 1994",
        "Sun, 06 Nov +994 08:49:37 GMT",
    ])
    func signedNumbersInsideADateAreRejected(header: String) {
        #expect(RetryAfter(headerValue: header) == nil)
    }

    // MARK: Calendar

    @Test func leapDayInALeapYearIsValid() {
        #expect(RetryAfter(headerValue: "Thu, 29 Feb 2024 12:00:00 GMT") == .httpDate(Date(timeIntervalSince1970: 1_709_208_000)))
        #expect(RetryAfter(headerValue: "Tue, 29 Feb 2000 00:00:00 GMT") == .httpDate(Date(timeIntervalSince1970: 951_782_400)))
    }

    @Test func leapDayOutsideALeapYearIsInvalid() {
        #expect(RetryAfter(headerValue: "Wed, 29 Feb 2023 12:00:00 GMT") == nil)
        #expect(RetryAfter(headerValue: "Thu, 29 Feb 1900 12:00:00 GMT") == nil)  // century, not divisible by 400
    }

    @Test func leapSecondIsAccepted() {
        #expect(RetryAfter(headerValue: "Sun, 06 Nov 1994 08:49:60 GMT") == .httpDate(Date(timeIntervalSince1970: 784_111_800)))
    }

    // MARK: RFC 850 two-digit years

    @Test func rfc850TwoDigitYearMoreThanFiftyYearsAheadIsInThePastCentury() {
        let now = Date(timeIntervalSince1970: 1_735_689_600)  // 2025-01-01
        #expect(HTTPDate.parse("Sunday, 06-Nov-94 08:49:37 GMT", now: now) == Self.exampleDate)
        #expect(HTTPDate.parse("Thursday, 01-Jan-76 00:00:00 GMT", now: now) == Date(timeIntervalSince1970: 189_302_400))
    }

    @Test func rfc850TwoDigitYearWithinFiftyYearsIsInThisCentury() {
        let now = Date(timeIntervalSince1970: 1_735_689_600)  // 2025-01-01
        #expect(HTTPDate.parse("Wednesday, 01-Jan-70 00:00:00 GMT", now: now) == Date(timeIntervalSince1970: 3_155_760_000))
    }
}
