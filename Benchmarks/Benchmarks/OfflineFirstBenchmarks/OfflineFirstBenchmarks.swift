import Benchmark
import Foundation
import OfflineFirst
import OfflineQueue
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

// What reads meeting queued writes costs, each against a baseline measured in the same run:
// 1. a snapshot with 100 matching pending writes among 1 000 against a plain cache hit of the
//    same read (interleaved) — target: at most 3x;
// 2. the time from calling `mutate` to its return, which waits until 100 live reads have yielded
//    the overlay — target: p99 at most 10 ms;
// 3. 10 000 mutate-and-deliver cycles with a live read showing each — target: resident memory flat.
// Each prints its figures in its teardown; see ../../README.md.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .peakMemoryResident],
        timeUnits: .milliseconds,
        warmupIterations: 1,
        maxDuration: .seconds(20),
        maxIterations: 10
    )

    // MARK: 1. Snapshot with overlays vs a plain cache hit, interleaved

    // Two `apply`s: one that costs nothing (the body as it is: what the library itself costs),
    // and one that appends each write's body to the list (a 1 KiB body copied once per overlay:
    // what a real update adds on top).
    for (name, apply) in [("a free apply", Stack.keepBody), ("an appending apply", Stack.appendBody)] {
        let overlayReport = Mutex<(snapshots: [Duration], hits: [Duration])>(([], []))
        Benchmark("offline-first: snapshot with 100 of 1 000 pending writes overlaid (\(name)) vs a plain cache hit, interleaved") { benchmark in
            let stack = try Stack(connected: true, apply: apply)
            defer { stack.remove() }
            _ = try await stack.reads.response(for: Read(path: "/notes"), mode: .online, staleTime: .seconds(3600))  // stored
            await stack.monitor.setConnected(false)
            for index in 0..<1_000 {  // one in ten changes the notes list
                try await stack.queue.enqueue(Write(path: index % 10 == 0 ? "/notes" : "/other", text: "note \(index)"), sending: .onNextDrain)
            }
            var snapshots: [Duration] = []
            var hits: [Duration] = []
            for block in 0..<20 {
                for isSnapshot in block % 2 == 0 ? [true, false] : [false, true] {
                    for _ in 0..<25 {
                        let start = ContinuousClock.now
                        if isSnapshot {
                            let snapshot = try await stack.client.snapshot(for: Read(path: "/notes"), mode: .offlineFirst, staleTime: .seconds(3600))
                            precondition(snapshot.pendingEntryIDs.count == 100)
                            snapshots.append(ContinuousClock.now - start)
                        } else {
                            let answer = try await stack.reads.response(for: Read(path: "/notes"), mode: .offlineFirst, staleTime: .seconds(3600))
                            precondition(answer.source == .cache)
                            hits.append(ContinuousClock.now - start)
                        }
                    }
                }
            }
            overlayReport.withLock {
                $0.snapshots += snapshots; $0.hits += hits
            }
            benchmark.measurement(.custom("snapshot p50 / hit p50 (x100)", useScalingFactor: false), Int((100 * (percentile(snapshots, 0.5) / percentile(hits, 0.5))).rounded()))
        } teardown: {
            let (snapshots, hits) = overlayReport.withLock { $0 }
            guard !snapshots.isEmpty else { return }
            print(
                String(
                    format: "snapshot with 100 overlays (%@) p50 %.1f µs (p99 %.1f), plain cache hit p50 %.1f µs (p99 %.1f): %.2fx, %d samples each",
                    name, percentile(snapshots, 0.5).microseconds, percentile(snapshots, 0.99).microseconds,
                    percentile(hits, 0.5).microseconds, percentile(hits, 0.99).microseconds,
                    percentile(snapshots, 0.5) / percentile(hits, 0.5), snapshots.count))
        }
    }

    // MARK: 2. mutate until 100 live reads show it

    // The baseline, interleaved in the same run: the same mutate on a second stack that no live
    // read watches (the enqueue alone: its file written and synced).
    let fanOut = Mutex<(watched: [Duration], alone: [Duration])>(([], []))
    Benchmark("offline-first: mutate until 100 live reads show the write") { benchmark in
        let stack = try Stack(connected: false)
        let unwatched = try Stack(connected: false)
        defer { stack.remove(); unwatched.remove() }
        let shown = Counts(100)
        let readers = (0..<100).map { reader in
            let stream = stack.client.snapshots(for: Read(path: "/notes"), mode: .offlineFirst, staleTime: .seconds(3600))
            return Task {
                for try await snapshot in stream { shown.values.withLock { $0[reader] = snapshot.pendingEntryIDs.count } }
            }
        }
        var watched: [Duration] = []
        var alone: [Duration] = []
        for index in 1...200 {
            for isWatched in index % 2 == 0 ? [true, false] : [false, true] {
                let start = ContinuousClock.now
                try await (isWatched ? stack : unwatched).client.mutate(Write(path: "/notes", text: "note \(index)"))
                (isWatched ? { watched.append($0) } : { alone.append($0) })(ContinuousClock.now - start)
            }
        }
        while shown.values.withLock({ $0.min() ?? 0 }) < 200 { await Task.yield() }  // every reader received the last one
        for reader in readers { reader.cancel() }
        fanOut.withLock {
            $0.watched += watched; $0.alone += alone
        }
        benchmark.measurement(.custom("p99 (µs)", useScalingFactor: false), Int(percentile(watched, 0.99).microseconds))
    } teardown: {
        let (watched, alone) = fanOut.withLock { $0 }
        guard !watched.isEmpty else { return }
        print(
            String(
                format: "mutate until 100 live reads showed it: p50 %.2f ms, p99 %.2f ms, max %.2f ms over %d writes; the same mutate unwatched (interleaved): p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                percentile(watched, 0.5).microseconds / 1000, percentile(watched, 0.99).microseconds / 1000,
                (watched.max() ?? .zero).microseconds / 1000, watched.count,
                percentile(alone, 0.5).microseconds / 1000, percentile(alone, 0.99).microseconds / 1000,
                (alone.max() ?? .zero).microseconds / 1000))
    }

    // MARK: 3. Memory over 10 000 mutate-and-deliver cycles

    let growth = Mutex<[String]>([])
    Benchmark(
        "offline-first: resident memory over 10 000 mutate-and-deliver cycles",
        configuration: .init(metrics: [.wallClock, .peakMemoryResident], timeUnits: .milliseconds, warmupIterations: 0, maxDuration: .seconds(120), maxIterations: 2)
    ) { benchmark in
        let stack = try Stack(connected: true)
        defer { stack.remove() }
        let reader = Task {
            for try await _ in stack.client.snapshots(for: Read(path: "/notes"), mode: .online, staleTime: .seconds(3600)) {}
        }
        var samples: [(cycles: Int, kib: Int)] = []
        for cycle in 1...10_000 {
            _ = try await stack.client.mutate(Write(path: "/notes", text: "note \(cycle)"))  // sent and delivered at once
            if cycle % 1_000 == 0 {
                _ = returnFreedMemory(0)
                samples.append((cycle, residentBytes() >> 10))
            }
        }
        reader.cancel()
        let line = samples.map { "\($0.cycles): \($0.kib) KiB" }.joined(separator: ", ")
        growth.withLock { $0.append(line) }
        benchmark.measurement(.custom("resident growth 2 000 → 10 000 cycles (KiB)", useScalingFactor: false), samples.last!.kib - samples[1].kib)
    } teardown: {
        for line in growth.withLock({ $0 }) { print("resident memory after N cycles: \(line)") }
    }
}

