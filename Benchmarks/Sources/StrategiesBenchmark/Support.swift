import Foundation
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A plain GET with the protocol's defaults (no headers, no body, 30 s timeout, no deadline of its own).
struct Get: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

/// The body every endpoint here answers with.
let itemBody = Data("{\"id\":1,\"name\":\"item\"}".utf8)

enum BenchmarkFailure: Error {
    case unexpectedBody(byteCount: Int)
}

/// CPU time consumed so far by the whole process (every thread: caller, transport, server).
func processCPUTime() -> Duration {
    var now = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
    return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
}

/// The machine's load averages (1, 5 and 15 minutes), as `uptime` prints them.
func loadAverage() -> String {
    guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return "unknown" }
    return text.split(separator: " ").prefix(3).joined(separator: ", ")
}

func timestamp() -> String {
    let formatter = ISO8601DateFormatter()
    return formatter.string(from: Date())
}

extension Array where Element == Duration {
    /// Nearest-rank percentile of an ascending array (`.zero` when empty).
    func nearestRank(_ fraction: Double) -> Duration {
        guard !isEmpty else { return .zero }
        let rank = Int((Double(count) * fraction).rounded(.up))
        return self[Swift.min(Swift.max(rank, 1), count) - 1]
    }

    var sum: Duration { reduce(.zero, +) }
}

extension Array where Element == Double {
    /// The median (mean of the two middle values for an even count; 0 when empty).
    var median: Double {
        guard !isEmpty else { return 0 }
        let sorted = self.sorted()
        let middle = sorted.count / 2
        return sorted.count.isMultiple(of: 2) ? (sorted[middle - 1] + sorted[middle]) / 2 : sorted[middle]
    }
}

extension Duration {
    /// In microseconds, as a Double.
    var microseconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) * 1e6 + Double(attoseconds) / 1e12
    }

    /// In milliseconds, three significant decimals at most ("0.612 ms", "201.4 ms").
    var milliseconds: String {
        let ms = microseconds / 1000
        return ms < 10 ? String(format: "%.3f ms", ms) : String(format: "%.1f ms", ms)
    }
}

/// Left-aligned first column, right-aligned others, for the printed tables.
func row(_ cells: [String], widths: [Int]) -> String {
    zip(cells, widths).enumerated().map { index, pair in
        let (cell, width) = pair
        let padding = String(repeating: " ", count: max(0, width - cell.count))
        return index == 0 ? cell + padding : padding + cell
    }.joined(separator: "  ")
}
