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
// (URLSessionTransport), in one process, on LoopbackHTTPServer (200-byte body), in interleaved
// rounds so that the machine's drift hits every variant alike. See Benchmarks/README.md.
//
//   swift run -c release --package-path Integrations integrations-benchmark [rounds] [sequential-per-round] [concurrent-per-round]

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }  // ignored with `profile`
let rounds = arguments.count > 0 ? arguments[0] : 20
let sequentialPerRound = arguments.count > 1 ? arguments[1] : 500
let concurrentPerRound = arguments.count > 2 ? arguments[2] : 6400
let inFlight = 64

let server = try LoopbackHTTPServer()
let body = String(repeating: "x", count: 200)
server.route("/bench", .ok(body))
let url = server.url("/bench")
// One URL per concurrent worker: identical concurrent GETs would be deduplicated by the engine
// (one network call for many callers), which is not what is measured here.
let workerURLs = (0..<inFlight).map { server.url("/bench?worker=\($0)") }

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
}

enum Variant: String, CaseIterable {
    case rawAHC = "raw AHC"
    case engineAHC = "engine over AHC"
    case engineURLSession = "engine over URLSession"
}

@Sendable func once(_ variant: Variant, _ url: URL = url) async throws {
    switch variant {
    case .rawAHC:
        let response = try await client.execute(HTTPClientRequest(url: url.absoluteString), deadline: .now() + .seconds(30))
        let bytes = try await response.body.collect(upTo: 16 * 1024 * 1024)
        guard response.status == .ok, bytes.readableBytes == 200 else { fatalError("bad response") }
    case .engineAHC:
        let (data, _) = try await overAHC.send(Get(url: url))
        guard data.count == 200 else { fatalError("bad response") }
    case .engineURLSession:
        let (data, _) = try await overURLSession.send(Get(url: url))
        guard data.count == 200 else { fatalError("bad response") }
    }
}

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
}

struct Round {
    var p50: Double = 0         // µs
    var throughput: Double = 0  // requests/s
    var cpuPerRequest: Double = 0  // µs
}

/// `count` requests one after another; per-request latency.
func sequential(_ variant: Variant, _ count: Int) async throws -> Round {
    var latencies: [Double] = []
    latencies.reserveCapacity(count)
    let cpu = cpuSeconds()
    let start = ContinuousClock.now
    for _ in 0..<count {
        let began = ContinuousClock.now
        try await once(variant)
        let took = ContinuousClock.now - began
        latencies.append(Double(took.components.attoseconds) / 1e12 + Double(took.components.seconds) * 1e6)
    }
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    return Round(p50: median(latencies), throughput: Double(count) / seconds, cpuPerRequest: (cpuSeconds() - cpu) / Double(count) * 1e6)
}

/// `count` requests by `inFlight` workers; per-request latency and throughput.
func concurrent(_ variant: Variant, _ count: Int) async throws -> Round {
    let cpu = cpuSeconds()
    let start = ContinuousClock.now
    let latencies = try await withThrowingTaskGroup(of: [Double].self) { group in
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
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    return Round(p50: median(latencies), throughput: Double(count) / seconds, cpuPerRequest: (cpuSeconds() - cpu) / Double(count) * 1e6)
}

// `profile VARIANT COUNT`: only COUNT sequential requests of one variant (0 raw AHC, 1 engine over
// AHC, 2 engine over URLSession), for callgrind or perf.
if CommandLine.arguments.count > 3, CommandLine.arguments[1] == "profile",
   let index = Int(CommandLine.arguments[2]), let count = Int(CommandLine.arguments[3]) {
    let variant = Variant.allCases[index]
    _ = try await sequential(variant, 100)
    let round = try await sequential(variant, count)
    print("\(variant.rawValue): p50 \(round.p50) µs, CPU \(round.cpuPerRequest) µs/request")
    try await client.shutdown().get()
    server.shutdown()
    exit(0)
}

// Warm-up: connections opened, code paged in.
for variant in Variant.allCases {
    _ = try await sequential(variant, 200)
    _ = try await concurrent(variant, 640)
}

var sequentialRounds: [Variant: [Round]] = [:]
var concurrentRounds: [Variant: [Round]] = [:]
for round in 0..<rounds {
    // Rotate the order each round so that no variant always runs first or last.
    let order = (0..<Variant.allCases.count).map { Variant.allCases[($0 + round) % Variant.allCases.count] }
    for variant in order {
        sequentialRounds[variant, default: []].append(try await sequential(variant, sequentialPerRound))
    }
    for variant in order {
        concurrentRounds[variant, default: []].append(try await concurrent(variant, concurrentPerRound))
    }
}

func summary(_ name: String, _ results: [Variant: [Round]]) {
    print("\n\(name): median of \(rounds) rounds (min–max)")
    print("variant                  p50 µs             req/s                  CPU µs/req")
    for variant in Variant.allCases {
        let r = results[variant] ?? []
        func line(_ values: [Double]) -> String {
            String(format: "%8.1f (%.1f–%.1f)", median(values), values.min() ?? .nan, values.max() ?? .nan)
        }
        print(variant.rawValue.padding(toLength: 24, withPad: " ", startingAt: 0), line(r.map(\.p50)), line(r.map(\.throughput)), line(r.map(\.cpuPerRequest)))
    }
    // Ratios per round (same round, adjacent runs), then their median and spread.
    let engine = results[.engineAHC] ?? [], raw = results[.rawAHC] ?? [], urlSession = results[.engineURLSession] ?? []
    let p50Ratios = zip(engine, raw).map { $0.p50 / $1.p50 }
    let cpuRatios = zip(engine, raw).map { $0.cpuPerRequest / $1.cpuPerRequest }
    let throughputRatios = zip(engine, urlSession).map { $0.throughput / $1.throughput }
    print(String(format: "engine/raw AHC p50: %.3f× (rounds %.3f–%.3f); ratio of medians %.3f×",
                 median(p50Ratios), p50Ratios.min() ?? .nan, p50Ratios.max() ?? .nan, median(engine.map(\.p50)) / median(raw.map(\.p50))))
    print(String(format: "engine/raw AHC CPU per request: %.3f× (rounds %.3f–%.3f)", median(cpuRatios), cpuRatios.min() ?? .nan, cpuRatios.max() ?? .nan))
    print(String(format: "engine over AHC / engine over URLSession throughput: %.2f× (rounds %.2f–%.2f)",
                 median(throughputRatios), throughputRatios.min() ?? .nan, throughputRatios.max() ?? .nan))
}

print("integrations-benchmark: \(rounds) rounds; \(sequentialPerRound) sequential and \(concurrentPerRound) at \(inFlight) in flight per variant per round; \(ProcessInfo.processInfo.activeProcessorCount) CPUs")
summary("Sequential", sequentialRounds)
summary("\(inFlight) in flight", concurrentRounds)
try await client.shutdown().get()
server.shutdown()
