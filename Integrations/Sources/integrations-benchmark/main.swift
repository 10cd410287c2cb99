import AsyncHTTPClient
import Foundation
import NIOCore
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

// Engine over AsyncHTTPClient against raw AsyncHTTPClient and against the engine over URLSession
// (URLSessionTransport), in interleaved rounds so that the machine's drift hits every variant alike,
// against LoopbackHTTPServer in this process (200-byte body) or, with `--url`, an external server
// such as the nginx of Integrations/Benchmark/nginx.sh. See Benchmarks/README.md.
//
//   integrations-benchmark [--url URL] [rounds] [sequential-per-round] [concurrent-per-round]
//   integrations-benchmark [--url URL] profile VARIANT COUNT [64]
//
// The external server must answer GET URL and GET URL?worker=N (N in 0..<64) with 200 and a
// 200-byte body.

var arguments = Array(CommandLine.arguments.dropFirst())
var externalURL: URL?
if let flag = arguments.firstIndex(of: "--url") {
    guard flag + 1 < arguments.count, let parsed = URL(string: arguments[flag + 1]), parsed.host != nil else {
        fatalError("--url needs an http URL, e.g. --url http://127.0.0.1:8089/bench")
    }
    externalURL = parsed
    arguments.removeSubrange(flag...flag + 1)
}
let profiling = arguments.first == "profile"
let numbers = arguments.dropFirst(profiling ? 1 : 0).compactMap { Int($0) }
let rounds = !profiling && numbers.count > 0 ? numbers[0] : 20
let sequentialPerRound = !profiling && numbers.count > 1 ? numbers[1] : 500
let concurrentPerRound = !profiling && numbers.count > 2 ? numbers[2] : 6400
let inFlight = 64
let bodySize = 200

// In-process mode only: the server shares this process and its CPUs with the clients.
let server: LoopbackHTTPServer? = externalURL == nil ? try LoopbackHTTPServer() : nil
server?.route("/bench", .ok(String(repeating: "x", count: bodySize)))
let url = externalURL ?? server?.url("/bench") ?? URL(fileURLWithPath: "/")
// One URL per concurrent worker: identical concurrent GETs would be deduplicated by the engine
// (one network call for many callers), which is not what is measured here.
let workerURLs = (0..<inFlight).map { worker in
    let separator = url.query == nil ? "?" : "&"
    guard let workerURL = URL(string: url.absoluteString + separator + "worker=\(worker)") else {
        fatalError("cannot add a query to \(url)")
    }
    return workerURL
}

var configuration = AsyncHTTPClientSession.recommendedConfiguration
configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = inFlight
let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
let overAHC = AsyncRequestEngine(session: AsyncHTTPClientSession(client: client))
let urlSessionConfiguration = URLSessionConfiguration.ephemeral
urlSessionConfiguration.httpMaximumConnectionsPerHost = inFlight
let overURLSession = AsyncRequestEngine(session: URLSessionTransport(configuration: urlSessionConfiguration))

struct Get: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
    var timeout: TimeInterval = 30
}

// Profile only (`profile 3`): the engine without single flight and without a per-attempt timeout,
// to tell what those two cost from what every send costs.
let bareOverAHC = AsyncRequestEngine(session: AsyncHTTPClientSession(client: client), configuration: .init(deduplicatedMethods: []))
// Single flight off: each GET shares nothing. Like the default engine's, it runs in its caller's
// task, timed by AHC (`honorsTimeoutAndCancellation`); beside it, what single flight costs.
let ahcSession = AsyncHTTPClientSession(client: client)
let unsharedOverAHC = AsyncRequestEngine(session: AsyncHTTPClientSession(client: client), configuration: .init(deduplicatedMethods: []))

enum Variant: String, CaseIterable {
    case rawAHC = "raw AHC"
    case engineAHC = "engine over AHC"
    case engineURLSession = "engine over URLSession"
    case bareEngineAHC = "engine over AHC, no single flight, no timeout"
    case rawAHCResponse = "raw AHC + HTTPURLResponse"
    case unsharedEngineAHC = "engine/AHC, caller task"
    case sessionAHC = "AsyncHTTPClientSession"

