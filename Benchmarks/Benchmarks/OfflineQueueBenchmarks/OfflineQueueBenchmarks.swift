import Benchmark
import Foundation
import OfflineQueue
import RequestEngine
import ResilienceTesting
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// What the offline queue's durability and bookkeeping cost, each against a baseline measured in the
// same run (interleaved where the two halves can share an iteration):
// 1. sequential durable enqueue vs a raw durable write of the same bytes (temp + fsync + rename +
//    directory fsync) — target: the queue reaches >= 80 % of the raw rate;
// 2. 64 concurrent enqueuers (group commit of directory fsyncs) vs one sequential enqueuer —
//    target: >= 3x the sequential rate;
// 3. opening a folder of 10 000 and 100 000 entries: time and peak RSS;
// 4. replaying 10 000 entries to LoopbackHTTPServer vs sending the same 10 000 requests directly
//    through AsyncRequestEngine — target: <= 1.15x;
// 6. replay with `maxConcurrentDeliveries` 1, 16 and 64 against an origin answering in 0, 50 and
//    200 ms, interleaved — target: N = 16 at least 10x N = 1 at 50 ms; each rate beside the
//    Little's-law bound (N / latency).
// Ratios are printed by each benchmark's teardown; see ../../README.md for the figures.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .peakMemoryResident],
        timeUnits: .milliseconds,
        warmupIterations: 1,
        maxDuration: .seconds(20),
        maxIterations: 20
    )

    // MARK: 1. Sequential: queue enqueue vs raw durable write, interleaved

    let sequential = RatioReport(label: "queue enqueue rate / raw durable write rate (sequential, 200 + 200 per iteration)", invert: true)
    Benchmark("queue: sequential durable enqueue vs raw durable write, interleaved") { benchmark in
        let folder = Folder()
        defer { folder.remove() }
        let store = try DiskQueueStore(directory: folder.url.appendingPathComponent("queue"))
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store, maxQueueSize: 1_000_000)
        let raw = folder.url.appendingPathComponent("raw").path
        mkdir(raw, 0o700)
        let payload = try await samplePayload()
        var rawTime = Duration.zero
        var queueTime = Duration.zero
        for round in 0..<4 {  // raw, queue, queue, raw, … in blocks of 50
            let order = round % 2 == 0 ? [true, false] : [false, true]
            for isRaw in order {
                let start = ContinuousClock.now
                for _ in 0..<50 {
                    if isRaw {
                        try rawDurableWrite(payload, directory: raw)
                    } else {
                        _ = try await engine.enqueue(QueuedRequest(method: .post, url: sampleURL, body: payload.body), sending: .onNextDrain)
                    }
                }
                if isRaw { rawTime += ContinuousClock.now - start } else { queueTime += ContinuousClock.now - start }
            }
        }
        sequential.add(numerator: queueTime, denominator: rawTime)
        benchmark.measurement(.custom("queue/raw time per item (‰)"), Int(queueTime / rawTime * 1000))
    } teardown: {
        sequential.print()
    }

    // MARK: 2. Concurrent enqueue with group commit vs sequential enqueue, interleaved

    let concurrent = RatioReport(label: "concurrent (64 tasks) enqueue rate / sequential enqueue rate (256 entries each way per iteration)", invert: true)
    // The disk's own ceiling, measured in the same iterations: 256 raw durable writes from 64
    // threads (temp + fsync + rename each, ONE directory fsync for the whole batch, more optimistic
    // than the queue, which acknowledges each entry only after a directory fsync covers it) against
    // 256 raw durable writes one by one.
    let rawCeiling = RatioReport(label: "raw ceiling: 64 threads of raw durable writes rate / sequential raw durable write rate (256 each way)", invert: true)
    Benchmark("queue: 64 concurrent enqueuers (group commit) vs sequential, interleaved") { benchmark in
        let folder = Folder()
        defer { folder.remove() }
        let store = try DiskQueueStore(directory: folder.url)
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store, maxQueueSize: 1_000_000)
        let payload = try await samplePayload()
        let count = 256
        let (sequentialTime, concurrentTime) = try await timedInABBAOrder {
            for _ in 0..<count {
                _ = try await engine.enqueue(QueuedRequest(method: .post, url: sampleURL, body: payload.body), sending: .onNextDrain)
            }
        } and: {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<64 {
                    group.addTask {
                        for _ in 0..<(count / 64) where worker >= 0 {
                            _ = try await engine.enqueue(QueuedRequest(method: .post, url: sampleURL, body: payload.body), sending: .onNextDrain)
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        concurrent.add(numerator: concurrentTime, denominator: sequentialTime)
        benchmark.measurement(.custom("concurrent/sequential time (‰)"), Int(concurrentTime / sequentialTime * 1000))

        let rawFolder = Folder()
        defer { rawFolder.remove() }
        let (rawSequential, rawParallel) = try await timedInABBAOrder {
            for _ in 0..<count { try rawDurableWrite(payload, directory: rawFolder.url.path) }
        } and: {
            rawParallelDurableWrites(payload, directory: rawFolder.url.path, count: count, threads: 64)
        }
        rawCeiling.add(numerator: rawParallel, denominator: rawSequential)
    } teardown: {
        concurrent.print()
        rawCeiling.print()
    }

    // MARK: 3. Open a folder of N entries

    for count in [10_000, 100_000] {
        let prepared = PreparedFolder(entries: count)
        Benchmark(
            "queue: open \(count) entries",
            configuration: .init(metrics: [.wallClock, .peakMemoryResident, .mallocCountTotal], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(30), maxIterations: 10)
        ) { benchmark in
            let url = try await prepared.url()
            benchmark.startMeasurement()
            let store = try DiskQueueStore(directory: url)
            benchmark.stopMeasurement()
            precondition(store.openReport.loaded == count && store.openReport.quarantined.isEmpty, "open loaded \(store.openReport.loaded)")
            blackHole(store)
        } teardown: {
            prepared.remove()
        }
    }

    // MARK: 4. Replay 10 000 entries vs sending them directly, interleaved

    // Issue 46: a write based on a version goes with `If-Match`, its base stored in its file. The
    // cost over today's replay when no conflict occurs (the origin takes every write): 5 000
    // entries each side per iteration, in five folders of 1 000 per side replayed in alternation
    // (A-B, B-A, …; which side opens alternates by iteration too), after a sync() so the folders'
    // own writeback does not land in one side's drain. Wall time and the process's CPU time
    // (user + system, server included: the same for both sides but for what differs) each give a
    // ratio; the disk's latency is in the first, not in the second.
    let conditional = RatioReport(label: "conditional replay (If-Match) of 5 000 entries / plain replay of 5 000 (wall time)", invert: false)
    let conditionalCPU = RatioReport(label: "conditional replay (If-Match) of 5 000 entries / plain replay of 5 000 (CPU time)", invert: false)
    let blocks = 5
    let conditionalPrepared = (0..<blocks).map { PreparedFolder(entries: 1_000, pathPrefix: "/conditional/\($0)/", baseETag: "\"v1\"") }
    let plainPrepared = (0..<blocks).map { PreparedFolder(entries: 1_000, pathPrefix: "/plain/\($0)/") }
    let conditionalIterations = Mutex(0)
    Benchmark(
        "queue: conditional replay vs plain replay, interleaved",
        configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(900), maxIterations: 16)
    ) { benchmark in
        let conditionalFirst = conditionalIterations.withLock { count in
            defer { count += 1 }
            return !count.isMultiple(of: 2)
        }
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/conditional/*", .status(201))
        server.route("/plain/*", .status(201))
        let sender = AsyncRequestEngine(session: URLSession(configuration: .ephemeral))
        var conditionalFolders: [URL] = []
        var plainFolders: [URL] = []
        for prepared in conditionalPrepared { conditionalFolders.append(try await prepared.url(baseURL: server.baseURL)) }
        for prepared in plainPrepared { plainFolders.append(try await prepared.url(baseURL: server.baseURL)) }
        sync()
        let drain = { (folder: URL) async throws -> (wall: Duration, cpu: Duration) in
            let start = ContinuousClock.now
            let cpuStart = processCPUTime()
            let queue = OfflineQueueEngine(
                requestEngine: sender, reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: folder), maxQueueSize: 1_000_000)
            let report = await queue.flush()
            let times = (ContinuousClock.now - start, processCPUTime() - cpuStart)
            precondition(report.delivered.count == 1_000 && report.remaining == 0, "replay delivered \(report.delivered.count)")
            return times
        }
        var conditionalTime = (wall: Duration.zero, cpu: Duration.zero)
        var plainTime = (wall: Duration.zero, cpu: Duration.zero)
        for block in 0..<blocks {
            let add = { (total: inout (wall: Duration, cpu: Duration), time: (wall: Duration, cpu: Duration)) in
                total.wall += time.wall
                total.cpu += time.cpu
            }
            if conditionalFirst == block.isMultiple(of: 2) {
                add(&conditionalTime, try await drain(conditionalFolders[block]))
                add(&plainTime, try await drain(plainFolders[block]))
            } else {
                add(&plainTime, try await drain(plainFolders[block]))
                add(&conditionalTime, try await drain(conditionalFolders[block]))
            }
        }
        precondition(server.requestLog.filter { $0.path.hasPrefix("/conditional/") }.allSatisfy { $0.header("if-match") == "\"v1\"" })
        for prepared in conditionalPrepared + plainPrepared { prepared.remove() }
        conditional.add(numerator: conditionalTime.wall, denominator: plainTime.wall)
        conditionalCPU.add(numerator: conditionalTime.cpu, denominator: plainTime.cpu)
        benchmark.measurement(.custom("conditional/plain wall time (‰)"), Int(conditionalTime.wall / plainTime.wall * 1000))
        benchmark.measurement(.custom("conditional/plain CPU time (‰)"), Int(conditionalTime.cpu / plainTime.cpu * 1000))
    } teardown: {
        conditional.print()
        conditionalCPU.print()
        for prepared in conditionalPrepared + plainPrepared { prepared.remove() }
    }

    // A conflict's resolution on loopback: 200 writes based on "v1" meet an origin at "v2" (412),
    // each is stored in conflict, the server's version fetched, a resolver rebases it, and the
    // rebased write is delivered; beside it, the same 200 writes delivered on their first try.
    let resolution = RatioReport(label: "200 conflicts resolved and delivered / 200 writes delivered at once (time)", invert: false)
    let perWrite = Mutex((plain: Duration.zero, resolved: Duration.zero, writes: 0))
    Benchmark(
        "queue: conflict resolution vs plain delivery, interleaved",
        configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(120), maxIterations: 12)
    ) { benchmark in
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/note/*",
            handler: { request in
                if request.method == "GET" { return .status(200, headers: ["ETag": "\"v2\""], body: "server") }
                return request.header("if-match") == "\"v1\"" ? .status(412) : .status(201)
            })
        let sender = AsyncRequestEngine(session: URLSession(configuration: .ephemeral))
        let run = { (etag: String) async throws -> Duration in
            let folder = Folder()
            defer { folder.remove() }
            let queue = OfflineQueueEngine(
                requestEngine: sender, reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: folder.url),
                maxQueueSize: 1_000_000, configuration: .init(conflictResolver: RebaseOnServer()))
            for index in 0..<200 {
                let request = QueuedRequest(method: .put, url: server.url("/note/\(index)"), body: Data("mine".utf8), editBase: EditBase(etag: etag))
                _ = try await queue.enqueue(request, sending: .onNextDrain)
            }
            var counts = queue.pendingCounts.makeAsyncIterator()
            let start = ContinuousClock.now
            await queue.start()
            while let count = await counts.next(), count > 0 {}
            let time = ContinuousClock.now - start
            await queue.close()
            return time
        }
        // A-B-B-A; only the drain is timed (not the enqueues that fill each folder).
        var plainTime = Duration.zero
        var conflictTime = Duration.zero
        for conflicts in [false, true, true, false] {
            let time = try await run(conflicts ? "\"v1\"" : "\"v2\"")
            if conflicts { conflictTime += time } else { plainTime += time }
        }
        resolution.add(numerator: conflictTime, denominator: plainTime)
        perWrite.withLock { $0 = ($0.plain + plainTime, $0.resolved + conflictTime, $0.writes + 400) }
        benchmark.measurement(.custom("resolved/plain time (‰)"), Int(conflictTime / plainTime * 1000))
        benchmark.measurement(.custom("µs per write, resolved"), Int(conflictTime / .microseconds(1)) / 400)
        benchmark.measurement(.custom("µs per write, plain"), Int(plainTime / .microseconds(1)) / 400)
    } teardown: {
        resolution.print()
        let (plain, resolved, writes) = perWrite.withLock { $0 }
        if writes > 0 {
            let micro = { (time: Duration) in Int(time / .microseconds(1)) / writes }
            print("per write, mean over every iteration: delivered at once \(micro(plain)) µs, resolved then delivered \(micro(resolved)) µs")
        }
    }

    let replay = RatioReport(label: "replay of 10 000 queued entries / 10 000 direct sends (time)", invert: false)
    let replayPrepared = PreparedFolder(entries: 10_000, pathPrefix: "/replay/")
    let replayIterations = Mutex(0)
    Benchmark(
        "queue: replay 10 000 entries vs direct sends, interleaved",
        // Twelve iterations (six gave medians 0.1 apart run to run on this VM), alternating which side goes first: a folder written just before (and the
        // disk's journal still busy with it) must not always favour or burden the same side.
        configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 0, maxDuration: .seconds(600), maxIterations: 12)
    ) { benchmark in
        let replayFirst = replayIterations.withLock { count in
            defer { count += 1 }
            return !count.isMultiple(of: 2)
        }
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/replay/*", .status(201))
        let session = URLSession(configuration: .ephemeral)
        let sender = AsyncRequestEngine(session: session)
        let sourceFolder = try await replayPrepared.url(baseURL: server.baseURL)
        // Direct: the same 10 000 requests, one at a time, through the same kind of engine.
        // Read in a scope of its own, so this store has let go of the folder before the replay
        // opens it (a store kept alive to the end of the closure made the replay's open fail).
        let requests = try await { () async throws -> [QueuedRequest] in
            let entries = try DiskQueueStore(directory: sourceFolder)
            return await entries.load().map { entry in
                QueuedRequest(method: .post, url: entry.url, headers: entry.headers, body: entry.body, idempotencyKey: entry.idempotencyKey)
            }
        }()
        let direct = { () async throws -> Duration in
            let start = ContinuousClock.now
            for request in requests {
                var headers = request.headers
                headers["Idempotency-Key"] = request.idempotencyKey
                let (_, response) = try await sender.send(DirectRequest(url: request.url, headers: headers, body: request.body))
                precondition(response.statusCode == 201)
            }
            return ContinuousClock.now - start
        }
        // Replay: open the folder and drain it.
        let replayOnce = { () async throws -> Duration in
            let start = ContinuousClock.now
            let queue = OfflineQueueEngine(
                requestEngine: sender, reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: sourceFolder), maxQueueSize: 1_000_000)
            let report = await queue.flush()
            let time = ContinuousClock.now - start
            precondition(report.delivered.count == 10_000 && report.remaining == 0, "replay delivered \(report.delivered.count)")
            return time
        }
        let directTime: Duration
        let replayTime: Duration
        if replayFirst {
            replayTime = try await replayOnce()
            directTime = try await direct()
        } else {
            directTime = try await direct()
            replayTime = try await replayOnce()
        }
        replayPrepared.remove()  // drained: the next iteration writes a fresh folder
        replay.add(numerator: replayTime, denominator: directTime)
        benchmark.measurement(.custom("replay/direct time (‰)"), Int(replayTime / directTime * 1000))
    } teardown: {
        replay.print()
        replayPrepared.remove()
    }

    concurrentDeliveryBenchmarks()
}

// MARK: 6. Concurrent deliveries against a slow origin (issue 49)

/// The disk queue's replay rate at `maxConcurrentDeliveries` 1, 16 and 64, against a loopback
/// origin that answers each request `latency` after reading it: the three drains of an iteration
/// run one after another, in an order that rotates from one iteration to the next.
func concurrentDeliveryBenchmarks() {
    for latency in [0, 50, 200] {
        let limits = [1, 16, 64]
        // About one second of deliveries at the Little's-law bound (2 000 entries at 0 ms).
        let entries = { (limit: Int) -> Int in latency == 0 ? 2_000 : max(8, limit * 1_000 / latency) }
        let folders = Dictionary(uniqueKeysWithValues: limits.map { ($0, PreparedFolder(entries: entries($0), pathPrefix: "/slow/")) })
        let rates = Mutex<[Int: [Double]]>([:])
        let iterations = Mutex(0)
        Benchmark(
            "queue: concurrent deliveries N = 1, 16, 64, \(latency) ms origin, interleaved",
            configuration: .init(metrics: [.wallClock], timeUnits: .milliseconds, warmupIterations: 1, maxDuration: .seconds(120), maxIterations: 7)
        ) { benchmark in
            let rotation = iterations.withLock { count in
                defer { count += 1 }
                return count % limits.count
            }
            let server = try LoopbackHTTPServer()
            defer { server.shutdown() }
            server.route("/slow/*", LoopbackResponse(status: 201, delay: .milliseconds(latency)))
            let configuration = URLSessionConfiguration.ephemeral
            configuration.httpMaximumConnectionsPerHost = 64
            let sender = AsyncRequestEngine(session: URLSession(configuration: configuration))
            for limit in limits[rotation...] + limits[..<rotation] {
                let folder = try await folders[limit]!.url(baseURL: server.baseURL)
                sync()
                let start = ContinuousClock.now
                let queue = OfflineQueueEngine(
                    requestEngine: sender, reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: folder),
                    maxQueueSize: 1_000_000, configuration: .init(maxConcurrentDeliveries: limit))
                let report = await queue.flush()
                let time = ContinuousClock.now - start
                precondition(report.delivered.count == entries(limit) && report.remaining == 0, "replay delivered \(report.delivered.count)")
                await queue.close()
                folders[limit]!.remove()
                let rate = Double(entries(limit)) / (time / .seconds(1))
                rates.withLock { $0[limit, default: []].append(rate) }
                benchmark.measurement(.custom("N = \(limit) deliveries/s"), Int(rate))
            }
        } teardown: {
            for folder in folders.values { folder.remove() }
            let all = rates.withLock { $0 }
            guard let one = all[1], !one.isEmpty else { return }
            for limit in limits {
                guard let samples = all[limit], !samples.isEmpty else { continue }
                let median = samples.sorted()[samples.count / 2]
                let bound =
                    latency == 0
                    ? "no bound (instant origin)"
                    : String(format: "Little's-law bound %.0f/s, %.0f %% of it", Double(limit) * 1_000 / Double(latency), median / (Double(limit) * 1_000 / Double(latency)) * 100)
                // Ratios per iteration (both drains of one iteration ran minutes apart at most).
                let ratios = zip(samples, one).map { $0 / $1 }.sorted()
                Swift.print(
                    String(
                        format: "disk queue, %d ms origin, N = %d: median %.1f deliveries/s (min %.1f, max %.1f, %d iterations); %@; x N = 1: median %.2f",
                        latency, limit, median, samples.min() ?? 0, samples.max() ?? 0, samples.count, bound, ratios[ratios.count / 2]))
            }
        }
    }
}

// MARK: - Support

/// Runs `a` and `b` twice each in the order a, b, b, a — so neither side always runs first, on a
/// warmer or a busier disk — and returns the total time each took.
func timedInABBAOrder(
    _ a: () async throws -> Void,
    and b: () async throws -> Void
) async rethrows -> (a: Duration, b: Duration) {
    var timeA = Duration.zero
    var timeB = Duration.zero
    for runB in [false, true, true, false] {
        let start = ContinuousClock.now
        if runB {
            try await b()
            timeB += ContinuousClock.now - start
        } else {
            try await a()
            timeA += ContinuousClock.now - start
        }
    }
    return (timeA, timeB)
}

let sampleURL = URL(string: "https://api.example.test/comments")!

struct Payload: Sendable {
    let body: Data
    let encoded: Data  // what a queue entry with this body looks like on disk
}

/// A 200-byte JSON body, and the bytes of a queue file holding it (the raw baseline writes those).
func samplePayload() async throws -> Payload {
    let body = Data(("{\"text\":\"" + String(repeating: "x", count: 188) + "\"}").utf8)
    let folder = Folder()
    defer { folder.remove() }
    let store = try DiskQueueStore(directory: folder.url)
    let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store)
    guard let id = try await engine.enqueue(QueuedRequest(method: .post, url: sampleURL, body: body), sending: .onNextDrain).queuedID else {
        throw BenchmarkFailure.setup("could not write a sample entry")
    }
    let encoded = try Data(contentsOf: folder.url.appendingPathComponent("\(id.uuidString).json"))
    return Payload(body: body, encoded: encoded)
}

enum BenchmarkFailure: Error {
    case setup(String)
}

/// The baseline: what any durable one-file-per-record store must do.
func rawDurableWrite(_ payload: Payload, directory: String, syncDirectory: Bool = true) throws {
    let name = UUID().uuidString
    let temp = "\(directory)/.\(name).tmp"
    let final = "\(directory)/\(name).json"
    let fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw BenchmarkFailure.setup("open failed") }
    _ = payload.encoded.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    fsync(fd)
    close(fd)
    rename(temp, final)
    if syncDirectory { fsyncDirectory(directory) }
}

func fsyncDirectory(_ directory: String) {
    let dir = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    fsync(dir)
    close(dir)
}

/// `count` raw durable writes from `threads` OS threads (fsync blocks a thread, so Swift tasks on the
/// two-thread cooperative pool would cap the parallelism at two), then one directory fsync.
func rawParallelDurableWrites(_ payload: Payload, directory: String, count: Int, threads: Int) {
    let group = DispatchGroup()
    for _ in 0..<threads {
        group.enter()
        let thread = Thread {
            for _ in 0..<(count / threads) {
                try? rawDurableWrite(payload, directory: directory, syncDirectory: false)
            }
            group.leave()
        }
        thread.start()
    }
    group.wait()
    fsyncDirectory(directory)
}

struct DirectRequest: NetworkRequest {
    let url: URL
    let method: HTTPMethod = .post
    let headers: [String: String]
    let body: Data?
}

final class Folder: Sendable {
    let url: URL
    init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("queue-bench-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    func remove() { try? FileManager.default.removeItem(at: url) }
}

/// A folder of N queue entries written once (without fsync: only opening is measured), reused by
/// every iteration. Entries are written through a real store, then copied as files for speed.
final class PreparedFolder: Sendable {
    private let count: Int
    private let pathPrefix: String
    /// The `ETag` every entry's write is based on (`EditBase`), if any: then each goes with `If-Match`.
    private let baseETag: String?
    private let state = Mutex<URL?>(nil)

    init(entries: Int, pathPrefix: String = "/items/", baseETag: String? = nil) {
        count = entries
        self.pathPrefix = pathPrefix
        self.baseETag = baseETag
    }

    /// The folder, made on first use. Entries point at `baseURL` (for replay) or example.test.
    func url(baseURL: URL = URL(string: "https://api.example.test")!) async throws -> URL {
        if let url = state.withLock({ $0 }) {
            if FileManager.default.fileExists(atPath: url.path) { return url }
        }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("queue-bench-open-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        // One real entry as a template, then N files with fresh ids, sequences and keys.
        let template = try await templateEntry(baseURL: baseURL)
        for index in 0..<count {
            var object = template
            let id = UUID().uuidString
            object["id"] = id
            object["sequence"] = index + 1
            object["idempotencyKey"] = UUID().uuidString
            object["url"] = baseURL.absoluteString + pathPrefix + "\(index)"
            object["priority"] = index % 10 == 0 ? 1 : 0
            if let baseETag { object["baseETag"] = baseETag }
            let data = try JSONSerialization.data(withJSONObject: object)
            try data.write(to: folder.appendingPathComponent("\(id).json"))
        }
        state.withLock { $0 = folder }
        return folder
    }

    func remove() {
        if let url = state.withLock({ $0 }) { try? FileManager.default.removeItem(at: url) }
        state.withLock { $0 = nil }
    }

    private func templateEntry(baseURL: URL) async throws -> [String: Any] {
        let folder = Folder()
        defer { folder.remove() }
        let store = try DiskQueueStore(directory: folder.url)
        let engine = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store)
        _ = try await engine.enqueue(QueuedRequest(method: .post, url: baseURL.appendingPathComponent("template"), body: Data("{\"n\":1}".utf8)), sending: .onNextDrain)
        let names = try FileManager.default.contentsOfDirectory(atPath: folder.url.path).filter { $0.hasSuffix(".json") }
        guard let name = names.first,
            let object = try JSONSerialization.jsonObject(with: Data(contentsOf: folder.url.appendingPathComponent(name))) as? [String: Any]
        else { throw BenchmarkFailure.setup("no template entry") }
        return object
    }
}

/// Collects numerator/denominator pairs across iterations and prints their ratio.
final class RatioReport: Sendable {
    private let label: String
    private let invert: Bool
    private let samples = Mutex<[(Duration, Duration)]>([])

    /// `invert`: print denominator/numerator (a rate ratio from two times).
    init(label: String, invert: Bool) {
        self.label = label
        self.invert = invert
    }

    func add(numerator: Duration, denominator: Duration) {
        samples.withLock { $0.append((numerator, denominator)) }
    }

    func print() {
        let all = samples.withLock { $0 }
        guard !all.isEmpty else { return }
        let ratios = all.map { invert ? $0.1 / $0.0 : $0.0 / $0.1 }.sorted()
        let median = ratios[ratios.count / 2]
        let total = all.reduce((Duration.zero, Duration.zero)) { ($0.0 + $1.0, $0.1 + $1.1) }
        let pooled = invert ? total.1 / total.0 : total.0 / total.1
        Swift.print(
            String(
                format: "%@: median %.3f, pooled %.3f, min %.3f, max %.3f over %d iterations",
                label, median, pooled, ratios.first ?? 0, ratios.last ?? 0, all.count))
    }
}

/// Rebases every conflict onto the server's version, with the write's own body.
struct RebaseOnServer: ConflictResolver {
    func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution { .rebase(body: conflict.entry.body) }
}

/// CPU time consumed so far by the whole process (every thread: caller, URLSession, server).
func processCPUTime() -> Duration {
    var now = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
    return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
}
