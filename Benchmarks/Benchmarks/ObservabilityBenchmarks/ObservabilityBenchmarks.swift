import Benchmark
import Foundation
import Observability
import RequestEngine
import ResilienceTesting

// What recording an engine event costs: RequestMetricsCollector (lock-striped, no actor) against
// two actor-based collectors in the same run, with 1 and 4 recording tasks, an empty sink for the
// cost of the call itself, and a CPU spin as a control for how many cores the run got. See
// ../../README.md.
//
// Every iteration records exactly 1 000 000 events (1 task × 1 000 000, or 4 tasks × 250 000) and
// the configuration's `scalingFactor` is `.mega`, so the scaled figures the tool prints are per
// event: wall clock in ns per event (for 4 tasks: elapsed time / all events, i.e. the inverse of the
// aggregate throughput), process CPU time in ns per event (flat from 1 to 4 tasks when recording
// adds no contention, even on a machine that gives the run fewer cores than it has), mallocs per
// event, and throughput in M events/s. The events are built once
// per benchmark in its setup (trace ids, URLs and all), so an iteration measures recording only.
// Each sink is created in setup too and kept across iterations: the endpoints are known after the
// warm-up, as they are in a long-running app.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .cpuTotal, .throughput, .mallocCountTotal],
        timeUnits: .nanoseconds,
        warmupIterations: 2,
        scalingFactor: .mega,
        maxDuration: .seconds(10),
        maxIterations: 100
    )

    for tasks in [1, 4] {
        let suffix = tasks == 1 ? "1 task" : "\(tasks) tasks"
        // Control: pure arithmetic, no shared state. On this 2-vCPU VM, 4 tasks finish the same
        // work in half the time only while both vCPUs are free; the ratio of the two tells how many
        // cores the run actually got (other processes on the machine take them away).
        Benchmark(
            "control: cpu spin, \(suffix)",
            closure: { _, tasks in await Spin.run(tasks: tasks) },
            setup: { tasks }
        )
        Benchmark(
            "empty sink record, \(suffix)",
            closure: { _, fixture in await fixture.recordAll() },
            setup: { Fixture(sink: EmptySink(), tasks: tasks) }
        )
        Benchmark(
            "collector record, \(suffix)",
            closure: { _, fixture in await fixture.recordAll() },
            setup: { Fixture(sink: RequestMetricsCollector(), tasks: tasks) }
        )
        Benchmark(
            "actor baseline (same bookkeeping) record, \(suffix)",
            closure: { _, fixture in await fixture.recordAll() },
            setup: { Fixture(sink: ActorWrappedCollector(), tasks: tasks) }
        )
        Benchmark(
            "actor baseline (dictionaries) record, \(suffix)",
            closure: { _, fixture in await fixture.recordAll() },
            setup: { Fixture(sink: DictionaryActorCollector(), tasks: tasks) }
        )
    }
}

/// One benchmark's sink and its pre-built events, one array per recording task.
struct Fixture: Sendable {
    static let eventsPerIteration = 1_000_000

    let sink: any RequestEventSink
    let events: [[RequestEvent]]

    init(sink: any RequestEventSink, tasks: Int) {
        self.sink = sink
        events = (0..<tasks).map { task in
            EventStream.make(count: Self.eventsPerIteration / tasks, seed: UInt64(task + 1))
        }
    }

    /// Every task records its events through `any RequestEventSink`, as the engine does.
    func recordAll() async {
        let sink = self.sink
        if events.count == 1 {
            for event in events[0] { await sink.record(event) }
            return
        }
        await withTaskGroup(of: Void.self) { group in
            for stream in events {
                group.addTask {
                    for event in stream { await sink.record(event) }
                }
            }
        }
    }
}

/// A realistic stream of engine events, exactly `count` long, every request complete:
/// `started` → (10 %: `retryScheduled`) → `succeeded` (92 %; 200 or 201) or `failed` (8 %; 503 or
/// timed out), and after 5 % of the requests a `deduplicated` caller. URLs come from eight
/// endpoints with numeric or UUID ids, many with a query string (a pool of 4096 URLs per task).
/// Durations are log-uniform between 1 ms and 2 s.
enum EventStream {
    static func make(count: Int, seed: UInt64) -> [RequestEvent] {
        var random = SplitMix64(seed: seed)
        let urls = (0..<4096).map { _ in randomURL(&random) }
        var events: [RequestEvent] = []
        events.reserveCapacity(count)
        var index = 0
        while events.count < count {
            let room = count - events.count
            let url = urls[index % urls.count]
            let method: HTTPMethod = index % 9 == 0 ? .post : .get
            index += 1
            let id = uuid(&random)
            let retry = random.next() % 10 == 0
            let fails = random.next() % 100 < 8
            let dedup = random.next() % 20 == 0
            let size = 2 + (retry ? 1 : 0) + (dedup ? 1 : 0)
            guard size <= room else {
                // Fill the end with deduplicated callers (one event each), so the count is exact.
                events.append(.deduplicated(traceID: uuid(&random), url: url, method: .get))
                continue
            }
            events.append(.started(traceID: id, url: url, method: method))
            if retry { events.append(.retryScheduled(traceID: id, attempt: 0, delay: 0.1)) }
            if fails {
                let error: NetworkError = random.next() % 2 == 0 ? .httpError(statusCode: 503, data: nil) : .timedOut
                events.append(.failed(traceID: id, error: error, attempt: retry ? 1 : 0))
            } else {
                let seconds = exp(log(0.001) + Double(random.next() % 1_000_000) / 1_000_000 * (log(2.0) - log(0.001)))
                events.append(.succeeded(traceID: id, statusCode: random.next() % 4 == 0 ? 201 : 200, duration: seconds, attempt: retry ? 1 : 0))
            }
            if dedup { events.append(.deduplicated(traceID: uuid(&random), url: url, method: method)) }
        }
        return events
    }

