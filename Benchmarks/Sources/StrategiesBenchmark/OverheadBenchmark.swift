import Foundation
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Issue 18: "the engine with deadline, per-host breaker and limiter all on costs at most 3 µs CPU
/// per request over the plain engine".
///
/// Two engines over one in-process session that answers at once with a prebuilt response, so
/// what is measured is the engine's own work:
/// - **plain**: `AsyncRequestEngine(session:)` with the default options (the request's 30 s
///   timeout, single flight for GET);
/// - **strategies**: the same with `Configuration.deadline: .seconds(60)`, a `CircuitBreakerRegistry`
///   as `circuitBreakers` (one breaker per host, default configuration) and
///   `Configuration.limits.concurrencyPerHost: 64` — every strategy of issue 18 but hedging, which only acts
///   on a slow answer.
///
/// Three more variants turn on one strategy each (**deadline**, **breakers**, **limiter**), to see
/// what each costs.
///
/// Each round runs a block of `requests` sends of each variant, first one after another from one
/// task (**sequential**), then from 64 tasks at once (**concurrent**), each task on a URL of its
/// own so single flight cannot merge them (all on one host, so all 64 share one limiter and one
/// breaker). Each round starts with the next variant in turn. A block's figure is the
/// process CPU time (every thread) over its requests; the difference and the ratio are taken
/// within a round, then their median and range over the rounds are reported. One round before the
/// measured ones is a warm-up.
enum OverheadBenchmark {
    enum Variant: String, CaseIterable {
        /// The default options.
        case plain
        /// One strategy at a time, to see what each costs.
        case deadline, breakers, limiter
        /// All three.
        case strategies
        /// Adaptive concurrency per host (the default configuration) with retry throttling per
        /// host: issue 26's "at most 1 µs CPU per request over the plain engine".
        case adaptive
        /// Adaptive concurrency per host alone, without the throttle.
        case adaptiveOnly = "adaptive-only"
        /// The default options over a session that says it bounds each call itself
        /// (`honorsTimeoutAndCancellation`, as AsyncHTTPClient's does): every request runs in its
        /// caller's task (issue 30).
        case callerTask = "caller-task"
    }

    enum Shape: String, CaseIterable {
        case sequential, concurrent
    }

    static let workers = 64

