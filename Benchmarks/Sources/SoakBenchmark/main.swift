import AsyncHTTPClient
import Foundation
import RequestEngine
import ResilienceAsyncHTTPClient
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

// Memory over a long run (issue 30): one transport per process, N requests by K workers against
// a server such as the nginx of Integrations/Benchmark/nginx.sh, the process's resident set
// sampled as it goes. The growth per request is the slope of a least-squares line through the
// samples after the first 10 % (warm-up: connections, pools, caches), so a one-off step does not
// count and a steady leak does. See Benchmarks/README.md, "Memory over a long run".
//
//   soak-benchmark TRANSPORT [--url URL] [--requests N] [--in-flight K]
//
// TRANSPORT:
//   engine-instant   AsyncRequestEngine over a session that answers at once (no network): the
//                    engine's own memory per request
//   engine-ahc       AsyncRequestEngine over AsyncHTTPClientSession
//   engine-urlsession AsyncRequestEngine over URLSessionTransport (the default transport), in a
//                    process that asks for URLSessionTransport.installFoundationLeakRepair()
//   engine-urlsession-unrepaired  the same without asking
//   urlsession       URLSession.shared's data(for:) alone, without the engine

let usage = "usage: soak-benchmark engine-instant|engine-ahc|engine-urlsession|engine-urlsession-unrepaired|urlsession [--url URL] [--requests N] [--in-flight K]"
var arguments = Array(CommandLine.arguments.dropFirst())
guard let transport = arguments.first else { fatalError(usage) }
arguments.removeFirst()
var url = URL(string: "http://127.0.0.1:8089/bench")!
var total = 1_000_000
var inFlight = 16
while !arguments.isEmpty {
    let flag = arguments.removeFirst()
    guard let value = arguments.first else { fatalError(usage) }
    arguments.removeFirst()
    switch flag {
    case "--url": url = URL(string: value) ?? url
    case "--requests": total = Int(value) ?? total
    case "--in-flight": inFlight = Int(value) ?? inFlight
    default: fatalError(usage)
    }
}

/// The resident set, in bytes (/proc/self/statm's second field, in pages).
func residentBytes() -> Int {
    guard let statm = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = statm.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// A /proc file read to its end (its size says 0, so Foundation's readers stop early).
func readWhole(_ path: String) -> String? {
    let descriptor = open(path, O_RDONLY)
    guard descriptor >= 0 else { return nil }
    defer { close(descriptor) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        if count <= 0 { break }
        bytes += chunk[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// An ephemeral configuration with no cache, cookie store or credential store.
func bareConfiguration(connections: Int) -> URLSessionConfiguration {
    let configuration = URLSessionConfiguration.ephemeral
    configuration.urlCache = nil
    configuration.httpCookieStorage = nil
    configuration.urlCredentialStorage = nil
    configuration.httpShouldSetCookies = false
    configuration.httpMaximumConnectionsPerHost = connections
    return configuration
}

/// Answers every call at once with a 200-byte body.
struct InstantSession: NetworkSession {
    let body = Data(repeating: 0x78, count: 200)
    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        (body, HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: ["Content-Length": "200"])!)
    }
}

struct Get: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

// One URL per worker: identical concurrent GETs would be deduplicated into one call.
let workerURLs = (0..<inFlight).map { URL(string: url.absoluteString + (url.query == nil ? "?" : "&") + "worker=\($0)")! }

let send: @Sendable (URL) async throws -> Int
switch transport {
case "engine-instant":
    let engine = AsyncRequestEngine(session: InstantSession())
    send = { try await engine.send(Get(url: $0)).0.count }
case "engine-ahc":
    var configuration = AsyncHTTPClientSession.recommendedConfiguration
    configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = inFlight
    let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    let engine = AsyncRequestEngine(session: AsyncHTTPClientSession(client: client))
    send = { try await engine.send(Get(url: $0)).0.count }
case "engine-urlsession", "engine-urlsession-unrepaired":
    if transport == "engine-urlsession" { URLSessionTransport.installFoundationLeakRepair() }
    let configuration = URLSessionConfiguration.ephemeral
    configuration.httpMaximumConnectionsPerHost = inFlight
    let engine = AsyncRequestEngine(session: URLSessionTransport(configuration: configuration))
    send = { try await engine.send(Get(url: $0)).0.count }
case "urlsession":
    send = { try await URLSession.shared.data(for: URLRequest(url: $0)).0.count }
case "urlsession-foundation-async":
    // Foundation's own async `data(for:delegate:)`, on a session with every store off.
    let session = URLSession(configuration: bareConfiguration(connections: inFlight))
    send = { try await session.data(for: URLRequest(url: $0), delegate: nil).0.count }
case "urlsession-completion":
    // The plainest use: a completion-handler data task, on a session with every store off.
    let session = URLSession(configuration: bareConfiguration(connections: inFlight))
    send = { url in
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int, any Error>) in
            session.dataTask(with: URLRequest(url: url)) { data, _, error in
                if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: data?.count ?? 0) }
            }.resume()
        }
    }
