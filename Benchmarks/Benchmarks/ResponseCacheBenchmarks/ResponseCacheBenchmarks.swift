import Benchmark
import Foundation
import Reachability
import RequestEngine
import ResilienceTesting
import ResponseCache
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

// What the response cache buys and costs, each against a baseline measured in the same run:
// 1. a fresh hit against the same read as a loopback round trip through the engine (interleaved)
//    — target: the hit's p50 at least 20x faster;
// 2. opening a folder of 10 000 and of 100 000 stored responses — target: under 1 s, memory linear;
// 3. 1 000 concurrent readers of one stale key through URLSession to LoopbackHTTPServer — target:
//    exactly one upstream revalidation;
// 4. 10 000 stores of random sizes — target: the folder never above maxBytes;
// 5. markStale(where:) over a cache of 5 000 stored responses, opened cold from its folder (as
//    after a relaunch), when 10 match and when all 5 000 match — target: under 2 ms and under
//    100 ms (issue 49); the rule evaluated alone over the same 5 000 (method, URL) pairs is the
//    same run's floor.
// Each prints its figures in its teardown; see ../../README.md.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .peakMemoryResident],
        timeUnits: .milliseconds,
        warmupIterations: 1,
        maxDuration: .seconds(20),
        maxIterations: 10
    )

    // MARK: 1. Fresh hit vs loopback round trip, interleaved

    let hitReport = LatencyReport()
    Benchmark("cache: fresh hit vs loopback round trip through the engine, interleaved") { benchmark in
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        let body = String(repeating: "x", count: 1_024)
        server.route("/feed", .status(200, headers: ["Cache-Control": "max-age=3600"], body: body))
        let folder = Folder()
        defer { folder.remove() }
        let network = AsyncRequestEngine()
        let cached = CachedRequestEngine(
            requestEngine: network,
            cache: try DiskResponseCache(directory: folder.url, maxBytes: 64 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true)
        )
        let feed = Read(url: server.url("/feed"))
        _ = try await cached.response(for: feed, mode: .online, staleTime: .seconds(3600))  // stored
        var hits: [Duration] = []
        var trips: [Duration] = []
        for block in 0..<20 {  // hits and round trips alternate in blocks of 25, either first
            for isHit in block % 2 == 0 ? [true, false] : [false, true] {
                for _ in 0..<25 {
                    let start = ContinuousClock.now
                    if isHit {
                        let answer = try await cached.response(for: feed, mode: .online, staleTime: .seconds(3600))
                        precondition(answer.source == .cache)
                        hits.append(ContinuousClock.now - start)
                    } else {
                        _ = try await network.send(feed)
                        trips.append(ContinuousClock.now - start)
                    }
                }
            }
        }
        hitReport.add(hits: hits, trips: trips)
        benchmark.measurement(.custom("round trip p50 / hit p50 (x)", useScalingFactor: false), Int(percentile(trips, 0.5) / percentile(hits, 0.5)))
    } teardown: {
        hitReport.print()
    }

    // MARK: 2. Open a folder of N stored responses

    // The folder is written in the same process first, so the process's peak RSS includes that;
    // what the open itself holds is measured as the resident memory it adds (after the writer's
    // freed memory went back to the system), with the cache still open.
    for count in [10_000, 100_000] {
        let prepared = PreparedCache(entries: count)
        let added = Mutex<[Int]>([])
        Benchmark(
            "cache: open \(count) entries",
            configuration: .init(metrics: [.wallClock, .peakMemoryResident], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(30), maxIterations: 10)
        ) { benchmark in
            let url = try await prepared.url()
            _ = returnFreedMemory(0)
            let before = residentBytes()
            benchmark.startMeasurement()
            let cache = try DiskResponseCache(directory: url, maxBytes: 1 << 30)
            benchmark.stopMeasurement()
            let grown = residentBytes() - before
            precondition(cache.count == count, "open found \(cache.count)")
            added.withLock { $0.append(grown) }
            benchmark.measurement(.custom("resident memory added by the open (KiB)", useScalingFactor: false), grown >> 10)
            blackHole(cache)
        } teardown: {
            let sorted = added.withLock { $0 }.sorted()
            if !sorted.isEmpty {
                print("open \(count) entries: resident memory added by the open, median \(sorted[sorted.count / 2] >> 10) KiB (\(sorted[sorted.count / 2] / count) bytes per entry)")
            }
            prepared.remove()
        }
    }

    // MARK: 3. 1 000 concurrent readers of one stale key

    let sharing = Mutex<[Int]>([])
    Benchmark(
        "cache: 1 000 concurrent readers of one stale key (upstream revalidations)",
        configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(30), maxIterations: 10)
    ) { benchmark in
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/feed",
            handler: { request in
                request.header("if-none-match") == "\"v1\""
                    ? LoopbackResponse.status(304, headers: ["ETag": "\"v1\""]).delayed(by: .milliseconds(50))
                    : .status(200, headers: ["ETag": "\"v1\""], body: "the feed")
            })
        let folder = Folder()
        defer { folder.remove() }
        let engine = CachedRequestEngine(
            cache: try DiskResponseCache(directory: folder.url, maxBytes: 64 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true)
        )
        let feed = Read(url: server.url("/feed"))
        _ = try await engine.response(for: feed, mode: .online, staleTime: .zero)  // stored, stale at once
        let before = server.hits("/feed")
        benchmark.startMeasurement()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<1_000 {
                group.addTask {
                    let answer = try await engine.response(for: feed, mode: .online, staleTime: .zero)
                    precondition(answer.source == .cache && String(decoding: answer.data, as: UTF8.self) == "the feed")
                }
            }
            try await group.waitForAll()
        }
        benchmark.stopMeasurement()
        let revalidations = server.hits("/feed") - before
        sharing.withLock { $0.append(revalidations) }
        benchmark.measurement(.custom("upstream revalidations", useScalingFactor: false), revalidations)
    } teardown: {
        let counts = sharing.withLock { $0 }
        print("1 000 concurrent readers of one stale key: upstream revalidations per iteration \(counts)")
    }

    // MARK: 4. 10 000 stores of random sizes never exceed maxBytes

    let bound = Mutex<[(largest: Int, maxBytes: Int)]>([])
    Benchmark(
        "cache: 10 000 stores of random sizes (folder never above maxBytes)",
        configuration: .init(metrics: [.wallClock, .peakMemoryResident], timeUnits: .milliseconds, warmupIterations: 0, maxDuration: .seconds(60), maxIterations: 3)
    ) { benchmark in
        let folder = Folder()
        defer { folder.remove() }
        let maxBytes = 8 << 20
        let cache = try DiskResponseCache(directory: folder.url, maxBytes: maxBytes, memoryBytes: 0)
        let stores = CacheStores(cache)
        var generator = SystemRandomNumberGenerator()
        var largest = 0
        for index in 0..<10_000 {
            try await stores.store(index: index % 2_000, size: Int.random(in: 0..<(64 << 10), using: &generator))
            if index % 250 == 249 {
                await cache.waitForWrites()
                let onDisk = folderBytes(folder.url)
                precondition(onDisk <= maxBytes && onDisk == cache.totalBytes, "\(onDisk) bytes on disk, \(cache.totalBytes) counted")
                largest = max(largest, onDisk)
            }
        }
        bound.withLock { $0.append((largest, maxBytes)) }
        benchmark.measurement(.custom("largest folder seen (KiB)", useScalingFactor: false), largest >> 10)
    } teardown: {
        for run in bound.withLock({ $0 }) {
            print("10 000 random stores: largest folder seen \(run.largest) bytes, maxBytes \(run.maxBytes)")
        }
    }
    // MARK: 5. markStale(where:) over 5 000 stored responses

    // Two caches of 5 000: 5 000 distinct paths (`/items/N`: the rule runs 5 000 times), and the
    // issue's list endpoint (4 990 query variants of `/list?page=N`, which share one stored URL,
    // and 10 `/items/N`). Rules on `url.path`, as apps write them; the floor is the same rules run
    // alone over the same distinct URLs, parsed beforehand.
    // Each also by `CacheURLPattern` (`markStale(matching:)`): the same matches found from the
    // cache's index of stored paths, with no rule run per stored URL.
    for workload in StaleWorkload.allCases {
        for byPattern in [false, true] {
            let staleReport = StaleReport(label: workload.label + (byPattern ? ", by CacheURLPattern" : ""))
            Benchmark(
                "cache: markStale over 5 000 stored responses, \(workload.label)\(byPattern ? ", by CacheURLPattern" : "") (10 match, all match)",
                configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(300), maxIterations: 10)
            ) { benchmark in
                // A fresh folder each iteration: a marking changes what the next one would find.
                let prepared = PreparedCache(paths: workload.paths)
                defer { prepared.remove() }
                let url = try await prepared.url()
                let cache = try DiskResponseCache(directory: url, maxBytes: 1 << 30)
                if byPattern { cache.prepareMarkingByPattern() }  // as OfflineFirstClient does for patterns
                let tenRule = workload.tenRule, allRule = workload.allRule
                let markTen = { byPattern ? cache.markStale(matching: workload.tenPatterns) : cache.markStale(where: tenRule) }
                let markAll = { byPattern ? cache.markStale(matching: workload.allPatterns) : cache.markStale(where: allRule) }
                let distinct = Set(workload.paths.map { HTTPCachePolicyURL.stored($0) }).map { URL(string: $0)! }
                let floorStart = ContinuousClock.now
                let floorTen = distinct.filter { tenRule(.get, $0) }.count
                let floorAll = distinct.filter { allRule(.get, $0) }.count
                let floor = ContinuousClock.now - floorStart
                precondition(floorTen == 10 && floorAll == distinct.count)
                // The first write delivered after a relaunch comes a moment after the cache opened
                // (a request's round trip at least): background work begun at the open has had 200 ms.
                try await Task.sleep(for: .milliseconds(200))
                benchmark.startMeasurement()
                let tenStart = ContinuousClock.now
                let ten = markTen()
                let tenTime = ContinuousClock.now - tenStart
                // Again, warm (what a delivered write's invalidation costs once the cache has marked
                // anything since it opened: the URL table built, the marks file there).
                let warmStart = ContinuousClock.now
                let warm = markTen()
                let warmTime = ContinuousClock.now - warmStart
                let allStart = ContinuousClock.now
                let all = markAll()
                let allTime = ContinuousClock.now - allStart
                benchmark.stopMeasurement()
                precondition(ten == 10 && warm == 10 && all == 5_000, "marked \(ten), \(warm) and \(all)")
                await cache.waitForWrites()
                await cache.close()
                // The marks survive a relaunch: a response reopened is stale.
                let reopened = try DiskResponseCache(directory: url, maxBytes: 1 << 30)
                let engine = CachedRequestEngine(
                    requestEngine: AsyncRequestEngine(session: SizedBodySession()), cache: reopened,
                    reachabilityMonitor: ManualReachabilityMonitor(isConnected: false))
                let sampleURL = URL(string: "https://example.test" + workload.paths[4_990])!
                let sample = try await engine.response(for: SizedRead(url: sampleURL, size: 200), mode: .offlineFirst, staleTime: .seconds(3600))
                precondition(sample.isStale, "a marked response read back fresh after the relaunch")
                await reopened.close()
                staleReport.add(ten: tenTime, warm: warmTime, all: allTime, floor: floor)
                benchmark.measurement(.custom("markStale, 10 of 5 000 match (µs)", useScalingFactor: false), Int(tenTime.microseconds))
                benchmark.measurement(.custom("markStale, all 5 000 match (µs)", useScalingFactor: false), Int(allTime.microseconds))
            } teardown: {
                staleReport.print()
            }
        }
    }
}

