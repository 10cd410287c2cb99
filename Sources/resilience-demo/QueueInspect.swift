import Foundation
import Resilience

/// `resilience-demo queue inspect DIR`: an operator's read-only view of an on-disk queue.
enum QueueInspect {
    static let usage = "usage: resilience-demo queue inspect DIR"

    static func run(_ arguments: [String]) -> Int32 {
        guard arguments.count == 2, arguments[0] == "inspect" else {
            FileHandle.standardError.write(Data((usage + "\n").utf8))
            return 64
        }
        let directory = URL(fileURLWithPath: arguments[1], isDirectory: true)
        let inspection: DiskQueueStore.Inspection
        do {
            inspection = try DiskQueueStore.inspect(directory: directory)
        } catch {
            FileHandle.standardError.write(Data("resilience-demo queue inspect: \(error)\n".utf8))
            return 1
        }
        let now = Date()
        print("queue \(directory.path): \(inspection.entries.count) entries in replay order")
        let header = ["ID", "PRIORITY", "AGE", "ATTEMPTS", "NEXT ATTEMPT", "METHOD", "URL"]
        var rows = [header]
        for entry in inspection.entries {
            rows.append([
                entry.id.uuidString,
                "\(entry.queuePriority)",
                duration(now.timeIntervalSince(entry.enqueuedAt)),
                "\(entry.attempts)",
                entry.nextAttemptAt.map { $0 <= now ? "due" : "in " + duration($0.timeIntervalSince(now)) } ?? "due",
                entry.method,
                redacted(entry.url),
            ])
        }
        printTable(rows)
        if !inspection.unreadable.isEmpty {
            print("\n\(inspection.unreadable.count) unreadable files (moved to quarantine/ at the next open):")
            for file in inspection.unreadable { print("  \(file.name): \(file.reason)") }
        }
        print("\nquarantine/: \(inspection.quarantined.count) files" + (inspection.quarantined.isEmpty ? "" : ""))
        for name in inspection.quarantined { print("  \(name)") }
        print("dead-letter/: \(inspection.deadLetters) entries; interrupted temp files: \(inspection.temporaryFiles)")
        return 0
    }

    /// The URL without user info and with every query value replaced: nothing secret is printed.
    static func redacted(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "<unparseable URL>" }
        components.user = nil
        components.password = nil
        components.fragment = nil
        if let items = components.queryItems, !items.isEmpty {
            components.queryItems = items.map { URLQueryItem(name: $0.name, value: $0.value == nil ? nil : "…") }
        }
        return components.string ?? "<unparseable URL>"
    }

    static func duration(_ seconds: TimeInterval) -> String {
        let value = max(0, seconds)
        switch value {
        case ..<60: return String(format: "%.0fs", value)
        case ..<3600: return String(format: "%.0fm", value / 60)
        case ..<86_400: return String(format: "%.1fh", value / 3600)
        default: return String(format: "%.1fd", value / 86_400)
        }
    }

    static func printTable(_ rows: [[String]]) {
        guard let first = rows.first else { return }
        let widths = (0..<first.count).map { column in rows.map { $0[column].count }.max() ?? 0 }
        for row in rows {
            print(
                row.enumerated().map { index, cell in
                    index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
                }.joined(separator: "  "))
        }
    }
}
