import Foundation
import Testing
import Retry
import RequestEngine
import OfflineQueue
import ResilienceTesting
@testable import Drainer
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A fresh folder under the system temp directory, removed when the value is deinitialised.
final class TemporaryDirectory: Sendable {
    let url: URL
    init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-drain-\(UUID().uuidString)", isDirectory: true)
    }
    deinit { try? FileManager.default.removeItem(at: url) }
}

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
    let reports: Collector<DrainCycleReport>

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
        reports = Collector(await service.reports)
    }

    /// Stores `count` entries without sending them.
    @discardableResult
    func enqueue(_ count: Int) async throws -> [UUID] {
        var ids: [UUID] = []
        for index in 0..<count {
            let result = try await queue.enqueue(Mutation("items/\(index)"), attemptFirst: false)
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

    var sentKeys: [String?] { session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") } }
}

/// Collects an async stream's elements and lets a test wait for a number of them.
final class Collector<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        var waiters: [(id: UUID, count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var cancelled: Set<UUID> = []
        var finished = false
    }
    private let state = Locked(State())
    private let task: Task<Void, Never>

    init(_ stream: AsyncStream<Element>) {
        let state = self.state
        task = Task {
            for await item in stream {
                let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.items.append(item)
                    let count = state.items.count
                    let ready = state.waiters.filter { $0.count <= count }.map(\.continuation)
                    state.waiters.removeAll { $0.count <= count }
                    return ready
                }
                for continuation in ready { continuation.resume() }
            }
            // The stream ended: nobody waits for more.
            let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.finished = true
                defer { state.waiters.removeAll() }
                return state.waiters.map(\.continuation)
            }
            for continuation in waiting { continuation.resume() }
        }
    }

    deinit { task.cancel() }

    var items: [Element] { state.withLock { $0.items } }

    /// Suspends until `count` elements arrived, the stream ended, or the waiting task is cancelled.
    func wait(for count: Int) async {
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if state.items.count >= count || state.finished || state.cancelled.remove(id) != nil { return true }
                    state.waiters.append((id, count, continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else {
                    state.cancelled.insert(id)
                    return nil
                }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume()
        }
    }
}