enum StaleWorkload: CaseIterable {
    case distinctPaths
    case listVariants

    var label: String {
        switch self {
        case .distinctPaths: "5 000 distinct paths"
        case .listVariants: "4 990 query variants of one list + 10 paths"
        }
    }

    /// The paths (with query) stored, 5 000.
    var paths: [String] {
        switch self {
        case .distinctPaths: (0..<5_000).map { "/items/\($0)" }
        case .listVariants: (0..<4_990).map { "/list?page=\($0)" } + (0..<10).map { "/items/\($0)" }
        }
    }

    var tenRule: @Sendable (HTTPMethod, URL) -> Bool {
        switch self {
        case .distinctPaths:
            let targets = Set((0..<10).map { "/items/\($0 * 499)" })
            return { method, url in method == .get && targets.contains(url.path) }
        case .listVariants:
            return { method, url in method == .get && url.path.hasPrefix("/items/") }
        }
    }

    /// `tenRule` as patterns the cache answers from its index.
    var tenPatterns: [CacheURLPattern] {
        switch self {
        case .distinctPaths: (0..<10).map { .path("/items/\($0 * 499)") }
        case .listVariants: [.pathPrefix("/items")]
        }
    }

    /// `allRule` as patterns.
    var allPatterns: [CacheURLPattern] { [.pathPrefix("/items"), .path("/list")] }

