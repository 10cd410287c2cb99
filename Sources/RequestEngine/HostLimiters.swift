import Foundation
import Retry
import ResilienceCore

/// One `ConcurrencyLimiter` per authority (`CircuitBreakerRegistry.authority(of:)`: host
/// lower-cased, with its port), made on first use: the engine's `Options.maxConcurrentPerHost`.
///
/// Bounded against a caller that reaches very many hosts: beyond `maximumHosts` limiters, the
/// idle ones (nothing running, nobody waiting) are dropped before a new one is made. A request
/// that already holds a dropped limiter keeps using it, so for a moment a host may have two; its
/// limit can then be exceeded by at most the dropped limiter's in-flight count, which was zero.
final class HostLimiters: Sendable {
    let maxConcurrent: Int
    let maxWaiting: Int
    static let maximumHosts = 1_024
    private let table = Locked<[String: ConcurrencyLimiter]>([:])

    init(maxConcurrent: Int, maxWaiting: Int) {
        self.maxConcurrent = max(1, maxConcurrent)
        self.maxWaiting = max(0, maxWaiting)
    }

    /// The limiter for `url`'s authority; `nil` for a URL without a host (the request is then
    /// refused as invalid before anything is sent).
    func limiter(for url: URL) -> ConcurrencyLimiter? {
        guard let authority = CircuitBreakerRegistry.authority(of: url) else { return nil }
        return table.withLock { table in
            if let limiter = table[authority] { return limiter }
            if table.count >= Self.maximumHosts {
                table = table.filter { $0.value.inFlight > 0 || $0.value.waiting > 0 }
            }
            let limiter = ConcurrencyLimiter(maxConcurrent: maxConcurrent, maxWaiting: maxWaiting)
            table[authority] = limiter
            return limiter
        }
    }

    /// Limiters kept now (for tests).
    var count: Int { table.withLock { $0.count } }
}
