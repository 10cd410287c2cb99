import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The network of a ``Simulation``: a `NetworkSession` whose requests take a latency drawn from
/// their host's range on the virtual clock and meet the faults their host's ``Faults`` say —
/// refused connections, connections reset before or after the origin acted, timeouts, 5xx,
/// 429 and 503 with `Retry-After` — on the way to the simulation's ``SimulatedOrigin``.
///
/// It honours the request's `timeoutInterval` and cancellation itself (a latency longer than the
/// timeout ends in `.timedOut` at the timeout), and fails every request with `.noConnection`
/// while the simulation is offline.
public final class SimulatedNetwork: NetworkSession {
    /// What can go wrong on the way to a host, each as a probability per request.
    public struct Faults: Sendable, Hashable {
        /// The connection is refused at once (`.transport(.cannotConnectToHost)`).
        public var refused: Double
        /// The connection drops before the origin sees the request.
        public var resetBefore: Double
        /// The connection drops after the origin acted, before the answer arrives: the case an
        /// `Idempotency-Key` exists for.
        public var resetAfter: Double
        /// The answer takes longer than the request's timeout.
        public var timeout: Double
        /// A 500, 502 or 504 instead of the origin's answer.
        public var serverError: Double
        /// A 429 or 503 with `Retry-After` (1 to 3 seconds) instead of the origin's answer.
        public var throttled: Double

        public init(
            refused: Double = 0,
            resetBefore: Double = 0,
            resetAfter: Double = 0,
            timeout: Double = 0,
            serverError: Double = 0,
            throttled: Double = 0
        ) {
            self.refused = refused
            self.resetBefore = resetBefore
            self.resetAfter = resetAfter
            self.timeout = timeout
            self.serverError = serverError
            self.throttled = throttled
        }

        /// No faults.
        public static let none = Faults()
    }

    /// How one host behaves.
    public struct Host: Sendable, Hashable {
        /// Round-trip latency, drawn uniformly per request.
        public var latency: ClosedRange<Duration>
        /// Faults per request.
        public var faults: Faults

        public init(latency: ClosedRange<Duration> = .milliseconds(5)...(.milliseconds(80)), faults: Faults = .none) {
            self.latency = latency
            self.faults = faults
        }
    }

    private struct State {
        weak var simulation: Simulation?
        var hosts: [String: Host] = [:]
        var requests = 0
        var attempts: [String: Int] = [:]
        var inFlight = 0
        var mostInFlight = 0
        var inFlightByOrderingKey: [String: Int] = [:]
        var mostInFlightByOrderingKey: [String: Int] = [:]
        /// Calls so far, and those in flight (started, not returned, not cancelled).
        var calls = 0
        var live: Set<Int> = []
    }

    private let state = Locked(State())

    init() {}

    func attach(to simulation: Simulation) {
        state.withLock { $0.simulation = simulation }
    }

    /// Sets how `host` behaves (hosts not set behave as `Host()`: no faults).
    public func setHost(_ host: String, _ behaviour: Host) {
        state.withLock { $0.hosts[host] = behaviour }
    }

    /// Requests that reached the network so far (offline ones included).
    public var requestCount: Int { state.withLock { $0.requests } }

    /// How many attempts of each request named by an `X-Sim-Request` header reached the network.
    public var attemptsByRequest: [String: Int] { state.withLock { $0.attempts } }

    /// The most requests that were on the network at once (a request counts until it returns or
    /// its caller cancels it).
    public var mostInFlight: Int { state.withLock { $0.mostInFlight } }

    /// The most requests of each ordering key (an `X-Sim-Order: KEY:SEQUENCE` header) that were on
    /// the network at once, counted as `mostInFlight` counts: a queue that keeps one entry of a key
    /// in flight never has more than 1. (An enqueue's first attempt that outlived its bound is
    /// cancelled and not waited for — the bound is for senders that ignore cancellation — so a
    /// request counts until it returns or is cancelled.)
    public var mostInFlightByOrderingKey: [String: Int] { state.withLock { $0.mostInFlightByOrderingKey } }

