/// One transition of a circuit breaker, as delivered by `CircuitBreaker.stateChanges` and
/// `CircuitBreakerRegistry.stateChanges`.
public struct CircuitBreakerStateChange: Sendable, Hashable {
    /// The authority of the breaker's host (lower-cased `host[:port]`) for a breaker of a
    /// `CircuitBreakerRegistry`; `nil` for a breaker made on its own.
    public let host: String?
    public let from: CircuitBreaker.State
    public let to: CircuitBreaker.State

    public init(host: String?, from: CircuitBreaker.State, to: CircuitBreaker.State) {
        self.host = host
        self.from = from
        self.to = to
    }
}
