import Foundation
import Retry
import RequestEngine

// The published snippets, unchanged.
struct R: NetworkRequest { let url: URL; let method: HTTPMethod = .get }

public actor ConsoleSink: RequestEventSink {
    public private(set) var seen: [String] = []
    public init() {}
    public func record(_ event: RequestEvent) {
        switch event {
        case .started(let id, let url, let method): seen.append("started \(id) \(method.rawValue) \(url.path)")
        case .retryScheduled(let id, let attempt, let delay): seen.append("retry \(id) \(attempt) \(delay)")
        case .succeeded(let id, let status, let duration, _): seen.append("succeeded \(id) \(status) \(duration)")
        case .failed(let id, let error, _): seen.append("failed \(id) \(error)")
        case .deduplicated(let id, let url, _): seen.append("deduplicated \(id) \(url.path)")
        }
    }
}

/// What a snippet run observed, for the checker.
public enum SnippetOutcome: Equatable, Sendable {
    case ok(status: Int, bytes: Int)
    case httpError(statusCode: Int)
    case noConnection
    case cancelled
    case other(String)
}

public enum Snippets {
    /// `AsyncRequestEngine(retryPolicy:)` with `ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0)`,
    /// errors caught the published way.
    public static func fetch(_ url: URL, baseDelay: TimeInterval = 1.0) async -> SnippetOutcome {
        let engine = AsyncRequestEngine(retryPolicy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: baseDelay))
        return await send(R(url: url), on: engine)
    }

    /// `AsyncRequestEngine(eventSink:)`.
    public static func fetchObserved(_ url: URL, sink: ConsoleSink) async -> SnippetOutcome {
        let engine = AsyncRequestEngine(eventSink: sink)
        return await send(R(url: url), on: engine)
    }

    /// Many concurrent identical GETs through one engine.
    public static func fetchConcurrently(_ url: URL, callers: Int, sink: ConsoleSink) async -> [SnippetOutcome] {
        let engine = AsyncRequestEngine(eventSink: sink)
        return await withTaskGroup(of: SnippetOutcome.self) { group in
            for _ in 0..<callers { group.addTask { await send(R(url: url), on: engine) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
    }

    /// The README's "strategies beyond retry" engine, unchanged.
    public static func fetchGuarded(_ url: URL) async -> SnippetOutcome {
        var configuration = AsyncRequestEngine.Configuration()
        configuration.retry = .init(
            policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 0.2),
            budget: RetryBudget()                                       // hedges draw from it too
        )
        configuration.circuitBreaker = .perHost(CircuitBreakerRegistry()) // one breaker per host
        configuration.deadline = .seconds(5)                            // the whole request, retries included
        configuration.hedging = HedgingPolicy(delay: .milliseconds(150)) // a second copy after about the p95
        configuration.limits.concurrencyPerHost = 32                    // more wait in line, then .limited
        let guarded = AsyncRequestEngine(configuration: configuration)
        return await send(R(url: url), on: guarded)
    }

    /// The README's service engine (adaptive limits, retry throttling), unchanged.
    public static func fetchAsAService(_ url: URL) async -> SnippetOutcome {
        let service = AsyncRequestEngine(configuration: .init(
            retry: .init(
                policy: ExponentialRetryPolicy(maxRetries: 2, baseDelay: 0.1),
                throttling: RetryThrottling()                           // gRPC's: no retries while a host fails
            ),
            limits: .init(adaptiveConcurrencyPerHost: .init())          // the gradient, with tuned defaults
        ))
        return await send(R(url: url), on: service)
    }

    static func send(_ request: R, on engine: AsyncRequestEngine) async -> SnippetOutcome {
        do {
            let (data, response) = try await engine.send(request)
            return .ok(status: response.statusCode, bytes: data.count)
        } catch NetworkError.httpError(let statusCode, _) {
            return .httpError(statusCode: statusCode)
        } catch NetworkError.noConnection {
            return .noConnection
        } catch NetworkError.cancelled {
            return .cancelled
        } catch {
            return .other("\(error)")
        }
    }
}
