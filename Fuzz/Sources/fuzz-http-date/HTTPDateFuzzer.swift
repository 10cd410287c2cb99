import Foundation
import FuzzSupport

@testable import Retry

/// `Retry-After` values and HTTP-dates (`RetryAfter`, `HTTPDate`; the response cache reads `Date`,
/// `Expires` and `Last-Modified` with the same parser).
///
/// Contract: no input crashes; a delay is never negative; a parsed date is a whole second, does
/// not depend on the time of parsing (only RFC 850's two-digit year does, and then it falls within
/// 50 years of it), and reads back from its IMF-fixdate; `format` gives a 29-character IMF-fixdate
/// for any date (the first 8 bytes, as a `Double`), which parses back to that date's second.
@main
enum HTTPDateFuzzer {
    static let now = Date(timeIntervalSince1970: 1_700_000_000)  // 2023-11-14
    static let later = Date(timeIntervalSince1970: 4_102_444_800)  // 2100-01-01
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the dates `format` writes unclamped.
    static let formattable = -62_135_596_800.0...253_402_300_799.0

    static func main() {
        FuzzDriver.run { data, size in
            HTTPDateFuzzer.check(FuzzInput(data, size))
            return 0
        }
    }

    static func check(_ input: FuzzInput) {
        let text = input.text
        if let retryAfter = RetryAfter(headerValue: text) {
            for moment in [now, later, .distantPast] { fuzzCheck(retryAfter.delay(from: moment) >= .zero, "negative delay for \(text)") }
            if case .delaySeconds(let seconds) = retryAfter { fuzzCheck(seconds >= 0, "negative delay-seconds for \(text)") }
        }
        _ = RetryAfter.delay(headerValue: text, now: now)

        let parsed = HTTPDate.parse(text, now: now)
        let parsedLater = HTTPDate.parse(text, now: later)
        // Only RFC 850's form (`Sunday, 06-Nov-94 ...`) has a two-digit year, read relative to now.
        fuzzCheck((parsed == nil) == (parsedLater == nil) || text.contains("-"), "whether \(text) is a date depends on when it is parsed")
        for (date, moment) in [(parsed, now), (parsedLater, later)] {
            guard let date else { continue }
            let seconds = date.timeIntervalSince1970
            fuzzCheck(seconds.isFinite && seconds == seconds.rounded(.down), "\(text) parses to \(seconds)")
            if date != (moment == now ? parsedLater : parsed) {
                // Only a two-digit year reads differently at another time, and within 50 years of it.
                let years = abs(date.timeIntervalSince(moment)) / (365.2425 * 86_400)
                fuzzCheck(years <= 51, "\(text) parses to a date \(years) years from now")
            }
            if formattable.contains(seconds) {
                let printed = HTTPDate.format(date)
                fuzzCheck(HTTPDate.parse(printed, now: moment) == date, "\(text) parses to \(seconds), printed \(printed), which reads back differently")
            }
        }

        guard input.bytes.count >= 8 else { return }
        let bits = input.bytes.prefix(8).reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        // The date as `Date` holds it (relative to 2001: -1e-130 s after 1970 is 1970 itself).
        let seconds = Date(timeIntervalSince1970: Double(bitPattern: bits)).timeIntervalSince1970
        let printed = HTTPDate.format(Date(timeIntervalSince1970: seconds))
        fuzzCheck(printed.utf8.count == 29, "format(\(seconds)) is \(printed)")
        fuzzCheck(HTTPDate.parse(printed, now: now) != nil, "format(\(seconds)) = \(printed) does not parse")
        if formattable.contains(seconds) {
            fuzzCheck(HTTPDate.parse(printed, now: now)?.timeIntervalSince1970 == seconds.rounded(.down), "format(\(seconds)) = \(printed) reads back differently")
        }
    }
}
