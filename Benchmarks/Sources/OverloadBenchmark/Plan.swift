import Foundation
import ResilienceAsyncHTTPClient

/// What one run gave over its measured window (after the warm-up).
struct RunSummary: Sendable {
    var limiting: Limiting
    var load: Double
    /// Successes a second.
    var goodput: Double
    var p50: Double
    var p99: Double
    var outcomes: [Outcome: Int]
    /// The client's limit, averaged over the window (nil: no limit).
    var meanLimit: Double?

    init(_ result: RunResult, from start: Double, to end: Double) {
        limiting = result.limiting
        load = result.load
        let measured = result.samples.filter { $0.arrival >= start && $0.arrival < end }
        let successes = measured.filter { $0.outcome == .ok }.map(\.latency).sorted()
        goodput = Double(successes.count) / (end - start)
        p50 = successes.percentile(0.5)
        p99 = successes.percentile(0.99)
        outcomes = Dictionary(grouping: measured, by: \.outcome).mapValues(\.count)
        let limits = result.limits.filter { $0.time >= start && $0.time < end }.compactMap(\.limit)
        meanLimit = limits.isEmpty ? nil : Double(limits.reduce(0, +)) / Double(limits.count)
    }

    var errors: String {
        Outcome.allCases.filter { $0 != .ok }.compactMap { kind in
            outcomes[kind].map { "\(kind.rawValue) \($0)" }
        }.joined(separator: ", ")
    }
}

extension Array where Element == Double {
    /// Nearest-rank percentile of an ascending array (0 when empty).
    func percentile(_ fraction: Double) -> Double {
        guard !isEmpty else { return 0 }
        let rank = Int((Double(count) * fraction).rounded(.up))
        return self[Swift.min(Swift.max(rank, 1), count) - 1]
    }
}

/// The whole benchmark: the upstream's shape, the loads, the sweep, the halving run, and the report.
struct BenchmarkPlan {
    let workers = 10
    let serviceMilliseconds = 25
    let queueMilliseconds = 100
    /// Requests a second the upstream can serve: workers / service time.
    var capacity: Double { Double(workers) * 1_000 / Double(serviceMilliseconds) }
    let loads: [Double] = [0.5, 1, 2, 4]
    let staticLimits: [Int]
    /// Seconds per constant-load run, and the warm-up not measured at its start.
    let duration: Double
    let warmUp: Double
    /// Seconds per phase of the halving run (full capacity, then half).
    let phase: Double

    init(quick: Bool) {
        staticLimits = quick ? [8, 10, 15, 30] : [5, 8, 10, 12, 15, 20, 30, 50]
        duration = quick ? 4 : 10
        warmUp = quick ? 1 : 2
        phase = quick ? 5 : 10
    }

    func run(upstream: URL, session: AsyncHTTPClientSession, seed: UInt64, outputFolder: URL) async throws -> String {
        let started = Date()
        var summaries: [Double: [RunSummary]] = [:]
        var runIndex: UInt64 = 0
        for load in loads {
            let candidates: [Limiting] = [.none] + staticLimits.map { .fixed($0) } + [.gradient, .aimd]
            for limiting in candidates {
                runIndex += 1
                // The same seed for every limiting at one load: each meets the same arrivals.
                let result = try await runLoad(
                    limiting: limiting, load: load, rate: capacity * load, duration: duration,
                    seed: seed &+ UInt64(load * 100), upstream: upstream, session: session,
                    workers: workers, halvedWorkers: workers / 2
                )
                let summary = RunSummary(result, from: warmUp, to: duration)
                summaries[load, default: []].append(summary)
                log("load \(load)x  \(limiting): goodput \(Int(summary.goodput))/s, p99 \(ms(summary.p99)), \(summary.errors)")
                if case .fixed = limiting {
                } else {
                    try write(result, to: outputFolder.appendingPathComponent("load-\(load)-\(limiting.fileName)"))
                }
                try await Task.sleep(for: .milliseconds(500))  // the upstream's line empties
            }
        }

        // Capacity halves midway, the arrivals staying at the full capacity (so 2x the new one).
        let bestAtFull = best(summaries[1] ?? [])
        var halving: [(Limiting, RunResult)] = []
        for limiting in [Limiting.none, bestAtFull?.limiting ?? .fixed(workers), .gradient, .aimd] {
            let result = try await runLoad(
                limiting: limiting, load: 1, rate: capacity, duration: 2 * phase, seed: seed &+ 1_000,
                upstream: upstream, session: session, halveAt: phase, workers: workers, halvedWorkers: workers / 2
            )
            try write(result, to: outputFolder.appendingPathComponent("halving-\(limiting.fileName)"))
            halving.append((limiting, result))
            log("halving  \(limiting): done")
            try await Task.sleep(for: .milliseconds(500))
        }

        return report(summaries: summaries, halving: halving, started: started, seed: seed)
    }

