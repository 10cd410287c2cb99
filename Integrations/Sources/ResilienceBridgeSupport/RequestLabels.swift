import Foundation
import Observability
import RequestEngine
import Synchronization

/// The labels a request is counted, logged and traced under: its method and endpoint template,
/// as `RequestMetricsCollector` groups it (`PrometheusTextFormat`).
package struct EndpointLabels: Hashable, Sendable {
    package let method: String
    package let endpoint: String

    package init(method: String, endpoint: String) {
        self.method = method
        self.endpoint = endpoint
    }

    /// A terminal event whose request is not (or no longer) known: `UNKNOWN __unknown__`, as the
    /// collector counts it.
    package static let unknown = EndpointLabels(method: "UNKNOWN", endpoint: RequestMetricsCollector.unknownEndpoint)
}

/// How the bridges turn a request into labels, and how much they may remember.
package struct LabelPolicy: Sendable {
    package var pathTemplate: PathTemplate
    package var maximumEndpoints: Int
    package var maximumTrackedRequests: Int

    package init(pathTemplate: PathTemplate, maximumEndpoints: Int, maximumTrackedRequests: Int) {
        self.pathTemplate = pathTemplate
        self.maximumEndpoints = max(0, maximumEndpoints)
        self.maximumTrackedRequests = max(4, maximumTrackedRequests)
    }
}

/// Endpoint labels with the collector's cardinality cap: the first `maximumEndpoints` distinct
/// method + template pairs keep their own label; later ones share `METHOD __other__`.
package final class EndpointCatalog: Sendable {
    private let policy: LabelPolicy
    private let known = Mutex<Set<EndpointLabels>>([])

    package init(policy: LabelPolicy) {
        self.policy = policy
    }

    /// The labels of a request: its method, and its `operationID` as the endpoint when it has one
    /// (a generated client's operation), else its URL's path template.
    package func labels(method: HTTPMethod, url: URL, operationID: String? = nil) -> EndpointLabels {
        let candidate = EndpointLabels(method: method.rawValue, endpoint: operationID ?? policy.pathTemplate.template(for: url))
        let admitted = known.withLock { known -> Bool in
            if known.contains(candidate) { return true }
            guard known.count < policy.maximumEndpoints else { return false }
            known.insert(candidate)
            return true
        }
        return admitted ? candidate : EndpointLabels(method: method.rawValue, endpoint: RequestMetricsCollector.overflowEndpoint)
    }
}

/// Values per trace id, from a request's `started` event to its terminal one, in fixed memory:
/// past `capacity` entries the oldest is forgotten (a sink that misses terminal events cannot
/// grow memory), as the collector's own table does.
package final class TraceTable<Value: Sendable>: Sendable {
    private struct State: Sendable {
        var values: [UUID: Value] = [:]
        /// Insertion order; may hold ids already removed (skipped when evicting).
        var order: [UUID] = []
        var head = 0
    }

    private let capacity: Int
    private let state = Mutex(State())

    package init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    package func insert(_ value: Value, for id: UUID) {
        state.withLock { state in
            if state.values.updateValue(value, forKey: id) != nil { return }
            state.order.append(id)
            while state.values.count > capacity, state.head < state.order.count {
                let oldest = state.order[state.head]
                state.head += 1
                state.values.removeValue(forKey: oldest)
            }
            // Drop the consumed prefix and the ids already removed once they dominate.
            if state.head > capacity || state.order.count > 2 * capacity + 16 {
                state.order = state.order[state.head...].filter { [values = state.values] in values[$0] != nil }
                state.head = 0
            }
        }
    }

    package func value(for id: UUID) -> Value? {
        state.withLock { $0.values[id] }
    }

    package func update(_ id: UUID, _ change: (inout Value) -> Void) {
        state.withLock { state in
            guard var value = state.values[id] else { return }
            change(&value)
            state.values[id] = value
        }
    }

    @discardableResult
    package func remove(_ id: UUID) -> Value? {
        state.withLock { $0.values.removeValue(forKey: id) }
    }

    package var count: Int { state.withLock { $0.values.count } }
}

/// The `status` label of a finished request, as the collector's Prometheus text writes it: the
/// HTTP status code (clamped to 0…999), or the reason a request without a response failed.
package enum StatusLabel {
    package static func success(_ statusCode: Int) -> String {
        String(min(max(statusCode, 0), 999))
    }

    package static func failure(_ error: NetworkError) -> String {
        switch error {
        case .httpError(let statusCode, _): return String(min(max(statusCode, 0), 999))
        case .noConnection: return "no_connection"
        case .timedOut: return "timed_out"
        case .cancelled: return "cancelled"
        case .transport(.cannotConnectToHost): return "cannot_connect"
        case .transport(.connectionLost): return "connection_lost"
        case .transport(.dnsFailure): return "dns_failure"
        case .transport(.secureConnectionFailed): return "tls_failure"
        case .invalidResponse: return "invalid_response"
        case .circuitOpen: return "circuit_open"
        case .invalidRequest: return "invalid_request"
        case .responseTooLarge, .underlying: return "other"
        case .deadlineExceeded: return "deadline_exceeded"
        case .limited: return "limited"
        case .tooManyRedirects: return "too_many_redirects"
        case .responseHeadersTooLarge: return "headers_too_large"
        }
    }
}
