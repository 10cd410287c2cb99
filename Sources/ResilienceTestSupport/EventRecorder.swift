import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Records events and lets a test wait until a condition over them holds.
package final class EventRecorder: RequestEventSink {
    private struct State {
        var events: [RequestEvent] = []
        var operations: [Int: String] = [:]
        /// Tagged with the condition each waits for.
        var watchers = WaiterList<Void, @Sendable ([RequestEvent]) -> Bool>()
    }
    private let state = Locked(State())

    package init() {}

    package var events: [RequestEvent] { state.withLock { $0.events } }

    /// The operation each event came with (`record(_:operation:)`), by index in `events`.
    package var operations: [Int: String] { state.withLock { $0.operations } }

    package func record(_ event: RequestEvent, operation operationID: String) async {
        state.withLock { $0.operations[$0.events.count] = operationID }
        await record(event)
    }

    package func record(_ event: RequestEvent) async {
        let ready = state.withLock { state in
            state.events.append(event)
            let events = state.events
            return state.watchers.takeAll { $0(events) }
        }
        for watcher in ready { watcher.resume(returning: ()) }
    }

    /// Suspends until `predicate` holds for the events recorded so far (or the test is cancelled).
    package func wait(until predicate: @escaping @Sendable ([RequestEvent]) -> Bool) async {
        await state.wait(on: \.watchers, tag: predicate, cancelled: ()) { predicate($0.events) ? () : nil }
    }

    package func waitForDeduplicated(_ count: Int) async {
        await wait { events in events.filter(\.isDeduplicated).count >= count }
    }

    /// Suspends until a `failed` event has been recorded.
    package func waitForFailed() async {
        await wait { events in events.contains(where: \.isFailed) }
    }

    /// A compact rendering for assertions: "started", "retry(0,1.0)", "succeeded(200,1)", "failed(HTTP 503…,2)", "dedup".
    package var timeline: [String] {
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
    package var isDeduplicated: Bool {
        if case .deduplicated = self { return true }
        return false
    }

    package var isFailed: Bool {
        if case .failed = self { return true }
        return false
    }
}
