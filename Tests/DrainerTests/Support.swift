import Foundation
import OfflineQueue
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import Drainer

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

struct Mutation: QueueableRequest {
    var url: URL
    var method: HTTPMethod = .post
    var body: Data? = Data("{}".utf8)
    var timeout: TimeInterval = .infinity

    init(_ path: String, base: URL = URL(string: "https://api.example.test")!) {
        url = base.appendingPathComponent(path)
    }
}

/// A queue on a scripted session, a manual clock and a manual monitor, and a drain service over it.
struct DrainHarness {
    let directory = TemporaryDirectory()
    let clock = ManualClock()
    let session: ScriptedNetworkSession
    let monitor: ManualReachabilityMonitor
    let queue: OfflineQueueEngine
    let service: DrainService
    let reports: StreamCollector<DrainCycleReport>

    init(
        _ steps: [ScriptedNetworkSession.Step],
        connected: Bool = true,
        interval: Duration = .seconds(60),
        cycleBudget: Duration = .seconds(10),
        jitter: Double = 0,
        backoff: DrainService.Backoff = .init(),
        randomUnit: (@Sendable () -> Double)? = nil
    ) async throws {
        session = ScriptedNetworkSession(steps)
        monitor = ManualReachabilityMonitor(isConnected: connected)
        queue = OfflineQueueEngine(
            // The engine keeps the real clock (requests have no timeout anyway): only the service's
            // timers sleep on the manual clock, so `nextDeadline` is the service's. The queue gets
            // the manual clock too, for its dates (TTL, reports); it is not started, so it sets no
            // timers.
            requestEngine: AsyncRequestEngine(session: session, retryPolicy: NoRetryPolicy()),
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: directory.url),
            // An entry that failed transiently is due again after 1 s: always by the next cycle.
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 1)),
            clock: clock
        )
        service = DrainService(
            queue: queue, interval: interval, cycleBudget: cycleBudget, jitter: jitter, backoff: backoff,
            clock: clock, randomUnit: randomUnit ?? { Double.random(in: 0..<1) }
        )
        reports = StreamCollector(await service.reports)
    }

    /// Stores `count` entries without sending them.
    @discardableResult
    func enqueue(_ count: Int) async throws -> [UUID] {
        var ids: [UUID] = []
        for index in 0..<count {
            let result = try await queue.enqueue(Mutation("items/\(index)"), sending: .onNextDrain)
            ids.append(try #require(result.queuedID))
        }
        return ids
    }

    /// The delay from now until the earliest sleeper on the clock (the service's wait between
    /// cycles when no cycle runs), waiting for a sleeper first.
    func sleeperDelay() async -> Duration? {
        await clock.waitForSleepers(1)
        return clock.nextDeadline.map { clock.now.duration(to: $0) }
    }

    /// The `n`th report (1-based), waiting for it.
    func report(_ n: Int) async -> DrainCycleReport? {
        await reports.wait(for: n)
        let items = reports.items
        return items.count >= n ? items[n - 1] : nil
    }

    /// Starts a queue flush whose send is held (its script's first step must be `.held`), then the
    /// service, whose first cycle must wait for that pass; returns the flush once the cycle's budget
    /// timer runs.
    func startBehindAHeldFlush() async -> Task<FlushReport, Never> {
        let flush = Task { await queue.flush() }
        await session.waitForCalls(1)
        await service.start()
        await clock.waitForSleepers(1)
        return flush
    }

    var sentKeys: [String?] { session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") } }
}
