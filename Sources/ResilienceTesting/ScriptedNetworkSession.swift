import Foundation
import RequestEngine
import Retry
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A `NetworkSession` that answers from a script, for unit tests of engine logic without a network.
///
/// Call N gets `steps[N]`; once the script runs out, its last step repeats. Every request is
/// recorded. `.hang` and `.held` steps suspend the call until it is cancelled (they then throw
/// `URLError(.cancelled)`, as URLSession does) or, for `.held`, until `releaseHeld()`.
/// `releaseHeld()` releases every held call that has *started* (is counted in `callCount`), even one
/// that has not reached its suspension point yet, so `await waitForCalls(n); releaseHeld()` never races.
/// Integration tests use the real URLSession against `LoopbackHTTPServer` instead.
public final class ScriptedNetworkSession: NetworkSession {
    public enum Step: Sendable {
        /// An HTTP response.
        case respond(status: Int, headers: [String: String] = [:], body: Data = Data())
        /// The session throws this error (e.g. `URLError(.notConnectedToInternet)`).
        case fail(any Error)
        /// A response that is not an `HTTPURLResponse`.
        case nonHTTPResponse
        /// Never answers; ends only by cancellation.
        case hang
        /// Waits for `releaseHeld()`, then performs the wrapped step; cancellation ends it earlier.
        indirect case held(Step)

        /// 200 with a UTF-8 body.
        public static func ok(_ body: String = "", headers: [String: String] = [:]) -> Step {
            .respond(status: 200, headers: headers, body: Data(body.utf8))
        }
        /// A status with no body.
        public static func status(_ code: Int, headers: [String: String] = [:]) -> Step {
            .respond(status: code, headers: headers)
        }
        /// `URLError` with the given code.
        public static func urlError(_ code: URLError.Code) -> Step { .fail(URLError(code)) }
    }

    private struct Waiter: Sendable {
        let id: UInt64
        let continuation: CheckedContinuation<Bool, Never>  // true = released, false = cancelled
    }

    private struct CallWatcher: Sendable {
        let id: UInt64
        let count: Int
        let continuation: CheckedContinuation<Void, Never>
    }

    private struct State: Sendable {
        var steps: [Step]
        var requests: [URLRequest] = []
        var nextID: UInt64 = 0
        var suspended: [Waiter] = []
        var isHeld: [UInt64: Bool] = [:]   // suspended id -> releasable?
        var cancelledEarly: Set<UInt64> = []
        var releasedThrough: UInt64 = 0   // held calls with an id up to this one are released
        var watchers: [CallWatcher] = []
        var nextWatcher: UInt64 = 0
        var cancelledWatchers: Set<UInt64> = []
        var idleWaiters: [(UInt64, CheckedContinuation<Void, Never>)] = []
    }

    private let state: Locked<State>

    /// A session that plays `steps` in order, repeating the last one.
    public init(_ steps: [Step]) {
        state = Locked(State(steps: steps.isEmpty ? [.ok()] : steps))
    }

    /// Requests received so far, in order.
    public var requests: [URLRequest] { state.withLock { $0.requests } }
    /// Number of calls so far.
    public var callCount: Int { state.withLock { $0.requests.count } }
    /// Calls currently suspended in `.hang` or `.held`.
    public var suspendedCount: Int { state.withLock { $0.suspended.count } }

