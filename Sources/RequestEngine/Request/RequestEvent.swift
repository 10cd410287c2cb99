import Foundation

/// A moment in the life of one logical request sent through `AsyncRequestEngine`.
///
/// Every event of one `send` carries the same `traceID`. Sequences:
/// - success on the first try: `started` → `succeeded(attempt: 0)`
/// - one retry: `started` → `retryScheduled(attempt: 0, delay:)` → `succeeded(attempt: 1)`
/// - failure: `started` → … → `failed(error:attempt:)`
/// - a caller that joined an identical request already in flight: `deduplicated` only (with its own
///   traceID); the shared call reports under the first caller's traceID.
///
/// Events carry the URL but never headers or bodies, so tokens do not leak into sinks. `started`
/// and `deduplicated` carry the request's `operationID` too (nil for a request without one), which
/// the metrics and logging sinks use as the endpoint's name in place of the URL's path template.
public enum RequestEvent: Sendable {
    /// Emitted before the first attempt.
    case started(traceID: UUID, url: URL, method: HTTPMethod, operationID: String? = nil)
    /// Emitted after an attempt failed and before the engine waits `delay` seconds; `attempt` is the
    /// zero-based attempt that failed.
    case retryScheduled(traceID: UUID, attempt: Int, delay: TimeInterval)
    /// Emitted on a 2xx response; `duration` is seconds since `started`, `attempt` the zero-based attempt.
    case succeeded(traceID: UUID, statusCode: Int, duration: TimeInterval, attempt: Int)
    /// Emitted once when the request ends without success.
    case failed(traceID: UUID, error: NetworkError, attempt: Int)
    /// Emitted when a caller joins an identical in-flight request instead of sending its own.
    case deduplicated(traceID: UUID, url: URL, method: HTTPMethod, operationID: String? = nil)

    /// The trace this event belongs to.
    public var traceID: UUID {
        switch self {
        case .started(let id, _, _, _), .retryScheduled(let id, _, _), .succeeded(let id, _, _, _),
            .failed(let id, _, _), .deduplicated(let id, _, _, _):
            return id
        }
    }
}

/// Receives the engine's events. Called inline on the request path, in lifecycle order, so keep
/// `record` cheap (a lock-based collector, not a slow logger). An engine without a sink pays nothing.
public protocol RequestEventSink: Sendable {
    func record(_ event: RequestEvent) async
}
