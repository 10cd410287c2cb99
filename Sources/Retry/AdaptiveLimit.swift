@_spi(ResilienceCore) import ResilienceCore

/// How an `AdaptiveConcurrencyLimiter` finds its limit: from the latency and the drops of the
/// operations it lets through.
///
/// - `.gradient()`: compares the latency of the last window of operations with a long-run
///   baseline. While latency holds (within `tolerance` of the baseline), the limit grows by a
///   queue allowance each window; as latency rises above it, the limit shrinks in proportion
///   (at most by half a window). The style of Netflix's Gradient2, with one change: latency that
///   rose with more in flight than when it was last at the baseline is the queue the limit
///   itself builds, and the baseline does not follow it (Gradient2's does, so its limit grows
///   with its own queue until the upstream drops requests). The baseline follows rising latency
///   with no more in flight (within `tolerance`), or with at most half as many (beyond it: the
///   upstream itself became slower).
/// - `.aimd()`: grows by one for each round trip of successes while the limit is in use (a
///   limit's worth of successes adds one place, as TCP's congestion avoidance does), and
///   multiplies the limit by `backoff` on a drop (a timeout, a 429 or 503, a failed connection).
///
/// Both decrease at most once per round trip: after a decrease, drops of operations that began
/// before it do not decrease the limit again (TCP's rule: one burst of losses is one signal).
/// Both also shrink by `backoff` on a drop, and neither grows while the limit is not in use (fewer
/// than half its places taken): an idle limiter learns nothing about capacity.
public struct AdaptiveLimitAlgorithm: Sendable, Equatable {
    enum Kind: Sendable, Equatable {
        case gradient(tolerance: Double, smoothing: Double, queueAllowance: Double, longWindow: Int, windowSamples: Int)
        case aimd
    }

    let kind: Kind
    /// The factor the limit is multiplied by on a drop.
    let backoff: Double

    /// The gradient algorithm.
    ///
    /// - Parameters:
    ///   - tolerance: how much slower than the baseline the last window may be before the limit
    ///     shrinks (1.25: a quarter slower, the buffer Envoy's adaptive concurrency filter
    ///     allows over its minimum round trip). At least 1.
    ///   - smoothing: how much of each window's new estimate is taken (0.2: a fifth). In 0.01…1.
    ///   - queueAllowance: places added each window while latency holds: room for a short queue
    ///     at the upstream, which is what lets the limit find more capacity. At least 0.
    ///   - longWindow: how many windows the baseline averages over (it follows rising latency
    ///     slowly, so a slow upstream shows as a gradient; it falls back fast when latency drops).
    ///   - windowSamples: operations per window. At least 1.
    ///   - backoff: the factor applied on a drop. In 0.1…1.
    public static func gradient(
        tolerance: Double = 1.25,
        smoothing: Double = 0.2,
        queueAllowance: Double = 4,
        longWindow: Int = 100,
        windowSamples: Int = 10,
        backoff: Double = 0.9
    ) -> AdaptiveLimitAlgorithm {
        AdaptiveLimitAlgorithm(
            kind: .gradient(
                tolerance: Self.clamp(tolerance, 1, 100, default: 1.25),
                smoothing: Self.clamp(smoothing, 0.01, 1, default: 0.2),
                queueAllowance: Self.clamp(queueAllowance, 0, 1_000, default: 4),
                longWindow: max(1, longWindow),
                windowSamples: max(1, windowSamples)
            ),
            backoff: Self.clamp(backoff, 0.1, 1, default: 0.9)
        )
    }

    /// The AIMD algorithm: `+1` per limit's worth of successes while the limit is in use (one
    /// place per round trip), `× backoff` on a drop.
    public static func aimd(backoff: Double = 0.9) -> AdaptiveLimitAlgorithm {
        AdaptiveLimitAlgorithm(kind: .aimd, backoff: Self.clamp(backoff, 0.1, 1, default: 0.9))
    }

    /// `value` within `low…high`; NaN is `fallback`.
    private static func clamp(_ value: Double, _ low: Double, _ high: Double, default fallback: Double) -> Double {
        value.isNaN ? fallback : min(high, max(low, value))
    }
}

/// An adaptive limit as a value with no clock and no I/O: it takes one sample per finished
/// operation (when it began and ended on the limiter's clock, how many were in flight, whether
/// it was a drop) and says what the limit is now. `AdaptiveConcurrencyLimiter` owns one.
struct AdaptiveLimitEstimator: Sendable {
    let algorithm: AdaptiveLimitAlgorithm
    let minLimit: Double
    let maxLimit: Double
    /// The limit, kept fractional so that small steps add up.
    private(set) var estimate: Double

