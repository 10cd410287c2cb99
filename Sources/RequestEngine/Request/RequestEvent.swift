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
/// Events carry the URL but never headers or bodies, so tokens do not leak into sinks.
public enum RequestEvent: Sendable {
    /// Emitted before the first attempt.
    case started(traceID: UUID, url: URL, method: HTTPMethod)
    /// Emitted after an attempt failed and before the engine waits `delay` seconds; `attempt` is the
    /// zero-based attempt that failed.
    case retryScheduled(traceID: UUID, attempt: Int, delay: TimeInterval)
    /// Emitted on a 2xx response; `duration` is seconds since `started`, `attempt` the zero-based attempt.
    case succeeded(traceID: UUID, statusCode: Int, duration: TimeInterval, attempt: Int)
    /// Emitted once when the request ends without success.
    case failed(traceID: UUID, error: NetworkError, attempt: Int)
    /// Emitted when a caller joins an identical in-flight request instead of sending its own.
    case deduplicated(traceID: UUID, url: URL, method: HTTPMethod)

    /// The trace this event belongs to.
    public var traceID: UUID {
        switch self {
        case .started(let id, _, _), .retryScheduled(let id, _, _), .succeeded(let id, _, _, _),
            .failed(let id, _, _), .deduplicated(let id, _, _):
            return id
        }
    }
}

/// Receives the engine's events. Called inline on the request path, in lifecycle order, so keep
/// `record` cheap (a lock-based collector, not a slow logger). An engine without a sink pays nothing.
public protocol RequestEventSink: Sendable {
    func record(_ event: RequestEvent) async
    /// Records `started` or `deduplicated` for a request that performs API operation
    /// `operationID` (`NetworkRequest.operationID`, as a generated OpenAPI client names it); the
    /// engine calls this in place of `record(_:)` for those two events of such a request. The
    /// default calls `record(_:)`, so a sink that does not care about operations implements that
    /// alone. The collector and the logging and metrics sinks name the endpoint by the operation.
    func record(_ event: RequestEvent, operation operationID: String) async
}

extension RequestEventSink {
    public func record(_ event: RequestEvent, operation operationID: String) async {
        await record(event)
    }

    /// `record(_:operation:)` for a request with an operation, else `record(_:)`: how the engine
    /// reports `started` and `deduplicated`.
    func record(_ event: RequestEvent, operationID: String?) async {
        if let operationID {
            await record(event, operation: operationID)
        } else {
            await record(event)
        }
    }
}