    var allRule: @Sendable (HTTPMethod, URL) -> Bool {
        { method, url in
            let path = url.path
            return method == .get && (path.hasPrefix("/items/") || path == "/list")
        }
    }
}

/// A URL as the cache stores it: query values dropped, names kept (for the floor's distinct URLs).
enum HTTPCachePolicyURL {
    static func stored(_ path: String) -> String {
        var components = URLComponents(string: "https://example.test" + path)!
        components.queryItems = components.queryItems?.map { URLQueryItem(name: $0.name, value: nil) }
        return components.string!
    }
}

// MARK: - Support

struct Read: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}

/// Stores made through a `CachedRequestEngine` (mode `.always`) over a session that answers at
/// once with a body of the size the request asks for, so the benchmark writes real responses
/// without a network.
final class CacheStores: Sendable {
    private let engine: CachedRequestEngine

    init(_ cache: DiskResponseCache) {
        engine = CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: SizedBodySession()),
            cache: cache,
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true)
        )
    }

    /// Stores a `size`-byte response for `/items/<index>` (replacing what that URL held).
    func store(index: Int, size: Int) async throws {
        try await store(path: "/items/\(index)", size: size)
    }

    /// Stores a `size`-byte response for `path` (and query) on example.test.
    func store(path: String, size: Int) async throws {
        let request = SizedRead(url: URL(string: "https://example.test" + path)!, size: size)
        _ = try await engine.response(for: request, mode: .always, staleTime: .zero)
    }
}

