import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// An endpoint's identity in labels and snapshots.
struct EndpointKey: Hashable, Sendable {
    /// `GET`, `POST`, … or `UNKNOWN` for the row of events whose request was not tracked.
    let method: String
    let template: String
}

/// Assigns each distinct (method, template) a row number, up to the cardinality cap, and hands
/// out the overflow rows beyond it. Consulted only when a shard's endpoint cache misses: the first
/// time a thread sees an endpoint, and for every request of an endpoint past the cap.
///
/// Rows: 0 is `UNKNOWN __unknown__` (terminal events whose `started` was never seen or was
/// evicted); then registered endpoints in order of first sight; then one `METHOD __other__` row per
/// method, created when that method first overflows. Rows are never removed, so a row number stays
/// valid for as long as the collector lives.
final class EndpointRegistry: Sendable {
    static let unknownRow: Int32 = 0
    static let unknownKey = EndpointKey(method: "UNKNOWN", template: RequestMetricsCollector.unknownEndpoint)

    /// Rows every shard must have: unknown + cap + one overflow row per method.
    let rowCount: Int
    private let maximumEndpoints: Int
    private let state: Locked<State>

    private struct State {
        var rowsByHash: [Int: Int32] = [:]
        var keys: [EndpointKey] = [EndpointRegistry.unknownKey]
        var registered = 0
        var overflowRows = [Int32](repeating: -1, count: HTTPMethod.allCases.count)
    }

    init(maximumEndpoints: Int) {
        self.maximumEndpoints = maximumEndpoints
        rowCount = 1 + maximumEndpoints + HTTPMethod.allCases.count
        state = Locked(State())
    }

    /// The row for the endpoint with this hash, registering it (with the template `makeTemplate`
    /// returns) while fewer than `maximumEndpoints` are registered, else the method's overflow row.
    func row(forHash hash: Int, method: HTTPMethod, makeTemplate: () -> String) -> Int32 {
        let found = state.withLock { state -> Int32? in
            if let row = state.rowsByHash[hash] { return row }
            if state.registered >= maximumEndpoints { return overflowRow(&state, method) }
            return nil
        }
        if let found { return found }
        // Build the template outside the lock (a custom template function runs user code).
        let key = EndpointKey(method: method.rawValue, template: makeTemplate())
        return state.withLock { state -> Int32 in
            if let row = state.rowsByHash[hash] { return row }
            if state.registered >= maximumEndpoints { return overflowRow(&state, method) }
            let row = Int32(state.keys.count)
            state.keys.append(key)
            state.rowsByHash[hash] = row
            state.registered += 1
            return row
        }
    }

    private func overflowRow(_ state: inout State, _ method: HTTPMethod) -> Int32 {
        let ordinal = method.ordinal
        if state.overflowRows[ordinal] >= 0 { return state.overflowRows[ordinal] }
        let row = Int32(state.keys.count)
        state.keys.append(EndpointKey(method: method.rawValue, template: RequestMetricsCollector.overflowEndpoint))
        state.overflowRows[ordinal] = row
        return row
    }

    /// Every row's key, by row number.
    func keys() -> [EndpointKey] {
        state.withLock { $0.keys }
    }
}

extension HTTPMethod {
    /// 0…6, for tables indexed by method.
    @inline(__always)
    var ordinal: Int {
        switch self {
        case .get: 0
        case .post: 1
        case .put: 2
        case .patch: 3
        case .delete: 4
        case .head: 5
        case .options: 6
        }
    }
}
