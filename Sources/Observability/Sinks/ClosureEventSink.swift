import RequestEngine

/// A sink that hands each event to a closure, for one-off wiring (forwarding to an app's
/// analytics, counting in a test) without declaring a type.
///
/// ```swift
/// let sink = ClosureEventSink { event in
///     if case .failed(_, let error, _) = event { analytics.track("request_failed", error.description) }
/// }
/// ```
/// The closure runs on the request's path: the engine awaits it before going on.
public struct ClosureEventSink: RequestEventSink {
    private let handler: @Sendable (RequestEvent) async -> Void

    /// A sink that calls `handler` with every event, in the order they are recorded.
    public init(_ handler: @escaping @Sendable (RequestEvent) async -> Void) {
        self.handler = handler
    }

    /// Calls the closure with `event`.
    public func record(_ event: RequestEvent) async {
        await handler(event)
    }
}