    /// The variants every round runs; `bareEngineAHC` is for `profile 3` only.
    static let measured: [Variant] = [.rawAHC, .rawAHCResponse, .sessionAHC, .engineAHC, .unsharedEngineAHC, .engineURLSession]
}

@Sendable func once(_ variant: Variant, _ url: URL = url) async throws {
    switch variant {
    case .rawAHC:
        let response = try await client.execute(HTTPClientRequest(url: url.absoluteString), deadline: .now() + .seconds(30))
        let bytes = try await response.body.collect(upTo: 16 * 1024 * 1024)
        guard response.status == .ok, bytes.readableBytes == bodySize else { fatalError("bad response") }
    case .engineAHC:
        let (data, _) = try await overAHC.send(Get(url: url))
        guard data.count == bodySize else { fatalError("bad response") }
    case .engineURLSession:
        let (data, _) = try await overURLSession.send(Get(url: url))
        guard data.count == bodySize else { fatalError("bad response") }
    case .bareEngineAHC:
        let (data, _) = try await bareOverAHC.send(Get(url: url, timeout: .infinity))
        guard data.count == bodySize else { fatalError("bad response") }
    case .unsharedEngineAHC:
        let (data, _) = try await unsharedOverAHC.send(Get(url: url))
        guard data.count == bodySize else { fatalError("bad response") }
    case .sessionAHC:
        // The adapter alone, as a caller without the engine would use it: a URLRequest in, an
        // HTTPURLResponse out.
        let (data, response) = try await ahcSession.data(for: URLRequest(url: url, timeoutInterval: 30), maximumBodySize: nil)
        guard data.count == bodySize, (response as? HTTPURLResponse)?.statusCode == 200 else { fatalError("bad response") }
    case .rawAHCResponse:
        // What `send` hands back, built from raw AHC's answer as a caller of AHC who needs
        // Foundation's types would build it: the floor under the engine over AHC on Linux.
        let response = try await client.execute(HTTPClientRequest(url: url.absoluteString), deadline: .now() + .seconds(30))
        let bytes = try await response.body.collect(upTo: 16 * 1024 * 1024)
        var fields: [String: String] = [:]
        for (name, value) in response.headers { fields[name] = value }
        guard let http = HTTPURLResponse(url: url, statusCode: Int(response.status.code), httpVersion: "HTTP/1.1", headerFields: fields),
            http.statusCode == 200, bytes.withUnsafeReadableBytes({ Data($0) }).count == bodySize
        else { fatalError("bad response") }
    }
}

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// CPU seconds the whole machine has spent busy (every process, kernel included) since boot, from
/// /proc/stat; NaN where there is none. Per round, minus this process's own CPU, it tells how much
/// else ran meanwhile (the external server, other people's builds).
func machineBusySeconds() -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
        let line = stat.split(separator: "\n").first, line.hasPrefix("cpu ")
    else { return .nan }
    let ticks = line.split(separator: " ").dropFirst().compactMap { Double($0) }
    guard ticks.count >= 8 else { return .nan }
    // user nice system idle iowait irq softirq steal: everything but idle and iowait.
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7]
    return busy / Double(sysconf(Int32(_SC_CLK_TCK)))
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
}

struct Round {
    var p50: Double = 0  // µs
    var throughput: Double = 0  // requests/s
    var cpuPerRequest: Double = 0  // µs
    var others: Double = 0  // CPUs' worth of work by other processes meanwhile (0 to 2 on this machine)
}

/// Runs `body` and measures it: wall time, this process's CPU, and the rest of the machine's.
func measured(_ count: Int, _ body: () async throws -> [Double]) async rethrows -> Round {
    let cpu = cpuSeconds()
    let busy = machineBusySeconds()
    let start = ContinuousClock.now
    let latencies = try await body()
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    let own = cpuSeconds() - cpu
    return Round(
        p50: median(latencies),
        throughput: Double(count) / seconds,
        cpuPerRequest: own / Double(count) * 1e6,
        others: max(0, machineBusySeconds() - busy - own) / seconds
    )
}