// MARK: - Support

/// One number per live read, shared with their tasks.
final class Counts: Sendable {
    let values: Mutex<[Int]>
    init(_ count: Int) { values = Mutex(Array(repeating: 0, count: count)) }
}

struct Read: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
    init(path: String) { url = URL(string: "https://notes.example.test" + path)! }
}

struct Write: QueueableRequest {
    let url: URL
    let text: String
    var method: HTTPMethod { .post }
    var body: Data? { Data(text.utf8) }
    init(path: String, text: String) {
        url = URL(string: "https://notes.example.test" + path)!
        self.text = text
    }
}

/// Answers at once: GET with a 1 KiB list (`max-age=3600`), anything else 201.
struct InstantOrigin: NetworkSession {
    static let list = Data(repeating: 0x61, count: 1_024)
    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        if request.httpMethod == "GET" {
            return (Self.list, HTTPURLResponse(url: request.url!, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: ["Cache-Control": "max-age=3600"])!)
        }
        return (Data(), HTTPURLResponse(url: request.url!, statusCode: 201, httpVersion: "HTTP/1.1", headerFields: [:])!)
    }
}

/// The whole stack on temporary folders over `InstantOrigin`; the overlay appends the write's body.
final class Stack: Sendable {
    let folder: URL
    let monitor: ManualReachabilityMonitor
    let reads: CachedRequestEngine
    let queue: OfflineQueueEngine
    let client: OfflineFirstClient

    typealias Apply = @Sendable (Data?, QueueEntry) throws -> Data?
    static let keepBody: Apply = { current, _ in current }
    static let appendBody: Apply = { current, pending in (current ?? Data()) + (pending.body ?? Data()) }

    init(connected: Bool, apply: @escaping Apply = Stack.appendBody) throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("offline-first-bench-\(UUID().uuidString)")
        monitor = ManualReachabilityMonitor(isConnected: connected)
        let engine = AsyncRequestEngine(session: InstantOrigin())
        reads = CachedRequestEngine(requestEngine: engine, cache: try DiskResponseCache(directory: folder.appendingPathComponent("cache"), maxBytes: 64 << 20), reachabilityMonitor: monitor)
        queue = OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: try DiskQueueStore(directory: folder.appendingPathComponent("queue")), maxQueueSize: 100_000)
        client = OfflineFirstClient(
            reads: reads, queue: queue,
            optimisticUpdates: [
                OptimisticUpdate(
                    mutations: { $0.url.path == "/notes" },
                    reads: { $0.path == "/notes" },
                    apply: apply
                )
            ])
    }

    func remove() { try? FileManager.default.removeItem(at: folder) }
}

func percentile(_ values: [Duration], _ fraction: Double) -> Duration {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
}

extension Duration {
    var microseconds: Double { Double(components.seconds) * 1e6 + Double(components.attoseconds) / 1e12 }
}

@_silgen_name("malloc_trim")
func returnFreedMemory(_ pad: Int) -> Int32

func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let pages = text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}
