import Foundation
import RequestEngine

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes one line per event, in logfmt (`key=value`), to a writer closure (standard error by
/// default). Secrets stay out: URLs lose their user info, query, fragment and matrix parameters;
/// errors are described without bodies, headers or URLs; events carry no headers at all.
///
/// ```
/// resilience event=started trace=5F1C…-… method=GET url=https://api.example.com/users/42
/// resilience event=retry_scheduled trace=5F1C…-… attempt=0 delay=0.250
/// resilience event=succeeded trace=5F1C…-… status=200 attempt=1 duration=0.318
/// resilience event=failed trace=… attempt=2 error="HTTP 503 (0 body bytes)"
/// resilience event=deduplicated trace=… method=GET url=https://api.example.com/users/42
/// ```
/// Durations and delays are in seconds with millisecond precision. Pass a `pathTemplate` to log
/// templates (`/users/{id}`) instead of paths, for APIs that put personal data in paths.
/// The writer runs on the request's path; the default writes each line with a single `write(2)`,
/// so lines from concurrent requests do not interleave.
public struct LoggingEventSink: RequestEventSink {
    private let label: String
    private let pathTemplate: PathTemplate?
    private let writer: @Sendable (String) -> Void

    /// A sink that writes lines starting with `label` to `writer` (which receives each line
    /// without a trailing newline).
    public init(
        label: String = "resilience",
        pathTemplate: PathTemplate? = nil,
        writer: @escaping @Sendable (String) -> Void = LoggingEventSink.standardError
    ) {
        self.label = label
        self.pathTemplate = pathTemplate
        self.writer = writer
    }

    /// Writes `line` and a newline to standard error in one `write(2)` call.
    public static let standardError: @Sendable (String) -> Void = { line in
        var bytes = Array(line.utf8)
        bytes.append(UInt8(ascii: "\n"))
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count, let base = buffer.baseAddress {
                let written = write(STDERR_FILENO, base + offset, buffer.count - offset)
                if written <= 0 { break }
                offset += written
            }
        }
    }

    /// Writes the line for `event`.
    public func record(_ event: RequestEvent) async {
        writer(line(for: event))
    }

    /// Writes the line for `event` with ` operation=<id>` after the method (`started` and
    /// `deduplicated` of a request that performs an API operation).
    public func record(_ event: RequestEvent, operation operationID: String) async {
        writer(line(for: event, operation: operationID))
    }

    /// The line written for `event`.
    func line(for event: RequestEvent, operation operationID: String? = nil) -> String {
        let trace = "trace=\(event.traceID.uuidString)"
        let operation = operationID.map { " operation=" + quoted($0) } ?? ""
        switch event {
        case .started(_, let url, let method):
            return "\(label) event=started \(trace) method=\(method.rawValue)\(operation) url=\(quoted(RedactedURL.string(for: url, pathTemplate: pathTemplate)))"
        case .retryScheduled(_, let attempt, let delay):
            return "\(label) event=retry_scheduled \(trace) attempt=\(attempt) delay=\(Self.seconds(delay))"
        case .succeeded(_, let statusCode, let duration, let attempt):
            return "\(label) event=succeeded \(trace) status=\(statusCode) attempt=\(attempt) duration=\(Self.seconds(duration))"
        case .failed(_, let error, let attempt):
            return "\(label) event=failed \(trace) attempt=\(attempt) error=\(quoted(error.description))"
        case .deduplicated(_, let url, let method):
            return "\(label) event=deduplicated \(trace) method=\(method.rawValue)\(operation) url=\(quoted(RedactedURL.string(for: url, pathTemplate: pathTemplate)))"
        }
    }

    /// `value` as a logfmt value: bare when it has no space, quote, backslash, `=` or control
    /// character; otherwise in double quotes with `"` and `\` escaped and line breaks as `\n`.
    private func quoted(_ value: String) -> String {
        let needsQuotes =
            value.isEmpty
            || value.unicodeScalars.contains {
                $0 == " " || $0 == "\"" || $0 == "\\" || $0 == "=" || $0.value < 0x20 || $0.value == 0x7F
            }
        guard needsQuotes else { return value }
        var escaped = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    escaped += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    escaped.unicodeScalars.append(scalar)
                }
            }
        }
        return escaped + "\""
    }

    /// Seconds with three decimals (`0.250`); `nan` or `inf` as such.
    private static func seconds(_ value: TimeInterval) -> String {
        guard value.isFinite else { return value.isNaN ? "nan" : "inf" }
        return String(format: "%.3f", value)
    }
}
