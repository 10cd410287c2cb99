import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
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

    /// A call suspended in `.hang` (not releasable) or `.held` (releasable).
    private struct Suspension: Sendable {
        let call: UInt64
        let releasable: Bool
    }

    private struct State: Sendable {
        var steps: [Step]
        var requests: [URLRequest] = []
        var nextID: UInt64 = 0
        /// Resumed with `true` when released, `false` when cancelled.
        var suspended = WaiterList<Bool, Suspension>()
        var releasedThrough: UInt64 = 0  // held calls with an id up to this one are released
        /// Tagged with the call count they wait for.
        var callWatchers = WaiterList<Void, Int>()
        var idleWatchers = WaiterList<Void, Void>()
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
    public var suspendedCount: Int { state.withLock { $0.suspended.waitingCount() } }

    /// Suspends until at least `count` calls have been made, or the waiting task is cancelled.
    public func waitForCalls(_ count: Int) async {
        await state.wait(on: \.callWatchers, tag: count, cancelled: ()) { state in
            state.requests.count >= count ? () : nil
        }
    }

    /// Suspends until no call is suspended in a `.hang` or `.held` step (every such call was
    /// released or cancelled and has let go), or the waiting task is cancelled.
    public func waitUntilNoneSuspended() async {
        await state.wait(on: \.idleWatchers, tag: (), cancelled: ()) { state in
            state.suspended.waitingCount() == 0 ? () : nil
        }
    }

    /// Takes the idle watchers if nothing is suspended any more.
    private static func takeIdleWatchers(_ state: inout State) -> [WaiterList<Void, Void>.Waiter] {
        state.suspended.waitingCount() == 0 ? state.idleWatchers.takeAll() : []
    }

    /// Lets every started call in a `.held` step go on (later calls hold again).
    public func releaseHeld() {
        let (released, idle) = state.withLock { state in
            state.releasedThrough = state.nextID
            return (state.suspended.takeAll { $0.releasable }, Self.takeIdleWatchers(&state))
        }
        for waiter in released { waiter.resume(returning: true) }
        for watcher in idle { watcher.resume(returning: ()) }
    }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let (step, id, ready) = state.withLock { state in
            let index = min(state.requests.count, state.steps.count - 1)
            state.requests.append(request)
            state.nextID += 1
            let count = state.requests.count
            return (state.steps[index], state.nextID, state.callWatchers.takeAll { $0 <= count })
        }
        for watcher in ready { watcher.resume(returning: ()) }
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
        let ticket = state.withLock { $0.suspended.issue(Suspension(call: id, releasable: releasable)) }
        return await suspendCancellably { continuation in
            state.withLock { state -> Bool? in
                if let handed = state.suspended.claim(ticket) { return handed }
                if releasable, id <= state.releasedThrough {
                    state.suspended.withdraw(ticket)
                    return true
                }
                state.suspended.park(ticket, continuation)
                return nil
            }
        } onCancel: {
            let (waiter, idle) = state.withLock { state in
                let waiter = state.suspended.cancel(ticket, with: false)
                return (waiter, waiter == nil ? [] : Self.takeIdleWatchers(&state))
            }
            waiter?.resume(returning: false)
            for watcher in idle { watcher.resume(returning: ()) }
        }
    }
}
