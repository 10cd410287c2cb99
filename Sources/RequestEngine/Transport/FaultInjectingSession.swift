import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A fault `FaultInjectingSession` injects into a share (`rate`, 0 ... 1) of calls.
public enum InjectedFault: Sendable, Hashable {
    /// Waits this long on the session's clock before going on (negative waits nothing).
    case latency(Duration, rate: Double)
    /// Fails the call as the URLSession path fails for this failure, without calling the wrapped
    /// session: it throws the `URLError` that `NetworkError(mapping:)` turns into
    /// `NetworkError.transport(failure)`.
    case transport(TransportFailure, rate: Double)
    /// Answers with this status and an empty body, without calling the wrapped session.
    case status(Int, rate: Double)

    /// The share of calls it applies to, clamped to 0 ... 1 (NaN → 0).
    public var rate: Double {
        let rate =
            switch self {
            case .latency(_, let rate), .transport(_, let rate), .status(_, let rate): rate
            }
        return rate.isNaN ? 0 : min(1, max(0, rate))
    }
}

/// A `NetworkSession` decorator that injects latency, transport failures and chosen statuses into
/// a share of calls, so a team can rehearse an outage in staging and a test can script one without
/// a server.
///
/// **The rule, per call, while enabled**: the faults are taken in list order and each draws one
/// number from the seeded generator (every fault draws on every call, so a fault's decisions depend
/// only on the seed and the call's position, not on what the other faults did). A `.latency` that
/// fires waits, then evaluation goes on; the first `.transport` or `.status` that fires ends the
/// call (later faults still draw but do nothing); if none does, the wrapped session is called.
/// So `[.latency(.seconds(2), rate: 0.1), .status(503, rate: 0.05)]` delays 10 % of calls and
/// answers 5 % with 503 — some of them after the delay.
///
/// - **Deterministic**: the same seed and the same order of calls give the same faults. Calls
///   made concurrently draw in the order they reach the session.
/// - **`isEnabled`** (thread-safe, switchable at any time): while `false` every call goes straight
///   to the wrapped session and nothing is drawn; the sequence resumes where it stopped.
/// - **Cancellation**: a caller cancelled during an injected latency gets `URLError(.cancelled)`
///   at once, as from URLSession, and the wrapped session is not called.
/// - A `.status` response is an `HTTPURLResponse` for the request's URL with no headers; a status
///   `HTTPURLResponse` cannot represent makes the call throw `URLError(.badServerResponse)`.
public final class FaultInjectingSession: NetworkSession {
    /// The session calls go to when no fault ends them.
    public let wrapped: any NetworkSession
    /// The faults, in evaluation order.
    public let faults: [InjectedFault]

    private struct State: Sendable {
        var isEnabled = true
        var generator: SeededGenerator
    }

    /// What the faults decided for one call.
    private struct Plan: Sendable {
        var latency: Duration = .zero
        var ending: InjectedFault?
    }

    private let state: Locked<State>
    private let time: TimeSource

    /// - Parameters:
    ///   - session: the session to call when no fault ends the call.
    ///   - faults: evaluated in order (see the type's rule); rates are clamped to 0 ... 1.
    ///   - seed: the generator's seed; the same seed gives the same faults.
    ///   - clock: the clock injected latency sleeps on.
    public init(
        wrapping session: any NetworkSession,
        faults: [InjectedFault],
        seed: UInt64,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.wrapped = session
        self.faults = faults
        self.state = Locked(State(generator: SeededGenerator(seed: seed)))
        self.time = TimeSource(clock)
    }

    /// Whether faults are injected; `false` passes every call straight through. Safe to switch
    /// from any thread at any time; a call already past its draw keeps its faults.
    public var isEnabled: Bool {
        get { state.withLock { $0.isEnabled } }
        set { state.withLock { $0.isEnabled = newValue } }
    }

    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        if let answer = try await inject(for: request) { return answer }
        return try await wrapped.data(for: request)
    }

    /// Keeps the wrapped session's own size limit (a streaming transport stops an oversized body
    /// as it arrives).
    public func data(for request: URLRequest, maximumBodySize: Int?) async throws -> (Data, URLResponse) {
        if let answer = try await inject(for: request) { return answer }
        return try await wrapped.data(for: request, maximumBodySize: maximumBodySize)
    }

    /// Applies this call's faults: returns the synthetic answer of a `.status`, throws for a
    /// `.transport` or a cancelled latency, or returns `nil` to call the wrapped session.
    private func inject(for request: URLRequest) async throws -> (Data, URLResponse)? {
        guard let plan = plan() else { return nil }
        if plan.latency > .zero {
            do {
                try await time.sleep(plan.latency)
            } catch {
                throw URLError(.cancelled)
            }
        }
        switch plan.ending {
        case nil, .latency?:
            if Task.isCancelled { throw URLError(.cancelled) }
            return nil
        case .transport(let failure, _)?:
            throw Self.urlError(for: failure)
        case .status(let status, _)?:
            let url = request.url ?? URL(fileURLWithPath: "/")
            guard let response = HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: [:]) else {
                throw URLError(.badServerResponse)
            }
            return (Data(), response)
        }
    }

    /// Draws for every fault (under the lock, so concurrent calls take whole turns); `nil` when disabled.
    private func plan() -> Plan? {
        let faults = faults
        return state.withLock { state -> Plan? in
            guard state.isEnabled, !faults.isEmpty else { return nil }
            var plan = Plan()
            for fault in faults {
                // 53 random bits → uniform in [0, 1); rate 1 always fires, rate 0 never.
                let draw = Double(state.generator.next() >> 11) * 0x1p-53
                guard draw < fault.rate, plan.ending == nil else { continue }
                switch fault {
                case .latency(let duration, _):
                    // Each wait is capped (at about 35 000 years) so that no list of faults can
                    // overflow the sum.
                    if duration > .zero { plan.latency += min(duration, .seconds(Int64(1) << 40)) }
                case .transport, .status:
                    plan.ending = fault
                }
            }
            return plan
        }
    }

    /// The `URLError` URLSession reports for each failure (the inverse of `NetworkError(mapping:)`).
    static func urlError(for failure: TransportFailure) -> URLError {
        switch failure {
        case .cannotConnectToHost: URLError(.cannotConnectToHost)
        case .connectionLost: URLError(.networkConnectionLost)
        case .dnsFailure: URLError(.cannotFindHost)
        case .secureConnectionFailed: URLError(.secureConnectionFailed)
        }
    }
}