/// `count` requests one after another; per-request latency.
func sequential(_ variant: Variant, _ count: Int) async throws -> Round {
    try await measured(count) {
        var latencies: [Double] = []
        latencies.reserveCapacity(count)
        for _ in 0..<count {
            let began = ContinuousClock.now
            try await once(variant)
            let took = ContinuousClock.now - began
            latencies.append(Double(took.components.attoseconds) / 1e12 + Double(took.components.seconds) * 1e6)
        }
        return latencies
    }
}

/// `count` requests by `inFlight` workers; per-request latency and throughput.
func concurrent(_ variant: Variant, _ count: Int) async throws -> Round {
    try await measured(count) {
        try await withThrowingTaskGroup(of: [Double].self) { group in
            for worker in 0..<inFlight {
                let share = count / inFlight + (worker < count % inFlight ? 1 : 0)
                group.addTask {
                    var mine: [Double] = []
                    mine.reserveCapacity(share)
                    let url = workerURLs[worker]
                    for _ in 0..<share {
                        let began = ContinuousClock.now
                        try await once(variant, url)
                        let took = ContinuousClock.now - began
                        mine.append(Double(took.components.attoseconds) / 1e12 + Double(took.components.seconds) * 1e6)
                    }
                    return mine
                }
            }
            return try await group.reduce(into: [Double]()) { $0 += $1 }
        }
    }
}

// `profile VARIANT COUNT [64]`: only COUNT requests of one variant, one after another or (with 64)
// by 64 workers — 0 raw AHC, 1 engine over AHC, 2 engine over URLSession, 3 engine over AHC without
// single flight or timeout, 4 raw AHC + HTTPURLResponse, 5 engine over AHC in the caller's task,
// 6 AsyncHTTPClientSession alone — for perf or strace.
if profiling {
    guard numbers.count >= 2, Variant.allCases.indices.contains(numbers[0]) else {
        fatalError("usage: integrations-benchmark [--url URL] profile VARIANT COUNT [64] (VARIANT 0 to 6)")
    }
    let variant = Variant.allCases[numbers[0]]
    let inParallel = numbers.count > 2 && numbers[2] == 64
    _ = try await (inParallel ? concurrent(variant, 640) : sequential(variant, 100))
    let round = try await (inParallel ? concurrent(variant, numbers[1]) : sequential(variant, numbers[1]))
    print("\(variant.rawValue)\(inParallel ? ", 64 in flight" : ""): p50 \(round.p50) µs, CPU \(round.cpuPerRequest) µs/request")
    try await client.shutdown().get()
    server?.shutdown()
    exit(0)
}

let loadAtStart = loadAverage()
// Warm-up: connections opened, code paged in.
for variant in Variant.measured {
    _ = try await sequential(variant, 200)
    _ = try await concurrent(variant, 640)
}

var sequentialRounds: [Variant: [Round]] = [:]
var concurrentRounds: [Variant: [Round]] = [:]
for round in 0..<rounds {
    // Rotate the order each round so that no variant always runs first or last.
    let order = Variant.measured.indices.map { Variant.measured[($0 + round) % Variant.measured.count] }
    for variant in order {
        sequentialRounds[variant, default: []].append(try await sequential(variant, sequentialPerRound))
    }
    for variant in order {
        concurrentRounds[variant, default: []].append(try await concurrent(variant, concurrentPerRound))
    }
}

/// The value below which `fraction` of `values` lie (nearest rank).
func quantile(_ values: [Double], _ fraction: Double) -> Double {
    let sorted = values.sorted()
    guard !sorted.isEmpty else { return .nan }
    return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * fraction).rounded()))]
}

/// "median (quartiles q1–q3; range min–max)" of per-round values.
func spread(_ values: [Double], _ format: String) -> String {
    String(
        format: "\(format) (quartiles \(format)–\(format); range \(format)–\(format))",
        median(values), quantile(values, 0.25), quantile(values, 0.75), values.min() ?? .nan, values.max() ?? .nan)
}

