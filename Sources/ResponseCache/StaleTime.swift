/// How long a stored response counts as fresh for a read: what HTTP says, or what the app says.
///
/// | `staleTime` | `max-age=600` | `max-age=10` | no lifetime, `Last-Modified` 10 days ago | no freshness information | `no-cache`, invalid `max-age` |
/// | --- | --- | --- | --- | --- | --- |
/// | `.http` | 600 s | 10 s | 1 day (heuristic) | stale | stale |
/// | `.http(atMost: .seconds(60))` | 60 s | 10 s | 60 s | stale | stale |
/// | `.seconds(60)` | 60 s | 10 s | 60 s | 60 s | stale |
/// | `.zero` | stale | stale | stale | stale | stale |
///
/// - `.http` follows RFC 9111 §4.2.1: the server's explicit lifetime (`max-age`, else `Expires`
///   − `Date`); without one, for the statuses HTTP allows (200, 203, 204, 300, 301, 308, 404,
///   405, 410, 414, 501, or any with `Cache-Control: public`), a heuristic of 10 % of the time
///   between `Last-Modified` and `Date`, at most 7 days, as browsers do; otherwise stale.
/// - A duration (`.seconds(60)`, TanStack Query's `staleTime`) is the app's own choice and an
///   upper bound: the server can make it shorter with an explicit lifetime, never longer, and it
///   stands in for the heuristic and for a response that says nothing.
/// - `.http(atMost:)` is HTTP's answer, never longer than the bound: nothing invented for a
///   response that says nothing.
///
/// Whatever the choice, `no-cache` and an invalid explicit lifetime make a response stale at once,
/// and the response's age counts from when the server produced it (its `Age` and `Date`).
public struct StaleTime: Sendable, Hashable {
    enum Rule: Sendable, Hashable {
        case http(atMost: Duration?)
        case duration(Duration)
    }

    let rule: Rule

    /// What HTTP says (RFC 9111 §4.2.1): explicit lifetime, else the heuristic, else stale.
    public static let http = StaleTime(rule: .http(atMost: nil))

    /// What HTTP says, but never longer than `bound`.
    public static func http(atMost bound: Duration) -> StaleTime {
        StaleTime(rule: .http(atMost: max(.zero, bound)))
    }

    /// The app's own lifetime: fresh for `duration` unless the server gives a shorter explicit one.
    public static func duration(_ duration: Duration) -> StaleTime {
        StaleTime(rule: .duration(max(.zero, duration)))
    }

    /// Always stale: every read revalidates (and a failing network serves the stored response, stale).
    public static let zero = StaleTime.duration(.zero)

    /// `.duration(.seconds(seconds))`.
    public static func seconds(_ seconds: some BinaryInteger) -> StaleTime { .duration(.seconds(seconds)) }

    /// `.duration(.seconds(seconds))`.
    public static func seconds(_ seconds: Double) -> StaleTime { .duration(.seconds(seconds)) }

    /// `.duration(.milliseconds(milliseconds))`.
    public static func milliseconds(_ milliseconds: some BinaryInteger) -> StaleTime { .duration(.milliseconds(milliseconds)) }

    /// The freshness lifetime this rule gives a response whose explicit lifetime is `explicit`
    /// (nil when it gives none) and whose heuristic lifetime is `heuristic` (nil when it allows
    /// none; worked out only when needed).
    func lifetime(explicit: Duration?, heuristic: @autoclosure () -> Duration?) -> Duration {
        switch rule {
        case .http(let bound):
            let http = explicit ?? heuristic() ?? .zero
            return bound.map { min($0, http) } ?? http
        case .duration(let duration):
            return explicit.map { min($0, duration) } ?? duration
        }
    }
}