struct SizedRead: NetworkRequest {
    let url: URL
    let size: Int
    var method: HTTPMethod { .get }
    var headers: [String: String] { ["X-Body-Size": String(size)] }
}

/// Answers every request at once: 200, `max-age=3600`, a body of `X-Body-Size` bytes.
struct SizedBodySession: NetworkSession {
    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let size = request.value(forHTTPHeaderField: "X-Body-Size").flatMap(Int.init) ?? 0
        let response = HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: ["Cache-Control": "max-age=3600"])!
        return (Data(repeating: 0x62, count: size), response)
    }
}

final class StaleReport: Sendable {
    private let label: String
    init(label: String) { self.label = label }
    private let samples = Mutex<(ten: [Duration], warm: [Duration], all: [Duration], floor: [Duration])>(([], [], [], []))

    func add(ten: Duration, warm: Duration, all: Duration, floor: Duration) {
        samples.withLock {
            $0.ten.append(ten); $0.warm.append(warm); $0.all.append(all); $0.floor.append(floor)
        }
    }

    func print() {
        let (ten, warm, all, floor) = samples.withLock { $0 }
        guard !ten.isEmpty else { return }
        Swift.print(
            "markStale over 5 000 stored responses, \(label): "
                + String(
                    format: "10 match %.0f µs (%.0f–%.0f), again warm %.0f µs (%.0f–%.0f), all match %.1f ms (%.1f–%.1f); both rules alone over parsed URLs %.0f µs; %d iterations",
                    percentile(ten, 0.5).microseconds, ten.min()!.microseconds, ten.max()!.microseconds,
                    percentile(warm, 0.5).microseconds, warm.min()!.microseconds, warm.max()!.microseconds,
                    percentile(all, 0.5).microseconds / 1_000, all.min()!.microseconds / 1_000, all.max()!.microseconds / 1_000,
                    percentile(floor, 0.5).microseconds, ten.count))
    }
}

