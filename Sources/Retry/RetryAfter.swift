import Foundation

/// A parsed `Retry-After` header value (RFC 9110 §10.2.3): either delay-seconds or an HTTP-date.
///
/// All three HTTP-date forms a recipient must accept are understood: IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form (`Sunday, 06-Nov-94 08:49:37 GMT`)
/// and asctime (`Sun Nov  6 08:49:37 1994`). Anything else — negative or fractional numbers,
/// other time zones, words — is not a Retry-After value and parses to `nil`, so callers fall back
/// to their own backoff. A date in the past means "retry now" (a delay of zero).
public enum RetryAfter: Hashable, Sendable {
    /// `Retry-After: 120`. Values too large for `Int` saturate at `Int.max`.
    case delaySeconds(Int)
    /// `Retry-After: Fri, 31 Dec 1999 23:59:59 GMT`.
    case httpDate(Date)

    /// Parses a header value; `nil` when it is neither form.
    public init?(headerValue: String) {
        let value = headerValue.trimmingCharacters(in: .whitespaces)
        guard !value.isEmpty else { return nil }
        if value.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            self = .delaySeconds(Int(value) ?? Int.max)  // all digits: only overflow can fail
        } else if let date = HTTPDate.parse(value) {
            self = .httpDate(date)
        } else {
            return nil
        }
    }

    /// How long to wait from `now`: the seconds given, or the time until the date (zero if it has passed).
    public func delay(from now: Date = Date()) -> Duration {
        switch self {
        case .delaySeconds(let seconds):
            return .seconds(seconds)
        case .httpDate(let date):
            return .clamped(seconds: date.timeIntervalSince(now), upperBound: .seconds(Int64.max / 2))
        }
    }

    /// Parses `headerValue` and returns the delay from `now`, or `nil` for an absent or unparseable value.
    public static func delay(headerValue: String?, now: Date = Date()) -> Duration? {
        headerValue.flatMap(RetryAfter.init(headerValue:))?.delay(from: now)
    }
}

/// The three HTTP-date forms of RFC 9110 §5.6.7, parsed by hand: no `DateFormatter`, no locale.
/// As the grammar says, fields are separated by exactly one space (asctime's space-padded day
/// aside): `Sun,  06 Nov 1994 …` is not a date, nor is one in `gmt`. Names of days and months are
/// compared without case.
package enum HTTPDate {
    private static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    private static let shortDays = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    private static let longDays = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

    package static func parse(_ text: String, now: Date = Date()) -> Date? {
        var tokens = text.trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
            .split(separator: " ", omittingEmptySubsequences: false).map { String($0) }
        // asctime writes a one-digit day padded with a space ("Nov  6"), and only so.
        let asctimePadded = tokens.count == 6 && tokens[2].isEmpty && tokens[3].count == 1
        if asctimePadded { tokens.remove(at: 2) }
        if tokens.count == 6, tokens[0].hasSuffix(","), tokens[5] == "GMT",
            shortDays.contains(tokens[0].dropLast().lowercased())
        {
            // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
            guard tokens[1].count == 2, tokens[3].count == 4,
                let day = digits(tokens[1]), let month = month(tokens[2]), let year = digits(tokens[3])
            else { return nil }
            return date(year: year, month: month, day: day, time: tokens[4])
        }
        if tokens.count == 4, tokens[0].hasSuffix(","), tokens[3] == "GMT",
            longDays.contains(tokens[0].dropLast().lowercased())
        {
            // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
            let parts = tokens[1].split(separator: "-").map { String($0) }
            guard parts.count == 3, parts[0].count == 2, parts[2].count == 2,
                let day = digits(parts[0]), let month = month(parts[1]), let shortYear = digits(parts[2])
            else { return nil }
            // RFC 9110: a two-digit year more than 50 years in the future means the past century.
            let currentYear = Calendar(identifier: .gregorian).dateComponents(in: TimeZone(identifier: "UTC") ?? .current, from: now).year ?? 2000
            var year = (currentYear / 100) * 100 + shortYear
            if year > currentYear + 50 { year -= 100 }
            return date(year: year, month: month, day: day, time: tokens[2])
        }
        if tokens.count == 5, shortDays.contains(tokens[0].lowercased()) {
            // asctime: Sun Nov  6 08:49:37 1994
            guard let month = month(tokens[1]), tokens[2].count == (asctimePadded ? 1 : 2), let day = digits(tokens[2]),
                tokens[4].count == 4, let year = digits(tokens[4])
            else { return nil }
            return date(year: year, month: month, day: day, time: tokens[3])
        }
        return nil
    }

    /// `date` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 §5.6.7), to the
    /// second (fractions dropped). Dates before year 1 or after 9999 are clamped to those years.
    package static func format(_ date: Date) -> String {
        let limit = 253_402_300_799.0  // 9999-12-31 23:59:59
        let seconds = Int(min(limit, max(-62_135_596_800, date.timeIntervalSince1970.isFinite ? date.timeIntervalSince1970 : 0)).rounded(.down))
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let time = seconds - days * 86_400
        let (year, month, day) = civilFromDays(days)
        let weekday = shortDays[((days % 7) + 7 + 3) % 7]  // 1970-01-01 was a Thursday
        func two(_ value: Int) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let yearText = String(repeating: "0", count: max(0, 4 - String(year).count)) + String(year)
        return "\(weekday.prefix(1).uppercased() + weekday.dropFirst()), \(two(day)) \(months[month - 1].prefix(1).uppercased() + months[month - 1].dropFirst()) \(yearText) "
            + "\(two(time / 3_600)):\(two(time / 60 % 60)):\(two(time % 60)) GMT"
    }

    /// The civil date of a day count since 1970-01-01 (the inverse of `daysFromCivil`).
    private static func civilFromDays(_ days: Int) -> (year: Int, month: Int, day: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    /// A non-negative decimal made of ASCII digits only (`Int(_:)` would also accept a sign).
    private static func digits(_ token: String) -> Int? {
        guard !token.isEmpty, token.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return Int(token)
    }

    private static func month(_ token: String) -> Int? {
        guard token.count == 3, let index = months.firstIndex(of: token.lowercased()) else { return nil }
        return index + 1
    }

    private static func date(year: Int, month: Int, day: Int, time: String) -> Date? {
        let fields = time.split(separator: ":").map { String($0) }
        guard fields.count == 3, fields.allSatisfy({ $0.count == 2 }),
            let hour = digits(fields[0]), let minute = digits(fields[1]), let second = digits(fields[2]),
            (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second),
            (1...daysInMonth(month, year: year)).contains(day)
        else { return nil }
        let days = daysFromCivil(year: year, month: month, day: day)
        return Date(timeIntervalSince1970: TimeInterval(days * 86_400 + hour * 3_600 + minute * 60 + second))
    }

    private static func daysInMonth(_ month: Int, year: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days since 1970-01-01 in the proleptic Gregorian calendar (Howard Hinnant's algorithm).
    private static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }
}
