import Foundation
import RequestEngine
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A request for tests; the timeout defaults to infinity, so that only backoff sleeps sit on a
/// test's ManualClock.
public struct TestRequest: NetworkRequest {
    public var url: URL
    public var method: RequestEngine.HTTPMethod
    public var headers: [String: String]
    public var body: Data?
    public var timeout: TimeInterval
    public var maximumResponseBodySize: Int?

    public init(
        url: URL,
        method: RequestEngine.HTTPMethod = .get,
        headers: [String: String] = [:],
        body: Data? = nil,
        timeout: TimeInterval = .infinity,
        maximumResponseBodySize: Int? = nil
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.maximumResponseBodySize = maximumResponseBodySize
    }
}

/// Runs `body` and returns the `NetworkError` it throws (nil if it succeeded or threw something else).
public func networkError(_ body: () async throws -> Void) async -> NetworkError? {
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
    /// A stable name of the case, for equality checks in tests.
    public var caseName: String {
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
        case .underlying(let error): return "underlying(\(error))"
        case .deadlineExceeded: return "deadlineExceeded"
        case .limited: return "limited"
        case .tooManyRedirects: return "tooManyRedirects"
        case .responseHeadersTooLarge: return "responseHeadersTooLarge"
        }
    }
}

/// Records the engine's events and lets a test wait until a condition over them holds.
public final class EventRecorder: RequestEventSink {
    private struct Waiter {
        let predicate: @Sendable ([RequestEvent]) -> Bool
        let continuation: CheckedContinuation<Void, Never>
    }
    private let state = Mutex<(events: [RequestEvent], waiters: [Waiter])>(([], []))

    public init() {}

    public var events: [RequestEvent] { state.withLock { $0.events } }

    public func record(_ event: RequestEvent) async {
        let ready = state.withLock { state -> [Waiter] in
            state.events.append(event)
            let events = state.events
            let ready = state.waiters.filter { $0.predicate(events) }
            state.waiters.removeAll { $0.predicate(events) }
            return ready
        }
        for waiter in ready { waiter.continuation.resume() }
    }

    /// Suspends until `predicate` holds for the events recorded so far.
    public func wait(until predicate: @escaping @Sendable ([RequestEvent]) -> Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let holds = state.withLock { state -> Bool in
                if predicate(state.events) { return true }
                state.waiters.append(Waiter(predicate: predicate, continuation: continuation))
                return false
            }
            if holds { continuation.resume() }
        }
    }

    public func waitForDeduplicated(_ count: Int) async {
        await wait { events in events.filter { if case .deduplicated = $0 { true } else { false } }.count >= count }
    }

    /// "started", "retry(0,1.0)", "succeeded(200,1)", "failed(<case>,2)", "dedup".
    public var timeline: [String] {
        events.map { event in
            switch event {
            case .started: return "started"
            case .retryScheduled(_, let attempt, let delay): return "retry(\(attempt),\(delay))"
            case .succeeded(_, let status, _, let attempt): return "succeeded(\(status),\(attempt))"
            case .failed(_, let error, let attempt): return "failed(\(error.caseName),\(attempt))"
            case .deduplicated: return "dedup"
            }
        }
    }
}

/// A plain-HTTP server on 127.0.0.1 that answers whatever arrives on a connection — a TLS
/// ClientHello included — with `400 Bad Request` and closes it, as an HTTP server does when a
/// client speaks TLS to it. (LoopbackHTTPServer waits for a request head that a ClientHello never
/// completes.) Stops accepting when released.
public final class PlainHTTPResponder: Sendable {
    public struct Failure: Error {}
    public let port: Int
    private let descriptor: Int32

    public init() throws {
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
        let listening = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw -> Bool in
                bind(fd, raw, length) == 0 && getsockname(fd, raw, &length) == 0 && listen(fd, 16) == 0
            }
        }
        guard listening else {
            close(fd)
            throw Failure()
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread {
            while true {
                let connection = accept(fd, nil, nil)
                guard connection >= 0 else { return }  // the listening socket was shut down
                var buffer = [UInt8](repeating: 0, count: 4096)
                _ = read(connection, &buffer, buffer.count)
                let reply = Array("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
                _ = write(connection, reply, reply.count)
                close(connection)
            }
        }
        thread.start()
    }

    deinit {
        shutdown(descriptor, Int32(SHUT_RDWR))
        close(descriptor)
    }
}
