import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

struct Mutation: QueueableRequest {
    var url: URL
    var method: HTTPMethod = .post
    var headers: [String: String] = [:]
    var body: Data? = nil
    var timeout: TimeInterval = .infinity
    var ttl: TimeInterval = 86_400
    var priority: QueuePriority = .normal
    var idempotencyKey: String = UUID().uuidString
    var orderingKey: String? = nil
    var coalescingKey: String? = nil
    var maximumResponseBodySize: Int? = nil
    var deadline: Duration? = nil

    init(_ path: String, priority: QueuePriority = .normal, body: String? = nil, base: URL = URL(string: "https://api.example.test")!) {
        url = base.appendingPathComponent(path)
        self.priority = priority
        self.body = body.map { Data($0.utf8) }
    }
}

/// A queue wired to a scripted session, a manual clock and a manual monitor.
struct QueueHarness {
    let directory = TemporaryDirectory()
    let clock = ManualClock()
    let session: ScriptedNetworkSession
    let monitor: ManualReachabilityMonitor
    let engine: OfflineQueueEngine
    let store: DiskQueueStore

    init(
        _ steps: [ScriptedNetworkSession.Step], connected: Bool = true, maxQueueSize: Int = 500,
        configuration: OfflineQueueEngine.Configuration = .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10))
    ) throws {
        session = ScriptedNetworkSession(steps)
        monitor = ManualReachabilityMonitor(isConnected: connected)
        store = try DiskQueueStore(directory: directory.url)
        engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock),
            reachabilityMonitor: monitor,
            store: store,
            maxQueueSize: maxQueueSize,
            configuration: configuration,
            clock: clock
        )
    }

    /// Paths the session was asked for, in order.
    var sentPaths: [String] { session.requests.compactMap { $0.url?.path } }
    var sentKeys: [String?] { session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") } }
}

extension QueueEntryResult {
    var name: String {
        switch self {
        case .delivered(_, let status): return "delivered(\(status))"
        case .failedPermanently(_, let status): return "failed(\(status.map(String.init) ?? "nil"))"
        case .keptForRetry(_, let error, let attempts, _): return "kept(\(error),\(attempts))"
        case .expired: return "expired"
        case .deadLettered(_, let attempts): return "dead(\(attempts))"
        }
    }
}

/// A one-thread I/O pool whose thread a test can hold, so the jobs submitted behind it wait: the
/// store's writes (`pool:`) or its deferred deletions (`removalPool:`), ordered against the rest.
struct HeldPool {
    let pool = BlockingIOPool(maxThreads: 1, name: "test.held")
    let gate = DispatchSemaphore(value: 0)
    let holding = Locked(false)

    /// Returns once the pool's only thread runs the blocker (so the next job waits behind it).
    func hold() async {
        pool.submit { [gate, holding] in
            holding.withLock { $0 = true }
            gate.wait()
        }
        while !holding.withLock({ $0 }) { await Task.yield() }
    }
    func release() { gate.signal() }
    /// Waits until `count` jobs wait behind the held thread.
    func waitForQueued(_ count: Int) async {
        while pool.queuedJobCount < count { await Task.yield() }
    }
}

extension TemporaryDirectory {
    /// The path of entry `id`'s file in a queue folder.
    func entryFile(_ id: UUID) -> String {
        url.appendingPathComponent("\(id.uuidString).json").path
    }
}
