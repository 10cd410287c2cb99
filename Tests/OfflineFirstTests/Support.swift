import Foundation
import OfflineQueue
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import ResponseCache
import Testing

@testable import OfflineFirst

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A notes server for logic tests: `GET /notes` answers the list as JSON (`max-age=60`),
/// `POST /notes` appends its body once per `Idempotency-Key` (201), `DELETE /notes/<text>`
/// removes a note. It can reject the next writes, and hold reads until released.
final class NotesOrigin: NetworkSession {
    private struct State: Sendable {
        var notes: [String]
        var seenKeys: Set<String> = []
        var rejectWrites: Int?
        var holdReads = false
        var heldReads: [Gate] = []
        var holdWrites = false
        var heldWrites: [Gate] = []
        var failReads = false
        var readsAnswer503 = false
        var reads = 0
        var writes = 0
    }

    private let state: Locked<State>

    init(notes: [String] = []) { state = Locked(State(notes: notes)) }

    var notes: [String] { state.withLock { $0.notes } }
    var reads: Int { state.withLock { $0.reads } }
    var writes: Int { state.withLock { $0.writes } }
    var heldReadCount: Int { state.withLock { $0.heldReads.count } }

    /// Writes answer this status (for good) until set to nil.
    func rejectWrites(with status: Int?) { state.withLock { $0.rejectWrites = status } }

    /// While on, reads wait (after reading the list) until `releaseReads()`.
    func holdReads(_ on: Bool) { state.withLock { $0.holdReads = on } }

    func releaseReads() {
        for gate in state.withLock({ state -> [Gate] in
            defer { state.heldReads = [] }; return state.heldReads
        }) { gate.open() }
    }

    /// Waits until `count` reads are held (or the test's time limit cancels it).
    func waitForHeldReads(_ count: Int) async {
        while heldReadCount < count, !Task.isCancelled { await Task.yield() }
    }

    /// While on, writes wait (before they take effect) until `releaseWrites()`.
    func holdWrites(_ on: Bool) { state.withLock { $0.holdWrites = on } }

    func releaseWrites() {
        for gate in state.withLock({ state -> [Gate] in
            defer { state.heldWrites = [] }; return state.heldWrites
        }) { gate.open() }
    }

    func waitForHeldWrites(_ count: Int) async {
        while state.withLock({ $0.heldWrites.count }) < count, !Task.isCancelled { await Task.yield() }
    }

    /// While on, reads fail as a refused connection would.
    func failReads(_ on: Bool) { state.withLock { $0.failReads = on } }

    /// While on, reads are answered 503 (a proxy's error page).
    func failReadsWith503(_ on: Bool) { state.withLock { $0.readsAnswer503 = on } }

    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        guard let url = request.url else { throw URLError(.badURL) }
        let method = request.httpMethod ?? "GET"
        if method == "GET" {
            if state.withLock({ $0.failReads }) { throw URLError(.cannotConnectToHost) }
            if state.withLock({ $0.readsAnswer503 }) {
                return (Data("<html>down</html>".utf8), HTTPURLResponse(url: url, statusCode: 503, httpVersion: "HTTP/1.1", headerFields: [:])!)
            }
            let (body, gate) = state.withLock { state -> (Data, Gate?) in
                state.reads += 1
                let body = Notes.encode(state.notes)
                guard state.holdReads else { return (body, nil) }
                let gate = Gate()
                state.heldReads.append(gate)
                return (body, gate)
            }
            if let gate { await gate.wait() }
            try Task.checkCancellation()
            return (body, HTTPURLResponse(url: url, statusCode: 200, httpVersion: "HTTP/1.1", headerFields: ["Cache-Control": "max-age=60", "Content-Type": "application/json"])!)
        }
        let writeGate = state.withLock { state -> Gate? in
            guard state.holdWrites else { return nil }
            let gate = Gate()
            state.heldWrites.append(gate)
            return gate
        }
        if let writeGate { await writeGate.wait() }
        let status = state.withLock { state -> Int in
            state.writes += 1
            if let reject = state.rejectWrites { return reject }
            let key = request.value(forHTTPHeaderField: "Idempotency-Key") ?? UUID().uuidString
            guard state.seenKeys.insert(key).inserted else { return 201 }
            let text = String(decoding: request.httpBody ?? Data(), as: UTF8.self)
            if method == "POST" { state.notes.append(text) }
            if method == "DELETE" { state.notes.removeAll { $0 == url.lastPathComponent } }
            return 201
        }
        return (Data(), HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: [:])!)
    }
}

enum Notes {
    static func encode(_ notes: [String]) -> Data { (try? JSONEncoder().encode(notes)) ?? Data() }
    static func decode(_ data: Data?) -> [String]? { data.flatMap { try? JSONDecoder().decode([String].self, from: $0) } }
}

struct NotesList: NetworkRequest {
    var url = URL(string: "https://notes.example.test/notes")!
    var method: HTTPMethod { .get }
    var timeout: TimeInterval = .infinity
}

struct CreateNote: QueueableRequest {
    let text: String
    var url = URL(string: "https://notes.example.test/notes")!
    var method: HTTPMethod { .post }
    var body: Data? { Data(text.utf8) }
    var timeout: TimeInterval = .infinity
    var ttl: TimeInterval = 86_400
    var orderingKey: String?
    var coalescingKey: String?
    var idempotencyKey: String = UUID().uuidString

    init(_ text: String, orderingKey: String? = nil, coalescingKey: String? = nil) {
        self.text = text
        self.orderingKey = orderingKey
        self.coalescingKey = coalescingKey
    }
}