default:
    fatalError(usage)
}

let samplesWanted = 40
let sampleEvery = max(1, total / samplesWanted)
/// The resident set after `requests` requests.
struct Sample: Sendable {
    let requests: Int
    let bytes: Int
}

let done = Atomic<Int>(0)
let samples = Mutex<[Sample]>([])
let start = ContinuousClock.now
samples.withLock { $0.append(Sample(requests: 0, bytes: residentBytes())) }
try await withThrowingTaskGroup(of: Void.self) { group in
    for worker in 0..<inFlight {
        let share = total / inFlight + (worker < total % inFlight ? 1 : 0)
        let target = workerURLs[worker]
        group.addTask {
            for _ in 0..<share {
                guard try await send(target) == 200 else { fatalError("bad response from \(target)") }
                let count = done.add(1, ordering: .relaxed).newValue
                if count % sampleEvery == 0 {
                    let bytes = residentBytes()
                    samples.withLock { $0.append(Sample(requests: count, bytes: bytes)) }
                }
            }
        }
    }
    try await group.waitForAll()
}
let elapsed = ContinuousClock.now - start
let points = samples.withLock { $0 }.sorted { $0.requests < $1.requests }
// Least squares over the samples past the first 10 %.
let steady = points.filter { $0.requests >= total / 10 }
let n = Double(steady.count)
let meanX = steady.map { Double($0.requests) }.reduce(0, +) / n
let meanY = steady.map { Double($0.bytes) }.reduce(0, +) / n
let slope =
    steady.map { (Double($0.requests) - meanX) * (Double($0.bytes) - meanY) }.reduce(0, +)
    / steady.map { (Double($0.requests) - meanX) * (Double($0.requests) - meanX) }.reduce(0, +)
func mb(_ bytes: Int) -> String { String(format: "%.1f MB", Double(bytes) / 1_048_576) }
print(
    "soak-benchmark \(transport): \(total) requests, \(inFlight) in flight, \(url.absoluteString), \(String(format: "%.0f", Double(total) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))) req/s"
)
print("RSS: \(mb(points.first?.bytes ?? 0)) at the start, \(mb(steady.first?.bytes ?? 0)) after 10 %, \(mb(points.last?.bytes ?? 0)) at the end; peak \(mb(points.map(\.bytes).max() ?? 0))")
print(String(format: "growth after the first 10 %%: %.1f bytes per request (least squares over %d samples)", slope, steady.count))
print("samples (requests, RSS MB): " + points.map { "\($0.requests) \(String(format: "%.1f", Double($0.bytes) / 1_048_576))" }.joined(separator: ", "))

if let status = readWhole("/proc/self/status"), let threads = status.split(separator: "\n").first(where: { $0.hasPrefix("Threads:") }) {
    print("threads at the end: \(threads.split(separator: "\t").last ?? "")")
}

// glibc's own view, to tell memory still in use from freed memory the allocator keeps: its
// per-arena totals (`malloc_stats`, on standard error), then the resident set after
// `malloc_trim(0)` hands free pages back. Looked up at run time: Swift's Glibc module does not
// declare them.
if let glibc = dlopen(nil, RTLD_NOW) {
    if let stats = dlsym(glibc, "malloc_stats") {
        unsafeBitCast(stats, to: (@convention(c) () -> Void).self)()
    }
    if let trim = dlsym(glibc, "malloc_trim") {
        _ = unsafeBitCast(trim, to: (@convention(c) (Int) -> Int32).self)(0)
        print("RSS after malloc_trim(0): \(mb(residentBytes()))")
    }
}

// Where the resident set is: the ten largest mappings by resident size (/proc/self/smaps).
if let smaps = readWhole("/proc/self/smaps") {
    var mappings: [(name: String, kilobytes: Int)] = []
    var current = ""
    for line in smaps.split(separator: "\n") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        if let first = fields.first, first.contains("-"), !first.hasSuffix(":") {
            current = String(line)
        } else if fields.first == "Rss:", fields.count > 1, let kilobytes = Int(fields[1]) {
            mappings.append((current, kilobytes))
        }
    }
    var byFile: [String: Int] = [:]
    for mapping in mappings {
        let parts = mapping.name.split(separator: " ", omittingEmptySubsequences: true)
        byFile[parts.count >= 6 ? String(parts[5]) : "(anonymous)", default: 0] += mapping.kilobytes
    }
    print("resident by file: " + byFile.sorted { $0.value > $1.value }.prefix(8).map { "\($0.key.split(separator: "/").last ?? "") \($0.value / 1024) MB" }.joined(separator: ", "))
    let anonymous = mappings.filter { $0.name.split(separator: " ").count < 6 }.map(\.kilobytes).reduce(0, +)
    print("resident in anonymous mappings: \(anonymous / 1024) MB in \(mappings.filter { $0.name.split(separator: " ").count < 6 }.count) mappings; largest mappings:")
    for mapping in mappings.sorted(by: { $0.kilobytes > $1.kilobytes }).prefix(10) {
        print("  \(mapping.kilobytes) kB  \(mapping.name)")
    }
}
