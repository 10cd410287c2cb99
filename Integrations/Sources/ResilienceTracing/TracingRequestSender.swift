import Foundation
import Instrumentation
import Observability
import RequestEngine
import ResilienceBridgeSupport
import ServiceContextModule
import Synchronization
import Tracing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A `RequestSending` decorator that makes one span per logical request — a `send` or
/// `response(for:)`, whatever its retries — around any sender (`AsyncRequestEngine`,
/// `AuthenticatedRequestEngine`, …).
///
/// The span (name `"GET /users/{id}"`, kind `.client`, child of the caller's current span) carries
/// `http.request.method`, `url.template`, `url.scheme`, `server.address`, `server.port`, the final
/// `http.response.status_code` or `error.type`, `resilience.attempts` (requests sent), and
/// `resilience.operation` for a request with an `operationID` (a generated client's). With a
/// `TracingEventSink` on the engine it also shows each `retry_scheduled` (attempt, delay) as an
/// event, and a caller that joined an identical request already in flight gets a `deduplicated`
/// event and `resilience.deduplicated = true` (its span has no attempt of its own: the network
/// call belongs to the first caller's span). With `TracingNetworkSession` as the engine's session,
/// each attempt is a child span of this one. No URL, header or body beyond those attributes
/// reaches the span.
public struct TracingRequestSender<Base: RequestSending>: RequestSending {
    /// The sender requests go through.
    public let base: Base
    private let tracer: (any Tracer)?
    private let pathTemplate: PathTemplate

    /// - Parameters:
    ///   - base: the sender that does the work.
    ///   - tracer: where spans go; `nil` (default) uses the bootstrapped `InstrumentationSystem.tracer`.
    ///   - pathTemplate: turns a URL into `url.template` and the span name.
    public init(wrapping base: Base, tracer: (any Tracer)? = nil, pathTemplate: PathTemplate = .collapsingIdentifiers) {
        self.base = base
        self.tracer = tracer
        self.pathTemplate = pathTemplate
    }

    @discardableResult
    public func send(_ request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        try await traced(request.method, request.url, request.operationID) { try await base.send(request) }
    }

    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        try await traced(request.method, request.url, request.operationID) { try await base.response(for: request) }
    }

    private func traced(
        _ method: RequestEngine.HTTPMethod,
        _ url: URL,
        _ operationID: String?,
        _ body: () async throws -> (Data, HTTPURLResponse)
    ) async throws -> (Data, HTTPURLResponse) {
        let tracer = self.tracer ?? InstrumentationSystem.tracer
        let description = RequestDescription(method: method.rawValue, url: url, pathTemplate: pathTemplate)
        let span = tracer.startSpan(description.spanName, context: ServiceContext.current ?? .topLevel, ofKind: .client)
        description.apply(to: span)
        if let operationID { span.attributes["resilience.operation"] = operationID }
        let logical = LogicalRequest(span: span)
        defer {
            LogicalRequest.registry.unregister(logical)
            span.attributes["resilience.attempts"] = logical.attempts
            span.end()
        }
        do {
            let result = try await ServiceContext.withValue(span.context) {
                try await LogicalRequest.$current.withValue(logical) { try await body() }
            }
            SpanOutcome.response(result.1.statusCode, on: span)
            return result
        } catch {
            SpanOutcome.failure(NetworkError(mapping: error), on: span)
            throw error
        }
    }
}

/// A `RequestEventSink` that writes the engine's retries and deduplication joins on the logical
/// request's span (made by `TracingRequestSender`): a `retry_scheduled` event with `attempt` and
/// `delay_seconds`, and a `deduplicated` event with `resilience.deduplicated = true`. Put it on
/// the engine beside the metrics and logging sinks (`FanOutEventSink`). Events of requests not
/// sent through a `TracingRequestSender` are ignored.
public struct TracingEventSink: RequestEventSink {
    private let requests: TraceTable<LogicalRequest>

    /// - Parameter maximumTrackedRequests: requests in flight whose span the sink can find again
    ///   (for their retries); beyond that the oldest are forgotten.
    public init(maximumTrackedRequests: Int = 4096) {
        requests = TraceTable(capacity: maximumTrackedRequests)
    }

    public func record(_ event: RequestEvent) async {
        switch event {
        case .started(let traceID, _, _):
            // In the shared call's task, which inherits the first caller's task-locals.
            if let logical = LogicalRequest.current { requests.insert(logical, for: traceID) }
        case .retryScheduled(let traceID, let attempt, let delay):
            // Retries after a timeout run in a task of their own: found by trace id, not task-local.
            guard let logical = requests.value(for: traceID) ?? LogicalRequest.current else { return }
            logical.span.addEvent(
                SpanEvent(
                    name: "retry_scheduled",
                    attributes: [
                        "attempt": .int64(Int64(attempt)),
                        "delay_seconds": .double(delay),
                    ]))
        case .deduplicated:
            // In the joining caller's own task.
            guard let logical = LogicalRequest.current else { return }
            logical.span.attributes["resilience.deduplicated"] = true
            logical.span.addEvent(SpanEvent(name: "deduplicated"))
        case .succeeded(let traceID, _, _, _), .failed(let traceID, _, _):
            requests.remove(traceID)
        }
    }
}

/// One logical request in flight through a `TracingRequestSender`: its span and the attempts sent.
final class LogicalRequest: Sendable {
    @TaskLocal static var current: LogicalRequest?

    /// Logical requests by the `URLRequest` their attempts send, so that an attempt the engine
    /// runs in a task without the caller's task-locals (after a timeout) still finds its parent.
    static let registry = Registry()

    let span: any Span
    private let state = Mutex<(attempts: Int, key: URLRequest?)>((0, nil))

    init(span: any Span) {
        self.span = span
    }

    /// Counts an attempt; returns its zero-based number.
    func nextAttempt() -> Int {
        state.withLock { state in
            defer { state.attempts += 1 }
            return state.attempts
        }
    }

    var attempts: Int { state.withLock { $0.attempts } }

    fileprivate func claimKey(_ key: URLRequest) -> Bool {
        state.withLock { state in
            guard state.key == nil else { return false }
            state.key = key
            return true
        }
    }

    fileprivate var key: URLRequest? { state.withLock { $0.key } }

    final class Registry: Sendable {
        private let entries = Mutex<[URLRequest: LogicalRequest]>([:])

        func register(_ request: URLRequest, _ logical: LogicalRequest) {
            guard logical.claimKey(request) else { return }
            entries.withLock { $0[request] = logical }
        }

        func lookup(_ request: URLRequest) -> LogicalRequest? {
            entries.withLock { $0[request] }
        }

        func unregister(_ logical: LogicalRequest) {
            guard let key = logical.key else { return }
            entries.withLock { entries in
                if entries[key] === logical { entries.removeValue(forKey: key) }
            }
        }
    }
}

/// `error.type` for a failure: the status code, or the reason as the metrics' `status` label.
enum StatusLabelForSpans {
    static func label(_ error: NetworkError) -> String {
        StatusLabel.failure(error)
    }
}
