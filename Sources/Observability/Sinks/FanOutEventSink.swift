import RequestEngine

/// Records every event to several sinks, one after the other in the order given: the first sink
/// has recorded an event before the second sees it. A slow sink delays the sinks after it and the
/// request that emitted the event, so put cheap sinks (a `RequestMetricsCollector`) first.
///
/// ```swift
/// let sink = FanOutEventSink(metrics, LoggingEventSink())
/// let engine = AsyncRequestEngine(eventSink: sink)
/// ```
public struct FanOutEventSink: RetryThrottlingEventSink, HedgingEventSink {
    /// The sinks, in the order they record each event.
    public let sinks: [any RequestEventSink]

    /// A sink that records to each of `sinks`, in order.
    public init(_ sinks: [any RequestEventSink]) {
        self.sinks = sinks
    }

    /// A sink that records to each of `sinks`, in order.
    public init(_ sinks: any RequestEventSink...) {
        self.sinks = sinks
    }

    /// Records `event` to every sink in order, awaiting each.
    public func record(_ event: RequestEvent) async {
        for sink in sinks {
            await sink.record(event)
        }
    }

    /// Passes a throttled retry to every sink that hears of them, in order.
    /// Records `event` of a request performing `operationID` to each sink, in order.
    public func record(_ event: RequestEvent, operation operationID: String) async {
        for sink in sinks { await sink.record(event, operation: operationID) }
    }

    public func recordRetryThrottled(_ event: RetryThrottledEvent) async {
        for case let sink as any RetryThrottlingEventSink in sinks {
            await sink.recordRetryThrottled(event)
        }
    }

    /// Passes a hedge to every sink that hears of them, in order.
    public func recordHedge(_ event: HedgeEvent) async {
        for case let sink as any HedgingEventSink in sinks {
            await sink.recordHedge(event)
        }
    }
}
