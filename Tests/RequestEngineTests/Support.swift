import Foundation
import RequestEngine
import Retry
import ResilienceCore
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A request for tests. The timeout defaults to infinity so that only backoff sleeps sit on the
/// ManualClock (a finite timeout adds a timer sleeper per attempt).
struct TestRequest: NetworkRequest {
    var url: URL
    var method: HTTPMethod = .get
    var headers: [String: String] = [:]
    var body: Data? = nil
    var timeout: TimeInterval = .infinity
    var maximumResponseBodySize: Int? = nil

    init(_ path: String = "/resource", method: HTTPMethod = .get, headers: [String: String] = [:], body: Data? = nil, timeout: TimeInterval = .infinity) {
        url = URL(string: "https://api.example.test\(path)")!
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
    }

    init(url: URL, method: HTTPMethod = .get, headers: [String: String] = [:], timeout: TimeInterval = .infinity) {
        self.url = url
        self.method = method
        self.headers = headers
        self.timeout = timeout
    }
}

/// Records events and lets a test wait until a condition over them holds.
final class EventRecorder: RequestEventSink {
    private struct Watcher {
        let id: UUID
        let predicate: @Sendable ([RequestEvent]) -> Bool
        let continuation: CheckedContinuation<Void, Never>
    }
    private struct State {
        var events: [RequestEvent] = []
        var watchers: [Watcher] = []
        var cancelled: Set<UUID> = []
    }
    private let state = Locked(State())

    var events: [RequestEvent] { state.withLock { $0.events } }

    func record(_ event: RequestEvent) async {
        let ready = state.withLock { state -> [Watcher] in
            state.events.append(event)
            let events = state.events
            let ready = state.watchers.filter { $0.predicate(events) }
            state.watchers.removeAll { $0.predicate(events) }
            return ready
        }
        for watcher in ready { watcher.continuation.resume() }
    }

    /// Suspends until `predicate` holds for the events recorded so far (or the test is cancelled).
    func wait(until predicate: @escaping @Sendable ([RequestEvent]) -> Bool) async {
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if predicate(state.events) || state.cancelled.remove(id) != nil { return true }
                    state.watchers.append(Watcher(id: id, predicate: predicate, continuation: continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let watcher = state.withLock { state -> Watcher? in
                guard let index = state.watchers.firstIndex(where: { $0.id == id }) else {
                    state.cancelled.insert(id)
                    return nil
                }
                return state.watchers.remove(at: index)
            }
            watcher?.continuation.resume()
        }
    }

    func waitForDeduplicated(_ count: Int) async {
        await wait { events in events.filter(\.isDeduplicated).count >= count }
    }

    /// Suspends until a `failed` event has been recorded.
    func waitForFailed() async {
        await wait { events in events.contains(where: \.isFailed) }
    }

    /// A compact rendering for assertions: "started", "retry(0,1.0)", "succeeded(200,1)", "failed(HTTP 503…,2)", "dedup".
    var timeline: [String] {
        events.map { event in
            switch event {
            case .started: return "started"
            case .retryScheduled(_, let attempt, let delay): return "retry(\(attempt),\(delay))"
            case .succeeded(_, let status, _, let attempt): return "succeeded(\(status),\(attempt))"
            case .failed(_, let error, let attempt): return "failed(\(error),\(attempt))"
            case .deduplicated: return "dedup"
            }
        }
    }
}

extension RequestEvent {
    var isDeduplicated: Bool {
        if case .deduplicated = self { return true }
        return false
    }

    var isFailed: Bool {
        if case .failed = self { return true }
        return false
    }
}

/// A policy that returns whatever it was given, for hostile-delay tests.
struct ListPolicy: RetryPolicy {
    let delays: [TimeInterval]
    func delay(forAttempt attempt: Int) -> TimeInterval? {
        attempt < delays.count ? delays[attempt] : nil
    }
}

/// Runs `body` and returns the NetworkError it throws (nil if it succeeded or threw something else).
func networkError(_ body: () async throws -> Void) async -> NetworkError? {
    do {
        try await body()
        return nil
    } catch let error as NetworkError {
        return error
    } catch {
        return nil
    }
}

extension NetworkError {
    /// A stable name of the case for equality checks in tests.
    var caseName: String {
        switch self {
        case .httpError(let status, _): return "httpError(\(status))"
        case .noConnection: return "noConnection"
        case .timedOut: return "timedOut"
        case .cancelled: return "cancelled"
        case .transport(let failure): return "transport(\(failure.rawValue))"
        case .invalidResponse: return "invalidResponse"
        case .circuitOpen: return "circuitOpen"
        case .invalidRequest: return "invalidRequest"
        case .responseTooLarge(let limit, _): return "responseTooLarge(\(limit))"
        case .underlying: return "underlying"
        }
    }
}

/// A TCP port on 127.0.0.1 that is bound but not listening: connections to it are refused for as
/// long as this value lives.
final class RefusingPort: Sendable {
    struct Failure: Error {}
    let port: Int
    private let descriptor: Int32

    init() throws {
        #if canImport(Glibc)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
        let fd = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Failure() }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw -> Bool in
                bind(fd, raw, length) == 0 && getsockname(fd, raw, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw Failure()
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(descriptor) }
}

/// A task executor with one dedicated thread. Latency tests run their caller on it, so what they
/// measure is the engine's promptness and not how long Swift's shared cooperative pool (two
/// threads here) takes to get to a resumed task while other suites run thousands of tasks.
final class DedicatedThreadExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked Sendable: `jobs` and `stopped` are only touched with `condition` locked.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var stopped = false

    init(name: String) {
        let thread = Thread { [self] in run() }
        thread.name = name
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        condition.lock()
        jobs.append(unowned)
        condition.signal()
        condition.unlock()
    }

    /// Lets the thread end once its queue is empty.
    func shutdown() {
        condition.lock()
        stopped = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopped { condition.wait() }
            if jobs.isEmpty && stopped {
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