    /// Suspends until at least `count` calls have been made, or the waiting task is cancelled.
    public func waitForCalls(_ count: Int) async {
        let id = state.withLock { state -> UInt64 in
            state.nextWatcher += 1
            return state.nextWatcher
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if state.requests.count >= count || state.cancelledWatchers.remove(id) != nil { return true }
                    state.watchers.append(CallWatcher(id: id, count: count, continuation: continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let watcher = state.withLock { state -> CallWatcher? in
                guard let index = state.watchers.firstIndex(where: { $0.id == id }) else {
                    state.cancelledWatchers.insert(id)
                    return nil
                }
                return state.watchers.remove(at: index)
            }
            watcher?.continuation.resume()
        }
    }

    /// Suspends until no call is suspended in a `.hang` or `.held` step (every such call was
    /// released or cancelled and has let go), or the waiting task is cancelled.
    public func waitUntilNoneSuspended() async {
        let id = state.withLock { state -> UInt64 in
            state.nextWatcher += 1
            return state.nextWatcher
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    if state.suspended.isEmpty || state.cancelledWatchers.remove(id) != nil { return true }
                    state.idleWaiters.append((id, continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state.idleWaiters.firstIndex(where: { $0.0 == id }) else {
                    state.cancelledWatchers.insert(id)
                    return nil
                }
                return state.idleWaiters.remove(at: index).1
            }
            waiter?.resume()
        }
    }

    /// Takes the idle waiters if nothing is suspended any more.
    private static func takeIdleWaiters(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        guard state.suspended.isEmpty else { return [] }
        defer { state.idleWaiters.removeAll() }
        return state.idleWaiters.map(\.1)
    }

    /// Lets every started call in a `.held` step go on (later calls hold again).
    public func releaseHeld() {
        let (released, idle) = state.withLock { state -> ([Waiter], [CheckedContinuation<Void, Never>]) in
            state.releasedThrough = state.nextID
            let ready = state.suspended.filter { state.isHeld[$0.id] == true }
            state.suspended.removeAll { state.isHeld[$0.id] == true }
            return (ready, Self.takeIdleWaiters(&state))
        }
        for waiter in released { waiter.continuation.resume(returning: true) }
        for waiter in idle { waiter.resume() }
    }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let (step, id, ready) = state.withLock { state -> (Step, UInt64, [CallWatcher]) in
            let index = min(state.requests.count, state.steps.count - 1)
            state.requests.append(request)
            state.nextID += 1
            let count = state.requests.count
            let ready = state.watchers.filter { $0.count <= count }
            state.watchers.removeAll { $0.count <= count }
            return (state.steps[index], state.nextID, ready)
        }
        for watcher in ready { watcher.continuation.resume() }
        return try await perform(step, id: id, for: request)
    }

    private func perform(_ step: Step, id: UInt64, for request: URLRequest) async throws -> (Data, URLResponse) {
        let url = request.url ?? URL(fileURLWithPath: "/")
        switch step {
        case .respond(let status, let headers, let body):
            guard let response = HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: headers) else {
                throw URLError(.badServerResponse)
            }
            return (body, response)
        case .fail(let error):
            throw error
        case .nonHTTPResponse:
            return (Data(), URLResponse(url: url, mimeType: nil, expectedContentLength: 0, textEncodingName: nil))
        case .hang:
            _ = await suspend(id: id, releasable: false)
            throw URLError(.cancelled)
        case .held(let next):
            guard await suspend(id: id, releasable: true) else { throw URLError(.cancelled) }
            return try await perform(next, id: id, for: request)
        }
    }

    /// Suspends until released (true) or cancelled (false).
    private func suspend(id: UInt64, releasable: Bool) async -> Bool {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let immediate = state.withLock { state -> Bool? in
                    if state.cancelledEarly.remove(id) != nil { return false }
                    if releasable, id <= state.releasedThrough { return true }
                    state.suspended.append(Waiter(id: id, continuation: continuation))
                    state.isHeld[id] = releasable
                    return nil
                }
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            let (continuation, idle) = state.withLock { state -> (CheckedContinuation<Bool, Never>?, [CheckedContinuation<Void, Never>]) in
                guard let index = state.suspended.firstIndex(where: { $0.id == id }) else {
                    state.cancelledEarly.insert(id)
                    return (nil, [])
                }
                state.isHeld[id] = nil
                let continuation = state.suspended.remove(at: index).continuation
                return (continuation, Self.takeIdleWaiters(&state))
            }
            continuation?.resume(returning: false)
            for waiter in idle { waiter.resume() }
        }
    }
}