    /// The static limit an operator would pick at one load: of those within 1 % of the highest
    /// goodput (closer than that is noise), the one with the lowest p99.
    func best(_ summaries: [RunSummary]) -> RunSummary? {
        let statics = summaries.filter { if case .fixed = $0.limiting { true } else { false } }
        guard let top = statics.map(\.goodput).max() else { return nil }
        return statics.filter { $0.goodput >= top * 0.99 }.min { $0.p99 < $1.p99 }
    }

    /// When the limit settled after the halving: the first time after which every sample stays
    /// within 20 % (at least 2 places) of the level it ends at (the median of the last half of the
    /// second phase). nil when it never does.
    func settleTime(_ result: RunResult) -> (seconds: Double, level: Double)? {
        let after = result.limits.filter { $0.time >= phase }
        let tail = after.filter { $0.time >= phase * 1.5 }.compactMap(\.limit).map(Double.init).sorted()
        guard !tail.isEmpty else { return nil }
        let level = tail.percentile(0.5)
        let band = max(2, level * 0.2)
        var settled: Double?
        for sample in after {
            guard let limit = sample.limit else { continue }
            if abs(Double(limit) - level) > band { settled = nil } else if settled == nil { settled = sample.time }
        }
        return settled.map { ($0 - phase, level) }
    }

