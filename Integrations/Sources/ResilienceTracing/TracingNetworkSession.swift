import Foundation
import Instrumentation
import Observability
import RequestEngine
import ServiceContextModule
import Tracing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A `NetworkSession` decorator that makes one client span per attempt — per request the
/// transport sends — and propagates it in the outgoing headers through the tracer's injector
/// (with swift-otel's W3C propagator, `traceparent` and `tracestate`).
///
/// ```swift
/// let engine = AsyncRequestEngine(
///     session: TracingNetworkSession(wrapping: AsyncHTTPClientSession()),
///     eventSink: TracingEventSink()
/// )
/// let client = TracingRequestSender(wrapping: engine)   // one span per logical request
/// ```
///
/// The attempt span is a child of the logical request's span when the request was sent through
/// `TracingRequestSender` (also for attempts the engine runs after a timeout, in a task that does
/// not inherit the caller's context), otherwise of the caller's current span, otherwise a root.
///
/// Span (name `"GET /users/{id}"`, kind `.client`) attributes, after OpenTelemetry's HTTP client
/// conventions: `http.request.method`, `url.template`, `url.scheme`, `server.address`,
/// `server.port`, `http.request.resend_count` (from the second attempt of a logical request on),
/// `http.response.status_code`, and on failure `error.type` (the status code or the reason, as the
/// metrics' `status` label) with an error status. Never `url.full`, a path, a query, a header or a
/// body: tokens in query strings, `Authorization` and cookies stay out of spans. A recorded error
/// carries only `NetworkError`'s description.
public struct TracingNetworkSession: NetworkSession {
    private let base: any NetworkSession
    private let tracer: (any Tracer)?
    private let pathTemplate: PathTemplate

    /// - Parameters:
    ///   - base: the transport that sends the requests.
    ///   - tracer: where spans go; `nil` (default) uses the bootstrapped `InstrumentationSystem.tracer`
    ///     at each request.
    ///   - pathTemplate: turns a URL into `url.template` and the span name.
    public init(wrapping base: any NetworkSession, tracer: (any Tracer)? = nil, pathTemplate: PathTemplate = .collapsingIdentifiers) {
        self.base = base
        self.tracer = tracer
        self.pathTemplate = pathTemplate
    }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        try await data(for: request, maximumBodySize: nil)
    }

    /// The wrapped session's: a span adds no wait, so the calls are bounded as the base bounds them.
    public var honorsTimeoutAndCancellation: Bool { base.honorsTimeoutAndCancellation }

    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        try await traced(request) { outgoing in
            let (data, response) = try await base.data(for: outgoing, maximumBodySize: maximumBodySize)
            return (data, response, (response as? HTTPURLResponse)?.statusCode)
        }
    }

    /// The wrapped session's head, as it gives it (no Foundation response built on the way).
    public func dataWithHead(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, ResponseHead) {
        try await traced(request) { outgoing in
            let (data, head) = try await base.dataWithHead(for: outgoing, maximumBodySize: maximumBodySize)
            return (data, head, head.statusCode)
        }
    }

    /// One attempt's span around `send`, which gets the request with the span's context injected
    /// and answers with the status, when there is one.
    private func traced<Response>(
        _ request: URLRequest,
        _ send: (URLRequest) async throws -> (Data, Response, Int?)
    ) async throws -> (Data, Response) {
        let tracer = self.tracer ?? InstrumentationSystem.tracer
        let logical = LogicalRequest.current ?? LogicalRequest.registry.lookup(request)
        if let logical, LogicalRequest.current != nil { LogicalRequest.registry.register(request, logical) }
        let attempt = logical?.nextAttempt()
        let parent = logical.map { $0.span.context } ?? ServiceContext.current ?? .topLevel
        let description = RequestDescription(request, pathTemplate: pathTemplate)
        let span = tracer.startSpan(description.spanName, context: parent, ofKind: .client)
        description.apply(to: span)
        if let attempt, attempt > 0 { span.attributes["http.request.resend_count"] = attempt }

        var outgoing = request
        tracer.inject(span.context, into: &outgoing, using: URLRequestHeaderInjector())
        do {
            let (data, response, status) = try await ServiceContext.withValue(span.context) {
                try await send(outgoing)
            }
            if let status { SpanOutcome.response(status, on: span) }
            span.end()
            return (data, response)
        } catch {
            SpanOutcome.failure(NetworkError(mapping: error), on: span)
            span.end()
            throw error
        }
    }
}

/// Writes propagation headers into a `URLRequest`.
struct URLRequestHeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into request: inout URLRequest) {
        request.setValue(value, forHTTPHeaderField: key)
    }
}

/// What a span may say about a request: method, scheme, host, port and path template. Nothing
/// else of the URL, and nothing of the headers or body.
struct RequestDescription {
    let method: String
    let template: String
    let scheme: String?
    let host: String?
    let port: Int?

    init(_ request: URLRequest, pathTemplate: PathTemplate) {
        method = request.httpMethod ?? "GET"
        template = request.url.map { pathTemplate.template(for: $0) } ?? "/"
        scheme = request.url?.scheme?.lowercased()
        host = request.url?.host
        port = request.url?.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : nil)
    }

    init(method: String, url: URL, pathTemplate: PathTemplate) {
        self.method = method
        template = pathTemplate.template(for: url)
        scheme = url.scheme?.lowercased()
        host = url.host
        port = url.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : nil)
    }

    var spanName: String { "\(method) \(template)" }

    func apply(to span: any Span) {
        span.attributes["http.request.method"] = method
        span.attributes["url.template"] = template
        if let scheme { span.attributes["url.scheme"] = scheme }
        if let host { span.attributes["server.address"] = host }
        if let port { span.attributes["server.port"] = port }
    }
}

/// How a response or a failure is written on a span.
enum SpanOutcome {
    /// The status, and an error status for 4xx and 5xx (OpenTelemetry's rule for client spans).
    static func response(_ statusCode: Int, on span: any Span) {
        span.attributes["http.response.status_code"] = statusCode
        if statusCode >= 400 {
            span.attributes["error.type"] = String(statusCode)
            span.setStatus(SpanStatus(code: .error))
        }
    }

    /// The failure's reason as `error.type`, an error status, and the error's description only
    /// (a `NetworkError` description carries no URL, header or body).
    static func failure(_ error: NetworkError, on span: any Span) {
        if case .httpError(let statusCode, _) = error {
            response(statusCode, on: span)
            return
        }
        span.attributes["error.type"] = StatusLabelForSpans.label(error)
        span.recordError(RedactedRequestError(description: error.description))
        span.setStatus(SpanStatus(code: .error, message: error.description))
    }
}

/// The error a span records: the description of a `NetworkError`, nothing else of it.
struct RedactedRequestError: Error, CustomStringConvertible, Sendable {
    let description: String
}
