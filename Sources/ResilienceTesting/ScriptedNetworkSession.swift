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
        var watchers: [CallWatcher] = []
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

    /// Suspends until at least `count` calls have been made.
    public func waitForCalls(_ count: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.requests.count >= count { return true }
                state.watchers.append(CallWatcher(count: count, continuation: continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Lets every call currently waiting in a `.held` step go on.
    public func releaseHeld() {
        let released = state.withLock { state -> [Waiter] in
            let ready = state.suspended.filter { state.isHeld[$0.id] == true }
            state.suspended.removeAll { state.isHeld[$0.id] == true }
            return ready
        }
        for waiter in released { waiter.continuation.resume(returning: true) }
    }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let (step, ready) = state.withLock { state -> (Step, [CallWatcher]) in
            let index = min(state.requests.count, state.steps.count - 1)
            state.requests.append(request)
            let count = state.requests.count
            let ready = state.watchers.filter { $0.count <= count }
            state.watchers.removeAll { $0.count <= count }
            return (state.steps[index], ready)
        }
        for watcher in ready { watcher.continuation.resume() }
        return try await perform(step, for: request)
    }

    private func perform(_ step: Step, for request: URLRequest) async throws -> (Data, URLResponse) {
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
            _ = await suspend(releasable: false)
            throw URLError(.cancelled)
        case .held(let next):
            guard await suspend(releasable: true) else { throw URLError(.cancelled) }
            return try await perform(next, for: request)
        }
    }

    /// Suspends until released (true) or cancelled (false).
    private func suspend(releasable: Bool) async -> Bool {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let cancelled = state.withLock { state -> Bool in
                    if state.cancelledEarly.remove(id) != nil { return true }
                    state.suspended.append(Waiter(id: id, continuation: continuation))
                    state.isHeld[id] = releasable
                    return false
                }
                if cancelled { continuation.resume(returning: false) }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                guard let index = state.suspended.firstIndex(where: { $0.id == id }) else {
                    state.cancelledEarly.insert(id)
                    return nil
                }
                state.isHeld[id] = nil
                return state.suspended.remove(at: index).continuation
            }
            continuation?.resume(returning: false)
        }
    }
}
