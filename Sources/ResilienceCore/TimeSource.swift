#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A type-erased `Clock<Duration>`: reads "now" as the time elapsed since the source was made,
/// and sleeps. Lets non-generic types (engines, budgets, breakers) take any injected clock,
/// `ContinuousClock` in production and `ManualClock` in tests.
package struct TimeSource: Sendable {
    /// Elapsed time since this source was created, on the injected clock.
    package let now: @Sendable () -> Duration
    /// Sleeps for the given duration on the injected clock; throws `CancellationError` when cancelled.
    package let sleep: @Sendable (Duration) async throws -> Void

    package init<C: Clock>(_ clock: C) where C.Duration == Duration {
        // The production clock without generic dispatch: the engine reads it for every attempt's
        // deadline, and reading it through the type-erased generic path costs several times more.
        if let continuous = clock as? ContinuousClock {
            #if os(Linux)
            // The clock ContinuousClock reads on Linux, read straight: half the instructions of
            // `ContinuousClock.now` and an `Instant` subtraction, and it is read per attempt.
            let origin = Self.bootTimeNanoseconds()
            let now: @Sendable () -> Duration = { .nanoseconds(Self.bootTimeNanoseconds() &- origin) }
            #else
            let origin = continuous.now
            let now: @Sendable () -> Duration = { origin.duration(to: ContinuousClock.now) }
            #endif
            self.init(
                now: now,
                sleep: { duration in
                    try await continuous.sleep(until: ContinuousClock.now.advanced(by: duration), tolerance: nil)
                }
            )
            return
        }
        let origin = clock.now
        self.init(
            now: { origin.duration(to: clock.now) },
            sleep: { duration in
                try await clock.sleep(until: clock.now.advanced(by: duration), tolerance: nil)
            }
        )
    }

    private init(now: @escaping @Sendable () -> Duration, sleep: @escaping @Sendable (Duration) async throws -> Void) {
        self.now = now
        self.sleep = sleep
    }

    package static let continuous = TimeSource(ContinuousClock())

    #if os(Linux)
    /// `CLOCK_BOOTTIME` (what `ContinuousClock` is on Linux: it goes on while the system
    /// sleeps) in nanoseconds.
    @inline(__always)
    private static func bootTimeNanoseconds() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_BOOTTIME, &time)
        return Int64(time.tv_sec) &* 1_000_000_000 &+ Int64(time.tv_nsec)
    }
    #endif
}

extension Duration {
    /// The duration in seconds as a `Double` (the unit `TimeInterval` uses).
    package var seconds: Double {
        // One 128-bit-to-Double division: `components` divides the 128-bit count of attoseconds
        // by 10^18, several times the cost, and this is read for every sample of an adaptive limit.
        self / .seconds(1)
    }

    /// A duration from seconds, with non-finite or negative input mapped to zero and very large
    /// values saturated at `upperBound`, so no input can trap.
    package static func clamped(seconds: Double, upperBound: Duration) -> Duration {
        guard seconds.isFinite, seconds > 0 else {
            return seconds == .infinity ? upperBound : .zero
        }
        guard seconds < upperBound.seconds else { return upperBound }
        let nanoseconds = (seconds * 1e9).rounded()
        guard nanoseconds < 9.2e18 else { return min(upperBound, .seconds(seconds.rounded())) }
        return .nanoseconds(Int64(nanoseconds))
    }
}