    static func randomURL(_ random: inout SplitMix64) -> URL {
        let id = random.next() % 1_000_000
        let path =
            switch random.next() % 8 {
            case 0: "/v1/users/\(id)"
            case 1: "/v1/users/\(id)/orders?page=\(id % 7)&access_token=secret"
            case 2: "/v1/orders/\(uuid(&random).uuidString.lowercased())"
            case 3: "/v1/catalog/items/\(id)/images/\(id % 13)"
            case 4: "/v1/search?q=term\(id)"
            case 5: "/v2/feed"
            case 6: "/v1/accounts/\(id)/settings/notifications"
            default: "/health"
            }
        return URL(string: "https://api.example.com" + path) ?? URL(fileURLWithPath: "/")
    }

    /// Random version-4-shaped UUIDs without `UUID()`, which reads /dev/urandom on Linux (~3 µs).
    static func uuid(_ random: inout SplitMix64) -> UUID {
        let high = random.next(), low = random.next()
        return withUnsafeBytes(of: (high, low)) { bytes in
            UUID(
                uuid: (
                    bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6] & 0x0F | 0x40, bytes[7],
                    bytes[8] & 0x3F | 0x80, bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
                ))
        }
    }
}

/// 1 000 000 units of dependent integer arithmetic per iteration, split over `tasks` tasks.
enum Spin {
    static func run(tasks: Int) async {
        await withTaskGroup(of: Int.self) { group in
            for task in 0..<tasks {
                group.addTask { spin(units: Fixture.eventsPerIteration / tasks, seed: task) }
            }
            var total = 0
            for await result in group { total &+= result }
            blackHole(total)
        }
    }

    @inline(never)
    static func spin(units: Int, seed: Int) -> Int {
        var value = seed
        for unit in 0..<units * 40 { value = value &* 31 &+ unit }
        return value
    }
}

// MARK: - Baselines

/// Records nothing: the cost of the `await sink.record(event)` call through the protocol and of
/// walking the event array, the floor under every sink.
struct EmptySink: RequestEventSink {
    func record(_ event: RequestEvent) {}
}

/// Exactly the collector's bookkeeping, behind an actor: the difference to the collector is the
/// actor hop per event, nothing else.
actor ActorWrappedCollector: RequestEventSink {
    private let collector = RequestMetricsCollector()

    func record(_ event: RequestEvent) {
        collector.record(event)
    }
}

/// An actor collector as one would write it first, with the same information kept: the endpoint
/// template per request (`PathTemplate`, building a string), dictionaries from trace id to
/// endpoint and from endpoint to its counters, status counts, the OpenTelemetry buckets and a
/// log-linear histogram of the same resolution (2368 buckets, allocated once per endpoint).
actor DictionaryActorCollector: RequestEventSink {
    struct Endpoint {
        var started = 0, succeeded = 0, failed = 0, retries = 0, deduplicated = 0
        var successSeconds = 0.0
        var statuses: [String: Int] = [:]
        var buckets = [Int](repeating: 0, count: 16)
        var histogram = [UInt64](repeating: 0, count: 2368)
    }

    private static let bounds: [Double] = [0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]
    private var endpoints: [String: Endpoint] = [:]
    private var traces: [UUID: String] = [:]

    private func key(_ url: URL, _ method: HTTPMethod) -> String {
        method.rawValue + " " + PathTemplate.collapsingIdentifiers.template(for: url)
    }

    func record(_ event: RequestEvent) {
        switch event {
        case .started(let id, let url, let method):
            let key = key(url, method)
            traces[id] = key
            endpoints[key, default: Endpoint()].started += 1
        case .deduplicated(_, let url, let method):
            endpoints[key(url, method), default: Endpoint()].deduplicated += 1
        case .retryScheduled(let id, _, _):
            endpoints[traces[id] ?? "unknown", default: Endpoint()].retries += 1
        case .succeeded(let id, let status, let duration, _):
            let key = traces.removeValue(forKey: id) ?? "unknown"
            endpoints[key, default: Endpoint()].succeeded += 1
            endpoints[key, default: Endpoint()].successSeconds += duration
            endpoints[key, default: Endpoint()].statuses[String(status), default: 0] += 1
            endpoints[key, default: Endpoint()].buckets[Self.bounds.firstIndex { duration <= $0 } ?? 15] += 1
            endpoints[key, default: Endpoint()].histogram[Self.bucket(nanoseconds: UInt64(max(0, duration) * 1e9))] += 1
        case .failed(let id, let error, _):
            let key = traces.removeValue(forKey: id) ?? "unknown"
            endpoints[key, default: Endpoint()].failed += 1
            endpoints[key, default: Endpoint()].statuses[error.statusCode.map(String.init) ?? "error", default: 0] += 1
        }
    }

    private static func bucket(nanoseconds: UInt64) -> Int {
        let value = min(nanoseconds, (1 << 43) - 1)
        if value < 64 { return Int(value) }
        let octave = 63 - value.leadingZeroBitCount
        return (octave - 5) * 64 + Int((value >> UInt64(octave - 6)) & 63)
    }
}