func summary(_ name: String, _ results: [Variant: [Round]]) {
    print("\n\(name): median of \(rounds) rounds (min–max)")
    print("variant                  p50 µs                    req/s                     CPU µs/req           other processes, CPUs")
    for variant in Variant.measured {
        let r = results[variant] ?? []
        func line(_ values: [Double], _ format: String = "%8.1f (%.1f–%.1f)") -> String {
            String(format: format, median(values), values.min() ?? .nan, values.max() ?? .nan)
        }
        print(
            variant.rawValue.padding(toLength: 24, withPad: " ", startingAt: 0), line(r.map(\.p50)), line(r.map(\.throughput)),
            line(r.map(\.cpuPerRequest)), line(r.map(\.others), "%5.2f (%.2f–%.2f)"))
    }
    // Ratios per round (same round, adjacent runs), then their median and spread.
    let engine = results[.engineAHC] ?? [], raw = results[.rawAHC] ?? [], urlSession = results[.engineURLSession] ?? []
    let p50Ratios = zip(engine, raw).map { $0.p50 / $1.p50 }
    let cpuRatios = zip(engine, raw).map { $0.cpuPerRequest / $1.cpuPerRequest }
    let rawThroughputRatios = zip(engine, raw).map { $0.throughput / $1.throughput }
    let throughputRatios = zip(engine, urlSession).map { $0.throughput / $1.throughput }
    print(
        "engine/raw AHC p50:", spread(p50Ratios, "%.3f"),
        String(format: "; ratio of medians %.3f", median(engine.map(\.p50)) / median(raw.map(\.p50))))
    print("engine/raw AHC CPU per request:", spread(cpuRatios, "%.3f"))
    print("engine/raw AHC throughput:", spread(rawThroughputRatios, "%.3f"))
    let floor = results[.rawAHCResponse] ?? [], unshared = results[.unsharedEngineAHC] ?? []
    print("engine/(raw AHC + HTTPURLResponse) p50:", spread(zip(engine, floor).map { $0.p50 / $1.p50 }, "%.3f"))
    print("engine/(raw AHC + HTTPURLResponse) CPU per request:", spread(zip(engine, floor).map { $0.cpuPerRequest / $1.cpuPerRequest }, "%.3f"))
    let adapter = results[.sessionAHC] ?? []
    print("AsyncHTTPClientSession/(raw AHC + HTTPURLResponse) p50:", spread(zip(adapter, floor).map { $0.p50 / $1.p50 }, "%.3f"))
    print(
        "AsyncHTTPClientSession/(raw AHC + HTTPURLResponse) CPU per request:",
        spread(zip(adapter, floor).map { $0.cpuPerRequest / $1.cpuPerRequest }, "%.3f"))
    print("engine in the caller's task/(raw AHC + HTTPURLResponse) p50:", spread(zip(unshared, floor).map { $0.p50 / $1.p50 }, "%.3f"))
    print(
        "engine in the caller's task/(raw AHC + HTTPURLResponse) CPU per request:",
        spread(zip(unshared, floor).map { $0.cpuPerRequest / $1.cpuPerRequest }, "%.3f"))
    print("engine over AHC / engine over URLSession throughput:", spread(throughputRatios, "%.2f"))
}

func loadAverage() -> String {
    (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").prefix(3).joined(separator: " ") ?? "?"
}

print(
    "integrations-benchmark: \(rounds) rounds; \(sequentialPerRound) sequential and \(concurrentPerRound) at \(inFlight) in flight per variant per round; \(ProcessInfo.processInfo.activeProcessorCount) CPUs"
)
print("server: \(externalURL.map { "external, \($0.absoluteString)" } ?? "LoopbackHTTPServer in this process (its CPU counts in CPU µs/req)")")
print("load average (1, 5, 15 min): \(loadAtStart) at the start, \(loadAverage()) at the end")
summary("Sequential", sequentialRounds)
summary("\(inFlight) in flight", concurrentRounds)
try await client.shutdown().get()
server?.shutdown()