    /// When the limit last went down: drops of operations that began before it are the same signal.
    private var lastDecrease: Duration?
    /// AIMD: successes counted toward the next place.
    private var successesSinceGrowth = 0

    // The gradient's window (its latencies summed as a `Duration`, turned into seconds once a
    // window: the conversion costs more than the rest of a sample) and its baseline, in seconds.
    private var windowSum = Duration.zero
    private var windowCount = 0
    private var windowPeakInFlight = 0
    private(set) var baseline: Double?
    /// The peak in flight of the last window whose latency was at or below the baseline.
    private var baselineInFlight = 0

    init(algorithm: AdaptiveLimitAlgorithm, minLimit: Int, maxLimit: Int, initialLimit: Int) {
        self.algorithm = algorithm
        self.minLimit = Double(minLimit)
        self.maxLimit = Double(maxLimit)
        estimate = Double(min(maxLimit, max(minLimit, initialLimit)))
    }

    /// The limit as a whole number of places, never below `minLimit` nor above `maxLimit`.
    var limit: Int { Int(estimate.rounded(.down)) }

    /// One finished operation. `inFlight` counts it (the places taken when it ended, itself
    /// included). A latency of zero or less (a clock that went backwards) is not used by the
    /// gradient; a drop, and for AIMD a success, still counts.
    mutating func record(began: Duration, ended: Duration, inFlight: Int, dropped: Bool) {
        if dropped {
            // One decrease per round trip: an operation that began before the last decrease was
            // already counted in it.
            if let lastDecrease, began < lastDecrease { return }
            estimate = max(minLimit, estimate * algorithm.backoff)
            lastDecrease = ended
            successesSinceGrowth = 0
            resetWindow()
            return
        }
        let inUse = Double(inFlight) * 2 >= estimate
        switch algorithm.kind {
        case .aimd:
            // A success is a success, whatever the clock says of its latency. One place per
            // round trip: a limit's worth of successes adds one (TCP's congestion avoidance), so
            // growth weighs as much as the once-per-round-trip decrease does.
            guard inUse else { return }
            successesSinceGrowth += 1
            if Double(successesSinceGrowth) >= estimate.rounded(.down) {
                successesSinceGrowth = 0
                estimate = min(maxLimit, estimate + 1)
            }
        case .gradient(let tolerance, let smoothing, let queueAllowance, let longWindow, let windowSamples):
            let latency = ended - began
            guard latency > .zero else { return }
            windowSum += latency
            windowCount += 1
            windowPeakInFlight = max(windowPeakInFlight, inFlight)
            guard windowCount >= windowSamples else { return }
            let short = windowSum.seconds / Double(windowCount)
            let peak = windowPeakInFlight
            resetWindow()
            let rate = 2 / (Double(longWindow) + 1)
            var long: Double
            if let baseline {
                if short <= baseline {
                    long = baseline + (short - baseline) * rate
                    baselineInFlight = peak
                } else if peak <= baselineInFlight, short <= baseline * tolerance {
                    // A little slower with no more in flight than when it was last this fast.
                    long = baseline + (short - baseline) * rate
                } else if peak * 2 <= baselineInFlight {
                    // Slower although at most half as many are in flight as when it was last this
                    // fast: the upstream itself became slower. Follow it.
                    long = baseline + (short - baseline) * rate
                } else {
                    // Slower with more in flight: the queue the limit itself builds. Not followed —
                    // were it, the limit would grow with its own queue (Gradient2's drift) until
                    // the upstream dropped requests.
                    long = baseline
                }
            } else {
                long = short
                baselineInFlight = peak
            }
            // Latency fell well below the baseline (the upstream recovered, or the baseline was
            // set under load): the baseline follows it down quickly.
            if long / short > 2 { long *= 0.95 }
            baseline = long
            // Not in use: latency says nothing about how many more the upstream could take.
            guard Double(peak) * 2 >= estimate else { return }
            let gradient = max(0.5, min(1, tolerance * long / short))
            let before = estimate
            let proposed = estimate * gradient + queueAllowance
            estimate = min(maxLimit, max(minLimit, estimate * (1 - smoothing) + proposed * smoothing))
            if estimate < before { lastDecrease = ended }
        }
    }

    private mutating func resetWindow() {
        windowSum = .zero
        windowCount = 0
        windowPeakInFlight = 0
    }
}
