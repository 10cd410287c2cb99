import Foundation
import InMemoryTracing
import Instrumentation
import ServiceContextModule
import Synchronization
import Tracing

/// An in-memory tracer that propagates W3C trace context (`traceparent`), as swift-otel's W3C
/// propagator does: spans are recorded by swift-distributed-tracing's `InMemoryTracer` with
/// W3C-shaped ids (32 and 16 lower-case hex digits), and `inject` writes
/// `traceparent: 00-<trace id>-<span id>-01`.
struct W3CTestTracer: Tracer {
    let recorder: InMemoryTracer

    init() {
        let counter = Mutex<UInt64>(0)
        let next: @Sendable () -> UInt64 = {
            counter.withLock {
                $0 += 1; return $0
            }
        }
        recorder = InMemoryTracer(
            idGenerator: .init(
                nextTraceID: { String(format: "%032llx", next()) },
                nextSpanID: { String(format: "%016llx", next()) }
            ))
    }

    func startSpan<Instant: TracerInstant>(
        _ operationName: String,
        context: @autoclosure () -> ServiceContext,
        ofKind kind: SpanKind,
        at instant: @autoclosure () -> Instant,
        function: String,
        file fileID: String,
        line: UInt
    ) -> InMemorySpan {
        recorder.startSpan(operationName, context: context(), ofKind: kind, at: instant(), function: function, file: fileID, line: line)
    }

    func forceFlush() { recorder.forceFlush() }

    func inject<Carrier, Inject: Injector>(_ context: ServiceContext, into carrier: inout Carrier, using injector: Inject)
    where Inject.Carrier == Carrier {
        guard let span = context.inMemorySpanContext else { return }
        injector.inject("00-\(span.traceID)-\(span.spanID)-01", forKey: "traceparent", into: &carrier)
    }

    func extract<Carrier, Extract: Extractor>(_ carrier: Carrier, into context: inout ServiceContext, using extractor: Extract)
    where Extract.Carrier == Carrier {}

    var finishedSpans: [FinishedInMemorySpan] { recorder.finishedSpans }

    /// Suspends until at least `count` spans have finished; `false` if they have not after a
    /// million turns of the scheduler. A span of an attempt the engine superseded (its timeout
    /// handed the request on) ends only when the transport has wound that attempt down, which may
    /// be after the request has returned. `InMemoryTracer` has no hook for a span's end, so this
    /// yields between looks: it waits for the event, never for a length of time.
    func waitForFinishedSpans(_ count: Int) async -> Bool {
        for _ in 0..<1_000_000 {
            if recorder.finishedSpans.count >= count { return true }
            await Task.yield()
        }
        return recorder.finishedSpans.count >= count
    }
}