/// A note created offline appears at the end of the list until the server has it.
let appendNote = OptimisticUpdate(
    mutations: { $0.method == "POST" && $0.url.path == "/notes" },
    reads: { $0.path == "/notes" },
    apply: { current, pending in
        Notes.encode((Notes.decode(current) ?? []) + [String(decoding: pending.body ?? Data(), as: UTF8.self)])
    }
)

/// The whole stack on a manual clock, a manual monitor and a fake origin (`NotesOrigin`, or the
/// `session` given, e.g. a `ScriptedNetworkSession`).
final class OfflineFirstHarness: Sendable {
    let directory = TemporaryDirectory()
    let clock = ManualClock()
    let origin: NotesOrigin
    let monitor: ManualReachabilityMonitor
    let cache: DiskResponseCache
    let store: DiskQueueStore
    let queue: OfflineQueueEngine
    let reads: CachedRequestEngine
    let client: OfflineFirstClient

    init(
        notes: [String] = [], session: (any NetworkSession)? = nil, connected: Bool = true, updates: [OptimisticUpdate] = [appendNote], invalidations: [Invalidation] = [],
        configuration: OfflineQueueEngine.Configuration = .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
        startsQueue: Bool = false, queueStorage: (any QueueStorage)? = nil
    ) throws {
        origin = NotesOrigin(notes: notes)
        monitor = ManualReachabilityMonitor(isConnected: connected)
        cache = try DiskResponseCache(directory: directory.url.appendingPathComponent("cache"), maxBytes: 1 << 20)
        store = try DiskQueueStore(directory: directory.url.appendingPathComponent("queue"))
        let engine = AsyncRequestEngine(session: session ?? origin, clock: clock)
        // `queueStorage`, when given, stands in for the disk store (which is then left unused).
        let storage: any QueueStorage = queueStorage ?? store
        queue = OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: storage, configuration: configuration, clock: clock)
        reads = CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor, clock: clock)
        // Most tests drive the queue's passes (flush) themselves: it is not started for them unless
        // they ask (`startsQueue: true`, what the public initializer does).
        client = OfflineFirstClient(reads: reads, queue: queue, optimisticUpdates: updates, invalidations: invalidations, startsQueue: startsQueue)
    }
}

/// Reads a live stream from a task of its own; the test takes its snapshots one by one.
final class SnapshotReader: Sendable {
    private let log = Log<QuerySnapshot>()
    private let task: Task<Void, Never>

    init(_ stream: AsyncThrowingStream<QuerySnapshot, any Error>) {
        let log = self.log
        task = Task {
            do {
                for try await snapshot in stream { log.append(snapshot) }
            } catch {}
        }
    }

    var all: [QuerySnapshot] { log.values }
    var latest: QuerySnapshot? { log.values.last }
    var notes: [[String]] { log.values.map { Notes.decode($0.data) ?? [] } }

    /// Waits until the latest snapshot satisfies `condition`; when the test's time limit cancels
    /// the wait first, records an issue and returns what there is, so a stuck read fails its test
    /// instead of hanging the run.
    @discardableResult
    func waitFor(_ condition: (QuerySnapshot) -> Bool, sourceLocation: SourceLocation = #_sourceLocation) async -> QuerySnapshot {
        while true {
            if let latest = log.values.last, condition(latest) { return latest }
            if Task.isCancelled {
                Issue.record(
                    "the snapshot never came: \(log.values.map { "\(Notes.decode($0.data) ?? []) \($0.source) settling \($0.settlingEntryIDs.count) pending \($0.pendingEntryIDs.count) fetching \($0.isFetching) stale \($0.isStale) error \(String(describing: $0.lastFetchError))" })",
                    sourceLocation: sourceLocation)
                return log.values.last ?? QuerySnapshot.empty
            }
            await Task.yield()
        }
    }

    func cancel() async {
        task.cancel()
        await task.value
    }

    /// Returns once the stream has ended by itself (nothing cancels it here).
    func waitUntilFinished() async {
        await task.value
    }
}

extension QuerySnapshot {
    static let empty = QuerySnapshot(
        data: nil, response: nil, source: .overlayOnly, isStale: false, pendingEntryIDs: [], conflictedEntryIDs: [], settlingEntryIDs: [],
        rejectedWrites: [], overlayFailures: [], isPaused: false, isFetching: false, lastFetchError: nil
    )
}

/// The list of notes at `url` (integration tests: a real server).
struct NotesRead: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
    var timeout: TimeInterval = 10
}

/// A note posted to `url`.
struct NewNote: QueueableRequest {
    let url: URL
    let text: String
    var method: HTTPMethod { .post }
    var body: Data? { Data(text.utf8) }
    var timeout: TimeInterval = 10
}

/// The stack a process of the app opens on its folders (`queue`, `cache`): URLSession, a monitor
/// it drives. Public API only, so the exit tests that open it keep compiling as internals change.
struct NotesApp {
    let monitor: ManualReachabilityMonitor
    let queue: OfflineQueueEngine
    let cache: DiskResponseCache
    let client: OfflineFirstClient

    init(folder: String, connected: Bool) async throws {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        let engine = AsyncRequestEngine(session: URLSession(configuration: configuration))
        monitor = ManualReachabilityMonitor(isConnected: connected)
        let store = try await DiskQueueStore.open(directory: URL(fileURLWithPath: folder + "/queue"), lockTimeout: .seconds(10))
        queue = OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: store)
        cache = try DiskResponseCache(directory: URL(fileURLWithPath: folder + "/cache"), maxBytes: 1 << 20)
        let reads = CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor)
        client = OfflineFirstClient(reads: reads, queue: queue, optimisticUpdates: [appendNote])
    }
}
