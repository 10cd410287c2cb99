import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// How a route answers.
enum LoopbackRoute {
    /// The Nth request gets `responses[N]`; past the end, the last one repeats.
    case scripted([LoopbackResponse], served: Int)
    case handler(@Sendable (LoopbackRequest) -> LoopbackResponse)
}

/// What a `waitFor...` call is waiting for.
enum LoopbackWaitCondition {
    case hits(path: String?, atLeast: Int)
    case openConnections(atMost: Int)
    /// `bytesSent >= count`, or `openConnections <= limit` (whichever comes first).
    case bytesSent(atLeast: Int, orOpenConnectionsAtMost: Int)
}

/// Cross-thread commands for the event loop, taken in one go.
struct LoopbackLoopCommands {
    var releases: [Int] = []
    var shutdown = false
}

/// Everything shared between the server's public API (any thread) and its event-loop thread.
/// Only ever accessed through `LoopbackServerState.withLock`.
struct LoopbackServerFields {
    var routes: [String: LoopbackRoute] = [:]
    /// The newest requests, oldest first: at most `2 × logLimit` held, the newest `logLimit` shown
    /// (trimmed in halves, so recording stays O(1) amortized).
    var log: [LoopbackRequest] = []
    var logLimit = LoopbackHTTPServer.defaultRequestLogLimit
    var hitsByPath: [String: Int] = [:]
    var totalHits = 0

    /// Held responses not yet released: held id -> request path.
    var held: [Int: String] = [:]
    var nextHeldID = 0
    /// Released held ids the loop has not picked up yet.
    var pendingReleases: [Int] = []
    /// Set while the loop is between recording a request and registering its handler's response:
    /// waiters are not considered satisfied then, so a `waitForHits` caller always sees the
    /// request's held response in `heldCount`/`releaseHeld`.
    var isSettlingRequest = false

    var openConnections = 0
    var peakOpenConnections = 0
    var acceptedConnections = 0
    /// Bytes written to clients (heads and bodies), counted as the kernel accepts them.
    var bytesSent = 0

    var shutdownRequested = false
    var loopExited = false
    var loopThread: pthread_t?

    var waiters = WaiterList<Void, LoopbackWaitCondition>()

    /// Whether `path` matches `pattern`: equal to it, or, when `pattern` ends with `*`, starting
    /// with what precedes the `*` (the same rule as route keys).
    static func path(_ path: String, matches pattern: String) -> Bool {
        pattern.hasSuffix("*") ? path.hasPrefix(pattern.dropLast()) : path == pattern
    }

    /// Requests whose path matches `pattern`.
    func hits(matching pattern: String) -> Int {
        guard pattern.hasSuffix("*") else { return hitsByPath[pattern, default: 0] }
        return hitsByPath.reduce(0) { $0 + (Self.path($1.key, matches: pattern) ? $1.value : 0) }
    }

    /// Held responses whose request path matches `pattern` (all when `nil`).
    func heldCount(matching pattern: String?) -> Int {
        guard let pattern else { return held.count }
        return held.values.reduce(0) { $0 + (Self.path($1, matches: pattern) ? 1 : 0) }
    }

    /// The route key that serves `path`: an exact key first, else the longest matching "prefix*" key.
    func routeKey(for path: String) -> String? {
        if routes[path] != nil { return path }
        var best: String?
        var bestLength = -1
        for key in routes.keys where key.hasSuffix("*") {
            let prefix = key.dropLast()
            if prefix.count > bestLength && path.hasPrefix(prefix) {
                best = key
                bestLength = prefix.count
            }
        }
        return best
    }

    /// Advances the scripted route serving `path` and returns its response (404 when none applies).
    mutating func nextScriptedResponse(for path: String) -> LoopbackResponse {
        guard let key = routeKey(for: path), case .scripted(let responses, let served) = routes[key],
            let last = responses.last
        else { return LoopbackResponse(status: 404) }
        routes[key] = .scripted(responses, served: min(served + 1, responses.count))
        return served < responses.count ? responses[served] : last
    }

    func isSatisfied(_ condition: LoopbackWaitCondition) -> Bool {
        if loopExited { return true }
        switch condition {
        case .hits(let path, let count):
            guard !isSettlingRequest else { return false }
            if let path { return hits(matching: path) >= count }
            return totalHits >= count
        case .openConnections(let limit):
            return openConnections <= limit
        case .bytesSent(let count, let limit):
            return bytesSent >= count || openConnections <= limit
        }
    }

    /// Removes and returns every waiter whose condition now holds.
    mutating func takeSatisfiedWaiters() -> [WaiterList<Void, LoopbackWaitCondition>.Waiter] {
        guard !waiters.isEmpty else { return [] }
        let now = self
        return waiters.takeAll { now.isSatisfied($0) }
    }
}

/// The lock around `LoopbackServerFields`.
///
/// `@unchecked Sendable` is safe because `fields` is private and read or written only inside
/// `withLock` (or the shutdown wait), i.e. while holding `condition`, an `NSCondition` that is
/// also a mutex. Continuations are resumed after the lock is released.
final class LoopbackServerState: StateLock, @unchecked Sendable {
    private let condition = NSCondition()
    private var fields = LoopbackServerFields()

    func withLock<T>(_ body: (inout LoopbackServerFields) throws -> T) rethrows -> T {
        condition.lock()
        defer { condition.unlock() }
        return try body(&fields)
    }

    // MARK: Waiting (any thread)