final class LatencyReport: Sendable {
    private let samples = Mutex<(hits: [Duration], trips: [Duration])>(([], []))

    func add(hits: [Duration], trips: [Duration]) {
        samples.withLock {
            $0.hits += hits; $0.trips += trips
        }
    }

    func print() {
        let (hits, trips) = samples.withLock { $0 }
        guard !hits.isEmpty, !trips.isEmpty else { return }
        let hitP50 = percentile(hits, 0.5), tripP50 = percentile(trips, 0.5)
        Swift.print(
            String(
                format: "fresh hit p50 %.1f µs (p99 %.1f), loopback round trip through the engine p50 %.1f µs (p99 %.1f): %.1fx, %d samples each",
                hitP50.microseconds, percentile(hits, 0.99).microseconds, tripP50.microseconds, percentile(trips, 0.99).microseconds,
                tripP50 / hitP50, hits.count))
    }
}

func percentile(_ values: [Duration], _ fraction: Double) -> Duration {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
}

extension Duration {
    var microseconds: Double { Double(components.seconds) * 1e6 + Double(components.attoseconds) / 1e12 }
}

/// glibc's `malloc_trim`: gives freed heap memory back to the system (its header is not in Glibc's
/// module map).
@_silgen_name("malloc_trim")
func returnFreedMemory(_ pad: Int) -> Int32

/// The process's resident memory now (not its peak), from /proc/self/statm.
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let pages = text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

func folderBytes(_ url: URL) -> Int {
    ((try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []).reduce(0) { total, name in
        let attributes = try? FileManager.default.attributesOfItem(atPath: url.appendingPathComponent(name).path)
        return total + ((attributes?[.size] as? NSNumber)?.intValue ?? 0)
    }
}

final class Folder: Sendable {
    let url: URL
    init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("cache-bench-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    func remove() { try? FileManager.default.removeItem(at: url) }
}

/// A folder of N stored responses (200-byte bodies), written once and reused by every iteration.
final class PreparedCache: Sendable {
    private let paths: [String]
    private let state = Mutex<URL?>(nil)

    init(entries: Int) { paths = (0..<entries).map { "/items/\($0)" } }
    init(paths: [String]) { self.paths = paths }

    func url() async throws -> URL {
        if let url = state.withLock({ $0 }) { return url }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("cache-bench-open-\(UUID().uuidString)")
        do {
            let cache = try DiskResponseCache(directory: folder, maxBytes: 1 << 30, memoryBytes: 0)
            let stores = CacheStores(cache)
            for (index, path) in paths.enumerated() {
                try await stores.store(path: path, size: 200)
                if index % 1_000 == 999 { await cache.waitForWrites() }
            }
            await cache.waitForWrites()
        }
        state.withLock { $0 = folder }
        return folder
    }

    func remove() {
        if let url = state.withLock({ $0 }) { try? FileManager.default.removeItem(at: url) }
    }
}
