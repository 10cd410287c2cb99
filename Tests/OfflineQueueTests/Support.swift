import Foundation
import Testing
import Retry
import RequestEngine
import ResilienceTesting
@testable import OfflineQueue
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A fresh folder under the system temp directory, removed when the value is deinitialised.
final class TemporaryDirectory: Sendable {
    let url: URL
    init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-queue-\(UUID().uuidString)", isDirectory: true)
    }
    deinit { try? FileManager.default.removeItem(at: url) }

    /// Names of files directly in the folder (no subfolders).
    var fileNames: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []).filter { name in
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path, isDirectory: &isDirectory)
            return !isDirectory.boolValue
        }.sorted()
    }
}

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

    init(_ steps: [ScriptedNetworkSession.Step], connected: Bool = true, maxQueueSize: Int = 500,
         configuration: OfflineQueueEngine.Configuration = .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10))) throws {
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

/// Collects results from a queue's stream and lets a test wait for a number of them.
final class ResultCollector: Sendable {
    private struct State {
        var results: [QueueEntryResult] = []
        var waiters: [(UUID, Int, CheckedContinuation<Void, Never>)] = []
        var cancelled: Set<UUID> = []
    }
    private let state = Locked(State())
    private let task: Task<Void, Never>

    init(_ stream: AsyncStream<QueueEntryResult>) {
        let state = self.state
        task = Task {
            for await result in stream {
                let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.results.append(result)
                    let count = state.results.count
                    let ready = state.waiters.filter { $0.1 <= count }.map(\.2)
                    state.waiters.removeAll { $0.1 <= count }
                    return ready
                }
                for continuation in ready { continuation.resume() }
            }
        }
    }

    deinit { task.cancel() }

    var results: [QueueEntryResult] { state.withLock { $0.results } }

    /// Suspends until `count` results arrived (or the test is cancelled).
    func wait(for count: Int) async {
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if state.results.count >= count || state.cancelled.remove(id) != nil { return true }
                    state.waiters.append((id, count, continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state.waiters.firstIndex(where: { $0.0 == id }) else {
                    state.cancelled.insert(id)
                    return nil
                }
                return state.waiters.remove(at: index).2
            }
            waiter?.resume()
        }
    }
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

/// Runs `body` and returns the error it throws.
func thrownError(_ body: () async throws -> Void) async -> (any Error)? {
    do {
        try await body()
        return nil
    } catch {
        return error
    }
}