    public var honorsTimeoutAndCancellation: Bool { true }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        let orderingKey = request.value(forHTTPHeaderField: "X-Sim-Order").flatMap { $0.split(separator: ":").first.map(String.init) }
        let call = state.withLock { state -> Int in
            state.calls += 1
            state.live.insert(state.calls)
            state.inFlight += 1
            state.mostInFlight = max(state.mostInFlight, state.inFlight)
            if let orderingKey {
                state.inFlightByOrderingKey[orderingKey, default: 0] += 1
                state.mostInFlightByOrderingKey[orderingKey] = max(state.mostInFlightByOrderingKey[orderingKey] ?? 0, state.inFlightByOrderingKey[orderingKey]!)
            }
            return state.calls
        }
        // In flight until it returns or its caller cancels it: a cancelled request is withdrawn
        // (a copy that still lands is a duplicate its Idempotency-Key lets the origin ignore).
        let withdraw = { @Sendable [state] in
            state.withLock { state in
                guard state.live.remove(call) != nil else { return }
                state.inFlight -= 1
                if let orderingKey { state.inFlightByOrderingKey[orderingKey, default: 1] -= 1 }
            }
        }
        defer { withdraw() }
        return try await withTaskCancellationHandler {
            try await exchange(request)
        } onCancel: {
            withdraw()
        }
    }

    private func exchange(_ request: URLRequest) async throws -> (Data, URLResponse) {
        let (simulation, host) = state.withLock { state -> (Simulation?, Host) in
            state.requests += 1
            if let name = request.value(forHTTPHeaderField: "X-Sim-Request") { state.attempts[name, default: 0] += 1 }
            return (state.simulation, state.hosts[request.url?.host ?? ""] ?? Host())
        }
        guard let simulation, let url = request.url else { throw NetworkError.invalidRequest(reason: "no simulation") }
        simulation.record("net \(request.httpMethod ?? "GET") \(url.path)\(request.value(forHTTPHeaderField: "X-Sim-Mutation").map { " [\($0)]" } ?? "")")
        try Task.checkCancellation()
        if simulation.isOffline { throw NetworkError.noConnection }
        let faults = host.faults
        if simulation.chance(faults.refused) { throw NetworkError.transport(.cannotConnectToHost) }
        let latency = simulation.random(in: host.latency)
        let timeout = Duration.milliseconds(Int((request.timeoutInterval * 1_000).rounded()))
        if simulation.chance(faults.timeout) || latency > timeout {
            try await simulation.clock.sleep(for: timeout)
            throw NetworkError.timedOut
        }
        // Half the latency out, half back; the origin acts in between.
        try await simulation.clock.sleep(for: latency / 2)
        if simulation.isOffline { throw NetworkError.noConnection }
        if simulation.chance(faults.resetBefore) { throw NetworkError.transport(.connectionLost) }
        if simulation.chance(faults.serverError) {
            try await simulation.clock.sleep(for: latency / 2)
            return response(url, status: simulation.pick([500, 502, 504]), headers: [:], body: Data())
        }
        if simulation.chance(faults.throttled) {
            try await simulation.clock.sleep(for: latency / 2)
            let seconds = simulation.random(in: 1...3)
            return response(url, status: simulation.pick([429, 503]), headers: ["Retry-After": "\(seconds)"], body: Data())
        }
        let answer = simulation.origin.handle(request, at: simulation.now)
        if simulation.chance(faults.resetAfter) { throw NetworkError.transport(.connectionLost) }
        try await simulation.clock.sleep(for: latency - latency / 2)
        if simulation.isOffline { throw NetworkError.transport(.connectionLost) }
        return response(url, status: answer.status, headers: answer.headers, body: answer.body)
    }

    private func response(_ url: URL, status: Int, headers: [String: String], body: Data) -> (Data, URLResponse) {
        let response = HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: headers)!
        return (body, response)
    }
}
