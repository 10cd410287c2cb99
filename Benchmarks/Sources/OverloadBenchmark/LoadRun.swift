import AsyncHTTPClient
import Foundation
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceTesting
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What stands between the load and the upstream in one run.
enum Limiting: Sendable, Hashable, CustomStringConvertible {
    /// No limit: every arrival is sent at once.
    case none
    /// `Configuration.limits.concurrencyPerHost` at this value, with a wait line as long.
    case fixed(Int)
    /// `configuration.limits.adaptiveConcurrencyPerHost = AdaptiveConcurrencyLimiter.Configuration()`: the defaults.
    case gradient
    /// The defaults with `.aimd()` for the algorithm.
    case aimd

    var description: String {
        switch self {
        case .none: "no limit"
        case .fixed(let limit): "static \(limit)"
        case .gradient: "gradient"
        case .aimd: "AIMD"
        }
    }

    var fileName: String {
        switch self {
        case .none: "none"
        case .fixed(let limit): "static-\(limit)"
        case .gradient: "gradient"
        case .aimd: "aimd"
        }
    }

    func engine(over session: AsyncHTTPClientSession) -> AsyncRequestEngine {
        // No deduplication: every arrival is its own request (the URLs differ anyway).
        var configuration = AsyncRequestEngine.Configuration(deduplicatedMethods: [])
        switch self {
        case .none: break
        case .fixed(let limit):
            // The adaptive default's line rule, as long as the limit: the engine's default line
            // of 1 000 holds calls past the upstream's capacity until their timeouts pass.
            configuration.limits.concurrencyPerHost = limit
            configuration.limits.waitingPerHost = limit
        case .gradient: configuration.limits.adaptiveConcurrencyPerHost = AdaptiveConcurrencyLimiter.Configuration()
        case .aimd:
            var adaptive = AdaptiveConcurrencyLimiter.Configuration()
            adaptive.algorithm = .aimd()
            configuration.limits.adaptiveConcurrencyPerHost = adaptive
        }
        return AsyncRequestEngine(session: session, configuration: configuration)
    }
}

/// How one request ended.
enum Outcome: String, Sendable, CaseIterable {
    case ok
    /// The upstream's 503: it could not start the request within its queue time.
    case busy = "503"
    /// The client's own limiter refused it (`NetworkError.limited`).
    case limited
    /// The attempt's timeout passed.
    case timedOut = "timeout"
    case other
}

/// One request: when it arrived (seconds from the run's start, as scheduled, so a late start
/// counts against the latency: no coordinated omission) and how long until its answer.
struct Sample: Sendable {
    var arrival: Double
    var latency: Double
    var outcome: Outcome
}

/// The client's limit and load, read every 50 ms.
struct LimitSample: Sendable {
    var time: Double
    var limit: Int?
    var inFlight: Int
    var waiting: Int
}

/// One GET of the upstream's work, with a 2 s attempt timeout.
struct Work: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
    var timeout: TimeInterval { 2 }
}

struct RunResult: Sendable {
    var limiting: Limiting
    var load: Double
    var samples: [Sample]
    var limits: [LimitSample]
}

/// Drives one engine with open-loop Poisson arrivals at `rate` a second for `duration` seconds;
/// at `halveAt` (seconds) the upstream's workers drop to `halvedWorkers`.
func runLoad(
    limiting: Limiting,
    load: Double,
    rate: Double,
    duration: Double,
    seed: UInt64,
    upstream: URL,
    session: AsyncHTTPClientSession,
    halveAt: Double? = nil,
    workers: Int,
    halvedWorkers: Int
) async throws -> RunResult {
    try await setWorkers(workers, upstream: upstream, session: session)
    let engine = limiting.engine(over: session)
    let record = RunRecord()
    let clock = ContinuousClock()
    let start = clock.now
    var random = SplitMix64(seed: seed)
    let workURL = upstream.appendingPathComponent("work")

    // The limit, read off the engine every 50 ms while the run lasts.
    let sampler = Task {
        var limits: [LimitSample] = []
        while !Task.isCancelled {
            let now = (clock.now - start).seconds
            let adaptive = engine.adaptiveConcurrencyLimiter(for: workURL)
            let limit: Int? =
                switch limiting {
                case .none: nil
                case .fixed(let limit): limit
                case .gradient, .aimd: adaptive?.currentLimit ?? AdaptiveConcurrencyLimiter.Configuration().initialLimit
                }
            let inFlight = record.outstanding.load(ordering: .relaxed)
            limits.append(LimitSample(time: now, limit: limit, inFlight: inFlight, waiting: adaptive?.waiting ?? 0))
            try? await Task.sleep(for: .milliseconds(50))
        }
        return limits
    }

    await withDiscardingTaskGroup { group in
        var arrival = 0.0
        var index = 0
        var halved = false
        while true {
            // Exponential gaps: a Poisson process at `rate`.
            arrival += -log(1 - Double.random(in: 0..<1, using: &random)) / rate
            guard arrival < duration else { break }
            let due = start + .seconds(arrival)
            try? await clock.sleep(until: due)
            if let halveAt, !halved, arrival >= halveAt {
                halved = true
                try? await setWorkers(halvedWorkers, upstream: upstream, session: session)
            }
            index += 1
            let request = Work(url: workURL.appendingPathComponent(String(index)))
            let scheduled = arrival
            group.addTask {
                record.outstanding.add(1, ordering: .relaxed)
                let outcome: Outcome
                do {
                    let (_, response) = try await engine.response(for: request)
                    outcome = response.statusCode == 200 ? .ok : response.statusCode == 503 ? .busy : .other
                } catch NetworkError.limited {
                    outcome = .limited
                } catch NetworkError.timedOut {
                    outcome = .timedOut
                } catch {
                    outcome = .other
                }
                record.outstanding.subtract(1, ordering: .relaxed)
                let latency = (clock.now - due).seconds
                record.samples.withLock { $0.append(Sample(arrival: scheduled, latency: latency, outcome: outcome)) }
            }
        }
    }
    sampler.cancel()
    let limits = await sampler.value
    return RunResult(limiting: limiting, load: load, samples: record.samples.withLock { $0 }, limits: limits)
}

/// What the run's requests write as they end.
final class RunRecord: Sendable {
    let samples = Mutex<[Sample]>([])
    /// Requests sent and not yet answered.
    let outstanding = Atomic<Int>(0)
}

func setWorkers(_ count: Int, upstream: URL, session: AsyncHTTPClientSession) async throws {
    var request = HTTPClientRequest(url: upstream.appendingPathComponent("workers/\(count)").absoluteString)
    request.method = .POST
    let response = try await session.client.execute(request, timeout: .seconds(5))
    _ = try await response.body.collect(upTo: 1 << 16)
    guard response.status == .ok else { throw OverloadBenchmarkFailure.upstreamRefused(Int(response.status.code)) }
}

enum OverloadBenchmarkFailure: Error {
    case upstreamRefused(Int)
    case upstreamDidNotStart(String)
}

extension Duration {
    var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