    func report(summaries: [Double: [RunSummary]], halving: [(Limiting, RunResult)], started: Date, seed: UInt64) -> String {
        var lines: [String] = []
        let elapsed = Date().timeIntervalSince(started)
        lines.append("# Overload benchmark")
        lines.append("")
        lines.append(
            "Upstream: \(workers) workers x \(serviceMilliseconds) ms, 503 after \(queueMilliseconds) ms in line: capacity \(Int(capacity)) requests/s. "
                + "Arrivals: Poisson, seed \(seed). Runs of \(Int(duration)) s, the first \(Int(warmUp)) s not measured. "
                + "Static sweep: \(staticLimits.map(String.init).joined(separator: ", ")). Took \(Int(elapsed)) s; load average \(loadAverage()).")
        lines.append("")
        lines.append("| Load | Limiting | Goodput /s | vs best static | p50 | p99 | Mean limit | Errors |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
        var p99ByLimiting: [Limiting: [Double: Double]] = [:]
        var goodputTarget: [Limiting: Bool] = [.gradient: true, .aimd: true]
        for load in loads {
            let runs = summaries[load] ?? []
            let bestStatic = best(runs)
            for run in runs {
                let isBest = run.limiting == bestStatic?.limiting
                if case .fixed = run.limiting, !isBest { continue }  // the sweep's others: in the CSV
                let ratio = bestStatic.map { run.goodput / max(1, $0.goodput) } ?? 0
                if run.limiting == .gradient || run.limiting == .aimd, ratio < 0.95 { goodputTarget[run.limiting] = false }
                p99ByLimiting[run.limiting, default: [:]][load] = run.p99
                let name = isBest ? "\(run.limiting) (best static)" : run.limiting.description
                lines.append(
                    "| \(load)x | \(name) | \(Int(run.goodput)) | \(String(format: "%.1f %%", ratio * 100)) | \(ms(run.p50)) | \(ms(run.p99)) | "
                        + "\(run.meanLimit.map { String(format: "%.1f", $0) } ?? "-") | \(run.errors.isEmpty ? "-" : run.errors) |")
            }
        }
        lines.append("")
        lines.append("Static sweep (goodput /s, p99):")
        lines.append("")
        lines.append("| Load | " + staticLimits.map { "static \($0)" }.joined(separator: " | ") + " |")
        lines.append("| --- |" + String(repeating: " ---: |", count: staticLimits.count))
        for load in loads {
            let runs = summaries[load] ?? []
            let cells = staticLimits.map { limit -> String in
                guard let run = runs.first(where: { $0.limiting == .fixed(limit) }) else { return "-" }
                return "\(Int(run.goodput)), \(ms(run.p99))"
            }
            lines.append("| \(load)x | " + cells.joined(separator: " | ") + " |")
        }
        lines.append("")
        lines.append("Targets:")
        for limiting in [Limiting.gradient, .aimd] {
            lines.append("- \(limiting): goodput at least 95 % of the best static limit's at every load: \(goodputTarget[limiting] == true ? "met" : "MISSED").")
            let p99s = p99ByLimiting[limiting] ?? [:]
            if let calm = p99s[0.5] {
                let at2 = (p99s[2] ?? 0) / calm
                let at4 = (p99s[4] ?? 0) / calm
                lines.append(
                    "- \(limiting): p99 at 2x is \(String(format: "%.2f", at2))x and at 4x \(String(format: "%.2f", at4))x the p99 at 0.5x (\(ms(calm))); target at most 3x: \(max(at2, at4) <= 3 ? "met" : "MISSED")."
                )
            }
        }
        if let calm = p99ByLimiting[.none]?[0.5] {
            let p99s = p99ByLimiting[.none] ?? [:]
            lines.append("- no limit, for comparison: p99 at 2x is \(String(format: "%.2f", (p99s[2] ?? 0) / calm))x and at 4x \(String(format: "%.2f", (p99s[4] ?? 0) / calm))x its p99 at 0.5x.")
        }
        lines.append("")
        lines.append("Capacity halved at \(Int(phase)) s (arrivals stay at \(Int(capacity))/s, so 2x the halved capacity):")
        lines.append("")
        lines.append("| Limiting | Goodput /s before | after | p99 before | after | Errors after | Limit settled |")
        lines.append("| --- | ---: | ---: | ---: | ---: | --- | --- |")
        for (limiting, result) in halving {
            let before = RunSummary(result, from: warmUp, to: phase)
            let after = RunSummary(result, from: phase, to: 2 * phase)
            var settled = "-"
            if limiting == .gradient || limiting == .aimd {
                if let (seconds, level) = settleTime(result) {
                    settled = String(format: "after %.2f s at about %.0f (target 2 s: %@)", seconds, level, seconds <= 2 ? "met" : "MISSED")
                } else {
                    settled = "never (MISSED)"
                }
            }
            lines.append("| \(limiting) | \(Int(before.goodput)) | \(Int(after.goodput)) | \(ms(before.p99)) | \(ms(after.p99)) | \(after.errors.isEmpty ? "-" : after.errors) | \(settled) |")
        }
        lines.append("")
        return lines.joined(separator: "\n")
    }

    /// `<base>-samples.csv` (arrival, latency, outcome) and `<base>-limits.csv` (time, limit, in flight, waiting).
    func write(_ result: RunResult, to base: URL) throws {
        var samples = "arrival_s,latency_ms,outcome\n"
        for sample in result.samples.sorted(by: { $0.arrival < $1.arrival }) {
            samples += String(format: "%.4f,%.3f,", sample.arrival, sample.latency * 1_000) + sample.outcome.rawValue + "\n"
        }
        try Data(samples.utf8).write(to: URL(fileURLWithPath: base.path + "-samples.csv"))
        var limits = "time_s,limit,in_flight,waiting\n"
        for sample in result.limits {
            limits += String(format: "%.3f,", sample.time) + (sample.limit.map(String.init) ?? "") + ",\(sample.inFlight),\(sample.waiting)\n"
        }
        try Data(limits.utf8).write(to: URL(fileURLWithPath: base.path + "-limits.csv"))
    }
}

func ms(_ seconds: Double) -> String {
    String(format: "%.1f ms", seconds * 1_000)
}

func log(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

/// The machine's load averages (1, 5 and 15 minutes), as `uptime` prints them.
func loadAverage() -> String {
    guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return "unknown" }
    return text.split(separator: " ").prefix(3).joined(separator: ", ")
}