    /// Returns once `condition` holds, the server has shut down, or the calling task is cancelled.
    func wait(for waitCondition: LoopbackWaitCondition) async {
        await wait(on: \.waiters, tag: waitCondition, cancelled: ()) { fields in
            fields.isSatisfied(waitCondition) ? () : nil
        }
    }

    // MARK: Commands (any thread)

    /// Releases the held responses registered right now (for `path`, or all when `nil`).
    func releaseHeld(path: String?, wake: LoopbackWakePipe) {
        withLock { fields in
            let ids = fields.held.compactMap { id, heldPath -> Int? in
                guard let path else { return id }
                return LoopbackServerFields.path(heldPath, matches: path) ? id : nil
            }
            guard !ids.isEmpty else { return }
            for id in ids { fields.held.removeValue(forKey: id) }
            fields.pendingReleases.append(contentsOf: ids.sorted())
            if !fields.shutdownRequested { wake.signal() }
        }
    }

    /// Asks the loop to stop and waits until it has closed every socket, unless called on the loop
    /// thread itself (from a handler), where waiting would deadlock: the loop then stops right after
    /// the current iteration.
    func shutdown(wake: LoopbackWakePipe) {
        condition.lock()
        defer { condition.unlock() }
        if !fields.shutdownRequested {
            fields.shutdownRequested = true
            wake.signal()
        }
        if let loopThread = fields.loopThread, pthread_equal(loopThread, pthread_self()) != 0 { return }
        while !fields.loopExited {
            condition.wait()
        }
    }

    // MARK: Loop thread

    func loopStarted() {
        withLock { $0.loopThread = pthread_self() }
    }

    func takeCommands() -> LoopbackLoopCommands {
        withLock { fields in
            defer { fields.pendingReleases.removeAll() }
            return LoopbackLoopCommands(releases: fields.pendingReleases, shutdown: fields.shutdownRequested)
        }
    }

    /// What the first lock section of `respond(to:)` decided.
    private enum Resolution {
        case scripted(LoopbackResponse, heldID: Int?)
        case handler(@Sendable (LoopbackRequest) -> LoopbackResponse)
    }

    /// Records a fully parsed request and produces its response; returns the held id when the
    /// response is held. A handler runs outside the lock, after the request is already in the log.
    func respond(to request: LoopbackRequest) -> (response: LoopbackResponse, heldID: Int?) {
        let resolution = withLock { fields -> Resolution in
            fields.log.append(request)
            // `count - logLimit >= logLimit` is `count >= 2 × logLimit` without the overflow a
            // limit of `.max` (keep everything) would trap on.
            if fields.log.count - fields.logLimit >= fields.logLimit {
                fields.log.removeFirst(fields.log.count - fields.logLimit)
            }
            fields.hitsByPath[request.path, default: 0] += 1
            fields.totalHits += 1
            if let key = fields.routeKey(for: request.path), case .handler(let handler) = fields.routes[key] {
                fields.isSettlingRequest = true
                return .handler(handler)
            }
            let response = fields.nextScriptedResponse(for: request.path)
            return .scripted(response, heldID: fields.registerIfHeld(response, path: request.path))
        }
        switch resolution {
        case .scripted(let response, let heldID):
            resumeSatisfiedWaiters()
            return (response, heldID)
        case .handler(let handler):
            let response = handler(request)
            let heldID = withLock { fields -> Int? in
                fields.isSettlingRequest = false
                return fields.registerIfHeld(response, path: request.path)
            }
            resumeSatisfiedWaiters()
            return (response, heldID)
        }
    }

    func connectionOpened() {
        withLock { fields in
            fields.acceptedConnections += 1
            fields.openConnections += 1
            fields.peakOpenConnections = max(fields.peakOpenConnections, fields.openConnections)
        }
    }

    /// Counts a closed connection and forgets the held responses that died with it.
    /// Counts bytes the kernel accepted for a client; wakes a `bytesSent` waiter that now holds.
    func sent(_ count: Int) {
        let ready = withLock { fields in
            fields.bytesSent += count
            return fields.takeSatisfiedWaiters()
        }
        for waiter in ready { waiter.resume(returning: ()) }
    }

    func connectionClosed(droppingHeld heldIDs: [Int]) {
        let ready = withLock { fields in
            fields.openConnections -= 1
            for id in heldIDs { fields.held.removeValue(forKey: id) }
            return fields.takeSatisfiedWaiters()
        }
        for waiter in ready { waiter.resume(returning: ()) }
    }

    /// Marks the loop as gone (every socket is closed) and wakes every waiter and `shutdown` caller.
    func loopFinished() {
        let ready = withLock { fields in
            fields.held.removeAll()
            fields.pendingReleases.removeAll()
            fields.openConnections = 0
            fields.loopExited = true
            condition.broadcast()
            return fields.waiters.takeAll()
        }
        for waiter in ready { waiter.resume(returning: ()) }
    }

    private func resumeSatisfiedWaiters() {
        let ready = withLock { $0.takeSatisfiedWaiters() }
        for waiter in ready { waiter.resume(returning: ()) }
    }
}

extension LoopbackServerFields {
    /// Registers `response` as held (so `heldCount` and `releaseHeld` see it) and returns its id.
    mutating func registerIfHeld(_ response: LoopbackResponse, path: String) -> Int? {
        guard response.isHeld else { return nil }
        nextHeldID += 1
        held[nextHeldID] = path
        return nextHeldID
    }
}
