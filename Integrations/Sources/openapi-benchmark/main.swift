import AsyncHTTPClient
import Foundation
import NotesAPI
import NotesOrigin
import OpenAPIAsyncHTTPClient
import OpenAPIRuntime
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceOpenAPI

#if canImport(Glibc)
import Glibc
#endif

// The generated notes client over ResilienceTransport (an AsyncRequestEngine with its defaults over
// AsyncHTTPClientSession) against the same client over swift-openapi-async-http-client's
// AsyncHTTPClientTransport, both on one AHC HTTPClient, calling `getNote` (a GET answered with a
// small JSON note) — one after another, and by 64 workers at once (each its own note, so the
// engine's single flight shares nothing). Rounds alternate the variants; each reports this
// process's CPU per operation (getrusage), the origin running in a child process (this executable,
// `serve`), so its CPU is not counted. See Benchmarks/README.md.
//
//   openapi-benchmark [rounds] [sequential-per-round] [concurrent-per-round]
//   openapi-benchmark profile ahc|resilience COUNT   (COUNT operations at 64 in flight, for perf)
//   openapi-benchmark serve          (the origin: prints its URL, serves until stdin closes)

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "serve" {
    let server = try await NotesServer.start()
    FileHandle.standardOutput.write(Data((server.baseURL.absoluteString + "\n").utf8))
    _ = FileHandle.standardInput.readDataToEndOfFile()
    await server.stop()
    exit(0)
}
let profiled: String? = arguments.first == "profile" && arguments.count > 1 ? arguments[1] : nil
let numbers = arguments.compactMap { Int($0) }
let rounds = numbers.count > 0 ? numbers[0] : 20
let sequentialPerRound = numbers.count > 1 ? numbers[1] : 1_000
let concurrentPerRound = numbers.count > 2 ? numbers[2] : 6_400
let inFlight = 64

// The origin, in a process of its own.
let origin = Process()
origin.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
origin.arguments = ["serve"]
let originInput = Pipe()
let originOutput = Pipe()
origin.standardInput = originInput
origin.standardOutput = originOutput
try origin.run()
var line = Data()
while let byte = try originOutput.fileHandleForReading.read(upToCount: 1), let first = byte.first, first != UInt8(ascii: "\n") {
    line.append(first)
}
guard let serverURL = URL(string: String(decoding: line, as: UTF8.self)) else { fatalError("the origin did not start") }

var configuration = AsyncHTTPClientSession.recommendedConfiguration
configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = inFlight
let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)

enum Variant: String, CaseIterable {
    case ahcTransport = "AsyncHTTPClientTransport"
    case resilience = "ResilienceTransport (engine over AHC)"
}

let clients: [Variant: Client] = [
    .ahcTransport: Client(serverURL: serverURL, transport: AsyncHTTPClientTransport(configuration: .init(client: http, timeout: .seconds(30)))),
    .resilience: Client(
        serverURL: serverURL, transport: ResilienceTransport(sender: AsyncRequestEngine(session: AsyncHTTPClientSession(client: http)))),
]

// One note per worker.
let setup = clients[.ahcTransport]!
for worker in 0..<inFlight {
    _ = try await setup.createNote(body: .json(.init(text: "note \(worker) " + String(repeating: "x", count: 100))))
}

@Sendable func once(_ client: Client, _ note: String) async throws {
    guard case .ok(let ok) = try await client.getNote(path: .init(noteID: note)), case .json(let body) = ok.body, body.id == note else {
        fatalError("bad response")
    }
}

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// CPU µs per operation and operations a second.
func measure(_ count: Int, _ body: () async throws -> Void) async rethrows -> (cpu: Double, rate: Double) {
    let cpu = cpuSeconds()
    let start = ContinuousClock.now
    try await body()
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    return ((cpuSeconds() - cpu) / Double(count) * 1e6, Double(count) / seconds)
}

func sequential(_ client: Client, _ count: Int) async throws -> (cpu: Double, rate: Double) {
    try await measure(count) {
        for _ in 0..<count { try await once(client, "n1") }
    }
}

func concurrent(_ client: Client, _ count: Int) async throws -> (cpu: Double, rate: Double) {
    try await measure(count) {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<inFlight {
                let share = count / inFlight + (worker < count % inFlight ? 1 : 0)
                group.addTask { for _ in 0..<share { try await once(client, "n\(worker + 1)") } }
            }
            try await group.waitForAll()
        }
    }
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
}

// Warm-up: connections, caches.
for variant in Variant.allCases {
    _ = try await concurrent(clients[variant]!, 640)
    _ = try await sequential(clients[variant]!, 100)
}

if let profiled {
    let variant: Variant = profiled == "ahc" ? .ahcTransport : .resilience
    let count = numbers.first ?? 64_000
    let result = try await concurrent(clients[variant]!, count)
    print("\(variant.rawValue): \(count) at 64 in flight, \(Int(result.cpu)) µs CPU/op, \(Int(result.rate))/s")
    try originInput.fileHandleForWriting.close()
    origin.waitUntilExit()
    exit(0)
}

var results: [String: [(cpu: Double, rate: Double)]] = [:]
print("openapi-benchmark: \(rounds) rounds of \(sequentialPerRound) sequential and \(concurrentPerRound) at \(inFlight) in flight, getNote")
for round in 0..<rounds {
    // Alternate which variant goes first.
    let order = round % 2 == 0 ? Variant.allCases : Variant.allCases.reversed()
    for variant in order {
        let client = clients[variant]!
        let one = try await sequential(client, sequentialPerRound)
        let many = try await concurrent(client, concurrentPerRound)
        results["\(variant.rawValue) sequential", default: []].append(one)
        results["\(variant.rawValue) 64", default: []].append(many)
        print(
            "round \(round + 1): \(variant.rawValue): sequential \(Int(one.cpu)) µs CPU/op (\(Int(one.rate))/s), 64 in flight \(Int(many.cpu)) µs CPU/op (\(Int(many.rate))/s)"
        )
    }
}

print("")
print("| Transport | sequential: CPU µs/op, median (range) | ops/s | 64 in flight: CPU µs/op, median (range) | ops/s |")
print("| --- | --- | --- | --- | --- |")
for variant in Variant.allCases {
    let one = results["\(variant.rawValue) sequential"] ?? []
    let many = results["\(variant.rawValue) 64"] ?? []
    func cell(_ values: [Double]) -> String {
        "\(Int(median(values))) (\(Int(values.min() ?? .nan))–\(Int(values.max() ?? .nan)))"
    }
    print(
        "| \(variant.rawValue) | \(cell(one.map(\.cpu))) | \(Int(median(one.map(\.rate)))) | \(cell(many.map(\.cpu))) | \(Int(median(many.map(\.rate)))) |"
    )
}
// Ratios per round (ResilienceTransport ÷ AsyncHTTPClientTransport), each round's pair measured back to back.
for kind in ["sequential", "64"] {
    let ours = results["\(Variant.resilience.rawValue) \(kind)"] ?? []
    let theirs = results["\(Variant.ahcTransport.rawValue) \(kind)"] ?? []
    let ratios = zip(ours, theirs).map { $0.cpu / $1.cpu }
    print("CPU ratio \(kind): median \(String(format: "%.3f", median(ratios))) (rounds \(ratios.map { String(format: "%.2f", $0) }.joined(separator: ", ")))")
}
try originInput.fileHandleForWriting.close()
origin.waitUntilExit()
try await http.shutdown().get()
