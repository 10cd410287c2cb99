import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// One limiter per authority (`CircuitBreakerRegistry.authority(of:)`: host lower-cased, with its
/// port), made on first use: the engine's `Configuration.limits.concurrencyPerHost` (a `ConcurrencyLimiter`
/// each) and `Configuration.limits.ratePerHost` (a `RateLimiter` each).
///
/// Bounded against a caller that reaches very many hosts: at `maximumHosts` limiters, the idle
/// ones (a concurrency limiter with nothing running and nobody waiting, a rate limiter with a full
/// bucket) are dropped before a new one is kept; when none is idle, the new host's limiter is not
/// kept (each of its attempts is then limited on its own) until some are. The engine looks the
/// limiter up for each attempt, so a dropped one, idle when dropped, is not used again.
final class HostLimiters<Limiter: AnyObject & Sendable>: Sendable {
    static var maximumHosts: Int { 1_024 }
    private struct Table {
        var limiters: [String: Limiter] = [:]
        /// The last authority asked for and its limiter: most engines call one host at a time,
        /// and comparing two small strings costs less than hashing one. Forgotten when the table
        /// drops limiters.
        var last: (authority: String, limiter: Limiter)?
    }

    private let table = Locked<Table>(Table())
    private let make: @Sendable () -> Limiter
    private let isIdle: @Sendable (Limiter) -> Bool

    init(make: @escaping @Sendable () -> Limiter, isIdle: @escaping @Sendable (Limiter) -> Bool) {
        self.make = make
        self.isIdle = isIdle
    }

    /// The limiter for an authority as `CircuitBreakerRegistry.authority(of:)` writes it.
    func limiter(forAuthority authority: String) -> Limiter {
        table.withLock { table in
            if let last = table.last, last.authority == authority { return last.limiter }
            if let limiter = table.limiters[authority] {
                table.last = (authority, limiter)
                return limiter
            }
            if table.limiters.count >= Self.maximumHosts {
                table.limiters = table.limiters.filter { !isIdle($0.value) }
                table.last = nil
            }
            let limiter = make()
            if table.limiters.count < Self.maximumHosts {
                table.limiters[authority] = limiter
                table.last = (authority, limiter)
            }
            return limiter
        }
    }

    /// The limiter kept for an authority, without making one.
    func existing(forAuthority authority: String) -> Limiter? {
        table.withLock { $0.limiters[authority] }
    }

    /// Every limiter kept now, by authority.
    var all: [String: Limiter] { table.withLock { $0.limiters } }

    /// Limiters kept now (for tests).
    var count: Int { table.withLock { $0.limiters.count } }
}

extension HostLimiters where Limiter == ConcurrencyLimiter {
    convenience init(maxConcurrent: Int, maxWaiting: Int) {
        self.init(
            make: { ConcurrencyLimiter(maxConcurrent: maxConcurrent, maxWaiting: maxWaiting) },
            isIdle: { $0.inFlight == 0 && $0.waiting == 0 }
        )
    }
}

extension HostLimiters where Limiter == RateLimiter {
    convenience init(_ limit: HostRateLimit, time: TimeSource) {
        self.init(
            make: { RateLimiter(permitsPerSecond: limit.permitsPerSecond, burst: limit.burst, maxWait: limit.maxWait, time: time) },
            isIdle: { $0.availablePermits >= $0.burst }
        )
    }
}

extension HostLimiters where Limiter == RetryThrottle {
    /// One `RetryThrottle` per host; one with a full count is idle (dropping it forgets nothing).
    convenience init(throttling: RetryThrottling) {
        self.init(make: { RetryThrottle(throttling) }, isIdle: { $0.isFull })
    }
}

extension HostLimiters where Limiter == AdaptiveConcurrencyLimiter {
    /// One `AdaptiveConcurrencyLimiter` per host; one with nothing running and nobody waiting is
    /// idle (dropped when the table is full, it forgets the limit it learnt).
    convenience init(_ configuration: AdaptiveConcurrencyLimiter.Configuration, clock: some Clock<Duration>) {
        self.init(
            make: { AdaptiveConcurrencyLimiter(configuration: configuration, clock: clock) },
            isIdle: { $0.inFlight == 0 && $0.waiting == 0 }
        )
    }
}

/// A token bucket per host for `AsyncRequestEngine.Configuration.limits.ratePerHost` (see `RateLimiter`:
/// `permitsPerSecond` on average, `burst` at once after a quiet spell, a call without a token
/// waiting up to `maxWait` for one, else refused).
public struct HostRateLimit: Sendable, Hashable {
    public var permitsPerSecond: Double
    public var burst: Int
    public var maxWait: Duration

    /// Values are clamped as `RateLimiter` clamps them.
    public init(permitsPerSecond: Double, burst: Int = 1, maxWait: Duration = .zero) {
        self.permitsPerSecond = permitsPerSecond
        self.burst = burst
        self.maxWait = maxWait
    }
}