    static func engine(_ variant: Variant, session: any NetworkSession) -> AsyncRequestEngine {
        switch variant {
        case .callerTask:
            AsyncRequestEngine(session: InstantSession(boundsEachCall: true))
        case .plain:
            AsyncRequestEngine(session: session)
        case .deadline:
            AsyncRequestEngine(session: session, configuration: .init(deadline: .seconds(60)))
        case .breakers:
            AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perHost(CircuitBreakerRegistry())))
        case .limiter:
            AsyncRequestEngine(session: session, configuration: .init(limits: .init(concurrencyPerHost: workers)))
        case .strategies:
            AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perHost(CircuitBreakerRegistry()), limits: .init(concurrencyPerHost: workers), deadline: .seconds(60)))
        case .adaptive:
            AsyncRequestEngine(session: session, configuration: .init(retry: .init(policy: nil, throttling: RetryThrottling()), limits: .init(adaptiveConcurrencyPerHost: .init())))
        case .adaptiveOnly:
            AsyncRequestEngine(session: session, configuration: .init(limits: .init(adaptiveConcurrencyPerHost: .init())))
        }
    }

    /// One URL per worker, all on one host.
    static let urls: [URL] = (0..<workers).map { worker in
        guard let url = URL(string: "http://127.0.0.1:8080/item?worker=\(worker)") else {
            fatalError("bad benchmark URL")
        }
        return url
    }

    /// `requests` sends through `engine`, in the given shape (`concurrent`: split over 64 tasks).
    static func block(_ engine: AsyncRequestEngine, _ shape: Shape, requests: Int) async throws {
        switch shape {
        case .sequential:
            let request = Get(url: urls[0])
            for _ in 0..<requests {
                _ = try await engine.send(request)
            }
        case .concurrent:
            let perWorker = max(1, requests / workers)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for url in urls {
                    group.addTask {
                        let request = Get(url: url)
                        for _ in 0..<perWorker {
                            _ = try await engine.send(request)
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
    }

    static func run(rounds: Int, requests: Int) async throws {
        let session = InstantSession()
        let variants = Variant.allCases
        let engines = Dictionary(uniqueKeysWithValues: variants.map { ($0, engine($0, session: session)) })
        // Requests actually sent per concurrent block (a multiple of 64).
        let concurrentRequests = max(1, requests / workers) * workers
        print("cost of the strategies over an instant in-process session: \(rounds) rounds (+1 warm-up) of \(requests) sequential and \(concurrentRequests) concurrent (64 tasks) requests per variant")
        print("started \(timestamp()), load average \(loadAverage())")

        // cpu[shape][variant]: µs of process CPU per request, one value per round; wall likewise.
        var cpu: [Shape: [Variant: [Double]]] = [:]
        var wall: [Shape: [Variant: [Double]]] = [:]
        for round in 0...rounds {
            for shape in Shape.allCases {
                let count = shape == .sequential ? requests : concurrentRequests
                // Each round starts with the next variant, so none always runs first or after the same one.
                let start = round % variants.count
                for variant in variants[start...] + variants[..<start] {
                    guard let engine = engines[variant] else { continue }
                    let cpuStart = processCPUTime()
                    let started = ContinuousClock.now
                    try await block(engine, shape, requests: count)
                    let elapsed = started.duration(to: .now)
                    let used = processCPUTime() - cpuStart
                    guard round > 0 else { continue }  // the warm-up round
                    cpu[shape, default: [:]][variant, default: []].append(used.microseconds / Double(count))
                    wall[shape, default: [:]][variant, default: []].append(elapsed.microseconds / Double(count))
                }
            }
        }

        let widths = [11, 11, 10, 10, 24, 9]
        print(row(["shape", "variant", "CPU/req", "wall/req", "added CPU/req (range)", "CPU ratio"], widths: widths))
        for shape in Shape.allCases {
            let plain = cpu[shape]?[.plain] ?? []
            for variant in variants {
                let figures = cpu[shape]?[variant] ?? []
                let added = zip(figures, plain).map { $0 - $1 }
                let ratios = zip(figures, plain).map { $0 / $1 }
                print(
                    row(
                        [
                            shape.rawValue, variant.rawValue,
                            String(format: "%.2f µs", figures.median),
                            String(format: "%.2f µs", (wall[shape]?[variant] ?? []).median),
                            variant == .plain ? "—" : String(format: "%+.2f (%+.2f…%+.2f) µs", added.median, added.min() ?? 0, added.max() ?? 0),
                            String(format: "%.3f", ratios.median),
                        ], widths: widths))
            }
        }
        print("medians over \(rounds) rounds of process CPU (all threads) per request; \"added\" is variant − plain within a round. Targets: strategies ≤ +3 µs, adaptive ≤ +1 µs")
        print("finished \(timestamp()), load average \(loadAverage())")
    }

    /// `requests` sends of one variant and shape, and nothing else: run under
    /// `valgrind --tool=callgrind` at two counts, the difference in instructions over the
    /// difference in requests is the instructions per request without start-up
    /// (Benchmarks/Scripts/callgrind-strategies.sh).
    static func count(_ variant: Variant, _ shape: Shape, requests: Int) async throws {
        let engine = engine(variant, session: InstantSession())
        try await block(engine, shape, requests: requests)
    }
}

/// Answers every request at once with the same prebuilt 200 response and 22-byte body.
final class InstantSession: NetworkSession {
    let response: HTTPURLResponse
    /// With `boundsEachCall`, it says so (`honorsTimeoutAndCancellation`): answering at once, it
    /// cannot outlive any timeout, and there is nothing to cancel.
    let honorsTimeoutAndCancellation: Bool

    init(boundsEachCall: Bool = false) {
        honorsTimeoutAndCancellation = boundsEachCall
        guard let url = URL(string: "http://127.0.0.1:8080/item"),
            let response = HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: ["Content-Length": "\(itemBody.count)"])
        else { fatalError("could not build the prebuilt response") }
        self.response = response
    }

    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        (itemBody, response)
    }
}
