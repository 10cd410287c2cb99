import Foundation
import Logging
import Observability
import RequestEngine
import ResilienceBridgeSupport

/// A `RequestEventSink` that logs the engine's events through a swift-log `Logger`, one entry per
/// event, with structured metadata and never a secret:
///
/// | message | level (default) | metadata |
/// | --- | --- | --- |
/// | `request started` | trace | `trace_id`, `http.method`, `http.endpoint`, `server.address` |
/// | `request deduplicated` | trace | the same (the caller joined an identical request in flight) |
/// | `retry scheduled` | info | `trace_id`, `http.method`, `http.endpoint`, `attempt`, `retry.delay_seconds` |
/// | `request succeeded` | debug | `trace_id`, `http.method`, `http.endpoint`, `http.status`, `attempt`, `duration_seconds` |
/// | `request failed` | info | `trace_id`, `http.method`, `http.endpoint`, `http.status` (status code or reason), `attempt`, `error` |
///
/// `http.endpoint` is the request's operation when it has one (`createNote`, a generated client's,
/// given by `record(_:operation:)`), else the path template (`/users/{id}`); `server.address` is
/// the host alone: no
/// path, query, fragment, user info, header or body is ever logged, so `Authorization`, cookies
/// and `?token=` values cannot reach a log line; `error` is `NetworkError.description`, which
/// leaves bodies, headers and URLs out. Durations and delays are seconds with millisecond
/// precision. The events of one request share its `trace_id`; `attempt` is zero-based.
///
/// Entries below the logger's level cost a level comparison and nothing else.
public struct SwiftLogEventSink: RequestEventSink {
    /// The level each kind of entry is logged at.
    public struct Levels: Sendable {
        public var started: Logger.Level
        public var deduplicated: Logger.Level
        public var retryScheduled: Logger.Level
        public var succeeded: Logger.Level
        public var failed: Logger.Level

        public init(
            started: Logger.Level = .trace,
            deduplicated: Logger.Level = .trace,
            retryScheduled: Logger.Level = .info,
            succeeded: Logger.Level = .debug,
            failed: Logger.Level = .info
        ) {
            self.started = started
            self.deduplicated = deduplicated
            self.retryScheduled = retryScheduled
            self.succeeded = succeeded
            self.failed = failed
        }
    }

    /// The logger entries go to.
    public let logger: Logger
    /// The level of each kind of entry.
    public let levels: Levels
    private let catalog: EndpointCatalog
    private let requests: TraceTable<EndpointLabels>

    /// - Parameters:
    ///   - logger: where entries go; its own metadata (a request id of the service, say) is kept.
    ///   - levels: the level of each kind of entry.
    ///   - pathTemplate: turns a URL into `http.endpoint` (default `.collapsingIdentifiers`).
    ///   - maximumEndpoints: distinct endpoints logged by template; later ones log `__other__`.
    ///   - maximumTrackedRequests: requests in flight whose method and endpoint are remembered for
    ///     their later entries; beyond that the oldest log `UNKNOWN` / `__unknown__`.
    public init(
        logger: Logger,
        levels: Levels = Levels(),
        pathTemplate: PathTemplate = .collapsingIdentifiers,
        maximumEndpoints: Int = 1000,
        maximumTrackedRequests: Int = 4096
    ) {
        self.logger = logger
        self.levels = levels
        let policy = LabelPolicy(pathTemplate: pathTemplate, maximumEndpoints: maximumEndpoints, maximumTrackedRequests: maximumTrackedRequests)
        catalog = EndpointCatalog(policy: policy)
        requests = TraceTable(capacity: policy.maximumTrackedRequests)
    }

    public func record(_ event: RequestEvent) async {
        log(event, operationID: nil)
    }

    /// `record(_:)`, with `http.endpoint` the operation's name.
    public func record(_ event: RequestEvent, operation operationID: String) async {
        log(event, operationID: operationID)
    }

    private func log(_ event: RequestEvent, operationID: String?) {
        switch event {
        case .started(let traceID, let url, let method):
            let labels = catalog.labels(method: method, url: url, operationID: operationID)
            // Remembered only when a later entry can be logged: the succeeded or failed one.
            if logger.logLevel <= max(levels.succeeded, levels.failed, levels.retryScheduled) {
                requests.insert(labels, for: traceID)
            }
            guard logger.logLevel <= levels.started else { return }
            logger.log(level: levels.started, "request started", metadata: Self.metadata(traceID, labels, host: url.host))
        case .deduplicated(let traceID, let url, let method):
            guard logger.logLevel <= levels.deduplicated else { return }
            let labels = catalog.labels(method: method, url: url, operationID: operationID)
            logger.log(level: levels.deduplicated, "request deduplicated", metadata: Self.metadata(traceID, labels, host: url.host))
        case .retryScheduled(let traceID, let attempt, let delay):
            guard logger.logLevel <= levels.retryScheduled else { return }
            var metadata = Self.metadata(traceID, requests.value(for: traceID) ?? .unknown, host: nil)
            metadata["attempt"] = "\(attempt)"
            metadata["retry.delay_seconds"] = "\(Self.seconds(delay))"
            logger.log(level: levels.retryScheduled, "retry scheduled", metadata: metadata)
        case .succeeded(let traceID, let statusCode, let duration, let attempt):
            let labels = requests.remove(traceID) ?? .unknown
            guard logger.logLevel <= levels.succeeded else { return }
            var metadata = Self.metadata(traceID, labels, host: nil)
            metadata["http.status"] = "\(StatusLabel.success(statusCode))"
            metadata["attempt"] = "\(attempt)"
            metadata["duration_seconds"] = "\(Self.seconds(duration))"
            logger.log(level: levels.succeeded, "request succeeded", metadata: metadata)
        case .failed(let traceID, let error, let attempt):
            let labels = requests.remove(traceID) ?? .unknown
            guard logger.logLevel <= levels.failed else { return }
            var metadata = Self.metadata(traceID, labels, host: nil)
            metadata["http.status"] = "\(StatusLabel.failure(error))"
            metadata["attempt"] = "\(attempt)"
            metadata["error"] = "\(error.description)"
            logger.log(level: levels.failed, "request failed", metadata: metadata)
        }
    }

    private static func metadata(_ traceID: UUID, _ labels: EndpointLabels, host: String?) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "trace_id": "\(traceID.uuidString)",
            "http.method": "\(labels.method)",
            "http.endpoint": "\(labels.endpoint)",
        ]
        if let host { metadata["server.address"] = "\(host)" }
        return metadata
    }

    /// Seconds with three decimals (`0.250`); `nan` or `inf` as such.
    private static func seconds(_ value: TimeInterval) -> String {
        guard value.isFinite else { return value.isNaN ? "nan" : "inf" }
        return String(format: "%.3f", value)
    }
}
