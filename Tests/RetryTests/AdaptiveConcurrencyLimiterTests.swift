@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

/// The algorithms as values: samples in, a limit out, no clock.
@Suite("AdaptiveLimitEstimator: AIMD and gradient")
struct AdaptiveLimitEstimatorTests {
    /// `count` samples of `latency` each, ending one after the other from `at`, with `inFlight` in flight.
    static func feed(_ estimator: inout AdaptiveLimitEstimator, count: Int, latency: Duration, inFlight: Int, from start: inout Duration) {
        for _ in 0..<count {
            estimator.record(began: start, ended: start + latency, inFlight: inFlight, dropped: false)
            start += .milliseconds(1)
        }
    }

    @Test func aimdGrowsByOnePerRoundTripOfSuccessesWhileTheLimitIsInUse() {
        var aimd = AdaptiveLimitEstimator(algorithm: .aimd(), minLimit: 2, maxLimit: 30, initialLimit: 10)
        var now = Duration.zero
        Self.feed(&aimd, count: 9, latency: .milliseconds(20), inFlight: 10, from: &now)
        #expect(aimd.limit == 10)
        Self.feed(&aimd, count: 1, latency: .milliseconds(20), inFlight: 10, from: &now)
        #expect(aimd.limit == 11)  // a limit's worth of successes: one place
        Self.feed(&aimd, count: 11, latency: .milliseconds(20), inFlight: 11, from: &now)
        #expect(aimd.limit == 12)
        Self.feed(&aimd, count: 50, latency: .milliseconds(20), inFlight: 3, from: &now)  // fewer than half in use
        #expect(aimd.limit == 12)
        Self.feed(&aimd, count: 1_000, latency: .milliseconds(20), inFlight: 30, from: &now)
        #expect(aimd.limit == 30)  // the ceiling
    }

    @Test func aimdBacksOffOncePerRoundTripAndNeverBelowTheFloor() {
        var aimd = AdaptiveLimitEstimator(algorithm: .aimd(backoff: 0.5), minLimit: 3, maxLimit: 100, initialLimit: 40)
        aimd.record(began: .seconds(1), ended: .seconds(2), inFlight: 40, dropped: true)
        #expect(aimd.limit == 20)
        // Dropped calls that began before that decrease are the same burst: no second decrease.
        aimd.record(began: .milliseconds(1_500), ended: .milliseconds(2_100), inFlight: 20, dropped: true)
        #expect(aimd.limit == 20)
        // One that began after it is a new signal.
        aimd.record(began: .milliseconds(2_001), ended: .seconds(3), inFlight: 20, dropped: true)
        #expect(aimd.limit == 10)
        for second in 4..<20 { aimd.record(began: .seconds(second), ended: .seconds(second) + .milliseconds(1), inFlight: 5, dropped: true) }
        #expect(aimd.limit == 3)  // the floor
    }

    @Test func zeroOrBackwardsLatencyIsIgnoredButADropOrAnAIMDSuccessStillCounts() {
        var aimd = AdaptiveLimitEstimator(algorithm: .aimd(), minLimit: 1, maxLimit: 100, initialLimit: 10)
        for _ in 0..<5 {
            aimd.record(began: .seconds(5), ended: .seconds(5), inFlight: 10, dropped: false)
            aimd.record(began: .seconds(5), ended: .seconds(4), inFlight: 10, dropped: false)
        }
        #expect(aimd.limit == 11)  // AIMD counts successes, not latency
        aimd.record(began: .seconds(5), ended: .seconds(4), inFlight: 10, dropped: true)
        #expect(aimd.limit == 9)  // 11 × 0.9 = 9.9

        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(windowSamples: 2), minLimit: 1, maxLimit: 100, initialLimit: 10)
        for _ in 0..<10 { gradient.record(began: .seconds(5), ended: .seconds(4), inFlight: 10, dropped: false) }
        #expect(gradient.baseline == nil)  // no window was ever filled
        #expect(gradient.limit == 10)
    }

    @Test func gradientGrowsWhileLatencyHolds() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 4, maxLimit: 200, initialLimit: 20)
        var now = Duration.zero
        var limits: [Int] = []
        for _ in 0..<30 {
            Self.feed(&gradient, count: 10, latency: .milliseconds(100), inFlight: gradient.limit, from: &now)
            limits.append(gradient.limit)
        }
        #expect(limits == limits.sorted())  // never shrinks while latency holds
        #expect(limits.last! > 40)  // the queue allowance, four places a window, a fifth taken each time
    }

    @Test func gradientShrinksAsLatencyRisesAndGrowsAgainWhenItRecovers() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 4, maxLimit: 500, initialLimit: 100)
        var now = Duration.zero
        for _ in 0..<50 { Self.feed(&gradient, count: 10, latency: .milliseconds(100), inFlight: gradient.limit, from: &now) }
        let settled = gradient.limit
        for _ in 0..<10 { Self.feed(&gradient, count: 10, latency: .milliseconds(400), inFlight: gradient.limit, from: &now) }
        let slowed = gradient.limit
        #expect(slowed < settled / 2)  // four times as slow: a fifth of each window's halving taken, ten times
        for _ in 0..<200 { Self.feed(&gradient, count: 10, latency: .milliseconds(100), inFlight: gradient.limit, from: &now) }
        #expect(gradient.limit > slowed * 2)  // latency back: it grows again
    }

    @Test func gradientNeverLeavesItsFloorAndCeiling() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 10, maxLimit: 24, initialLimit: 20)
        var now = Duration.zero
        for _ in 0..<200 { Self.feed(&gradient, count: 10, latency: .milliseconds(10), inFlight: 24, from: &now) }
        #expect(gradient.limit == 24)
        // Latency growing by a third each window stays well above the baseline, which follows slowly.
        var latency = 10.0
        for _ in 0..<60 {
            latency *= 1.3
            Self.feed(&gradient, count: 10, latency: .milliseconds(Int64(latency)), inFlight: 24, from: &now)
        }
        #expect(gradient.limit == 10)
    }

    /// Against an upstream of 10 workers (latency 100 ms × in flight / 10 past 10 in flight), the
    /// limit stays near `tolerance × 10 + queueAllowance` for thousands of windows: the baseline
    /// does not follow the queue the limit builds (Gradient2's would, and the limit with it).
    @Test func gradientsBaselineDoesNotFollowTheQueueItsLimitBuilds() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 1, maxLimit: 1_000, initialLimit: 5)
        var now = Duration.zero
        var limits: [Int] = []
        for _ in 0..<3_000 {
            let inFlight = gradient.limit
            let latency = Duration.milliseconds(Int64(100 * max(1, Double(inFlight) / 10)))
            Self.feed(&gradient, count: 10, latency: latency, inFlight: inFlight, from: &now)
            limits.append(gradient.limit)
        }
        let earlier = limits[1_000..<2_000]
        let late = limits.suffix(1_000)
        #expect(late.min()! >= 10)  // keeps every worker busy
        #expect(late.max()! <= 24)  // about 1.25 × 10 + 4 = 16.5, and its swing
        func mean(_ values: ArraySlice<Int>) -> Double { Double(values.reduce(0, +)) / Double(values.count) }
        #expect(mean(late) - mean(earlier) < 1)  // no drift upward
    }

    /// An upstream of 100 workers that becomes twice as slow for good: the limit first falls
    /// (latency doubled), then, as the latency stays doubled with far fewer in flight, the
    /// baseline follows it and the limit grows back to the upstream's capacity.
    @Test func gradientFollowsAnUpstreamThatBecameSlowerForGood() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 1, maxLimit: 1_000, initialLimit: 20)
        var now = Duration.zero
        func run(windows: Int, serviceTime: Double) -> [Int] {
            var limits: [Int] = []
            for _ in 0..<windows {
                let inFlight = gradient.limit
                let latency = Duration.milliseconds(Int64(serviceTime * max(1, Double(inFlight) / 100)))
                Self.feed(&gradient, count: 10, latency: latency, inFlight: inFlight, from: &now)
                limits.append(gradient.limit)
            }
            return limits
        }
        let healthy = run(windows: 1_000, serviceTime: 100)
        #expect(healthy.suffix(100).min()! >= 100)
        let slower = run(windows: 2_000, serviceTime: 200)
        #expect(slower.prefix(300).min()! < 50)  // latency doubled: the limit fell
        #expect(slower.suffix(100).min()! >= 100)  // and grew back once the baseline followed
    }

    @Test func gradientDoesNotGrowWhileTheLimitIsNotInUse() {
        var gradient = AdaptiveLimitEstimator(algorithm: .gradient(), minLimit: 4, maxLimit: 200, initialLimit: 20)
        var now = Duration.zero
        for _ in 0..<20 { Self.feed(&gradient, count: 10, latency: .milliseconds(100), inFlight: 5, from: &now) }
        #expect(gradient.limit == 20)
    }
}

/// The limiter on a ManualClock: places, the line, the partitions, cancellation.
@Suite("AdaptiveConcurrencyLimiter", .timeLimit(.minutes(1)))
struct AdaptiveConcurrencyLimiterTests {
    /// A limiter whose line only `waiting` bounds, unless `perLimit` says otherwise.
    static func limiter(
        min: Int = 1, max: Int = 100, initial: Int, waiting: Int = 100, perLimit: Double = .infinity, share: Double = 0.25, algorithm: AdaptiveLimitAlgorithm = .aimd(),
        clock: ManualClock = ManualClock()
    ) throws -> AdaptiveConcurrencyLimiter {
        AdaptiveConcurrencyLimiter(
            configuration: try .init(
                algorithm: algorithm, minLimit: min, maxLimit: max, maxWaiting: waiting, maxWaitingPerLimit: perLimit,
                initialLimit: initial, interactiveShare: share
            ),
            clock: clock
        )
    }

    @Test func aConfigurationThatCannotWorkIsAnErrorAtConstruction() {
        #expect(throws: AdaptiveConcurrencyLimiter.ConfigurationError.minimumAboveMaximum(minLimit: 10, maxLimit: 5)) {
            try AdaptiveConcurrencyLimiter(algorithm: .gradient(), minLimit: 10, maxLimit: 5, maxWaiting: 10)
        }
        #expect(throws: AdaptiveConcurrencyLimiter.ConfigurationError.nonPositiveLimit(minLimit: 0, maxLimit: 5)) {
            try AdaptiveConcurrencyLimiter(algorithm: .aimd(), minLimit: 0, maxLimit: 5, maxWaiting: 10)
        }
        #expect(throws: AdaptiveConcurrencyLimiter.ConfigurationError.negativeWaitLine(-1)) {
            try AdaptiveConcurrencyLimiter(algorithm: .aimd(), minLimit: 1, maxLimit: 5, maxWaiting: -1)
        }
        #expect(throws: AdaptiveConcurrencyLimiter.ConfigurationError.negativeWaitingPerLimit(-0.5)) {
            try AdaptiveConcurrencyLimiter.Configuration(algorithm: .aimd(), minLimit: 1, maxLimit: 5, maxWaiting: 1, maxWaitingPerLimit: -0.5)
        }
        #expect(throws: AdaptiveConcurrencyLimiter.ConfigurationError.shareOutOfRange(1.5)) {
            try AdaptiveConcurrencyLimiter.Configuration(algorithm: .aimd(), minLimit: 1, maxLimit: 5, maxWaiting: 1, interactiveShare: 1.5)
        }
        let defaults = AdaptiveConcurrencyLimiter(configuration: .init())
        #expect(defaults.currentLimit == 20)
        #expect(defaults.configuration.minLimit == 4 && defaults.configuration.maxLimit == 1_000)
    }

    @Test func callsBeyondTheLimitWaitInOrderAndAFullLineIsRefused() async throws {
        let limiter = try Self.limiter(initial: 2, waiting: 2, share: 0)
        let gates = (0..<4).map { _ in Gate() }
        let log = Log<Int>()
        let tasks = (0..<4).map { index in
            Task {
                try await limiter.withPermit {
                    log.append(index)
                    await gates[index].wait()
                }
            }
        }
        await yieldUntil { limiter.inFlight == 2 && limiter.waiting == 2 }
        await #expect(throws: LimiterRejection.self) { try await limiter.withPermit {} }
        let first = log.values
        for index in first { gates[index].open() }
        await yieldUntil { log.values.count == 4 }
        for gate in gates { gate.open() }
        for task in tasks { try await task.value }
        #expect(Set(log.values.prefix(2)) == Set(first))
        #expect(limiter.inFlight == 0 && limiter.waiting == 0)
    }

    @Test func latencyIsMeasuredOnTheLimitersClockAndDropsShrinkTheLimit() async throws {
        let clock = ManualClock()
        let limiter = try Self.limiter(initial: 4, algorithm: .aimd(backoff: 0.5), clock: clock)
        let held = (0..<4).map { _ in Task { try await limiter.acquire() } }
        var permits: [AdaptiveConcurrencyLimiter.Permit] = []
        for task in held { permits.append(try await task.value) }
        clock.advance(by: .milliseconds(50))
        limiter.release(permits[0], outcome: .success)  // in use, but one success of the four a place takes
        #expect(limiter.currentLimit == 4)
        limiter.release(permits[1], outcome: .dropped)
        #expect(limiter.currentLimit == 2)
        limiter.release(permits[2], outcome: .dropped)  // began before that decrease: the same burst
        #expect(limiter.currentLimit == 2)
        limiter.release(permits[3], outcome: .ignored)
        #expect(limiter.currentLimit == 2)
        #expect(limiter.inFlight == 0)
    }

    @Test func backgroundWorkLeavesTheInteractiveShareFree() async throws {
        let limiter = try Self.limiter(initial: 8, share: 0.25)  // two places kept for interactive calls
        let gate = Gate()
        let background = (0..<10).map { _ in Task { try await limiter.withPermit(priority: .background) { await gate.wait() } } }
        await yieldUntil { limiter.inFlight == 6 && limiter.waiting == 4 }
        // Interactive calls find their share free at once, background calls still waiting.
        let interactive = Gate()
        let ran = Log<Int>()
        let calls = (0..<2).map { index in
            Task {
                try await limiter.withPermit {
                    ran.append(index); await interactive.wait()
                }
            }
        }
        await yieldUntil { ran.values.count == 2 }
        #expect(limiter.inFlight == 8 && limiter.waiting == 4)
        interactive.open()
        for call in calls { try await call.value }
        gate.open()
        for task in background { try await task.value }
        #expect(limiter.inFlight == 0)
    }

    @Test func aFreedPlaceGoesToTheInteractiveWaiterFirst() async throws {
        let limiter = try Self.limiter(initial: 2, share: 0)
        let hold = Gate()
        let holders = (0..<2).map { _ in Task { try await limiter.acquire() } }
        var permits: [AdaptiveConcurrencyLimiter.Permit] = []
        for task in holders { permits.append(try await task.value) }
        let order = Log<String>()
        let background = Task { try await limiter.withPermit(priority: .background) { order.append("background") } }
        await yieldUntil { limiter.waiting == 1 }
        let interactive = Task {
            try await limiter.withPermit {
                order.append("interactive"); await hold.wait()
            }
        }
        await yieldUntil { limiter.waiting == 2 }
        limiter.release(permits[0], outcome: .ignored)
        await yieldUntil { order.values.count == 1 }
        #expect(order.values == ["interactive"])  // it came later, and went first
        limiter.release(permits[1], outcome: .ignored)
        try await background.value
        hold.open()
        try await interactive.value
        #expect(order.values == ["interactive", "background"])
    }

    @Test func whenTheLimitShrinksBackgroundWaitsWhileInteractiveStillRuns() async throws {
        let limiter = try Self.limiter(initial: 8, share: 0.25, algorithm: .aimd(backoff: 0.5))
        let first = try await limiter.acquire(priority: .background)
        limiter.release(first, outcome: .dropped)  // 8 → 4: one place kept for interactive calls, three for background
        #expect(limiter.currentLimit == 4)
        let gate = Gate()
        let background = (0..<5).map { _ in Task { try await limiter.withPermit(priority: .background) { await gate.wait() } } }
        await yieldUntil { limiter.inFlight == 3 && limiter.waiting == 2 }
        let interactive = try await limiter.withPermit { limiter.inFlight }
        #expect(interactive == 4)
        #expect(limiter.waiting == 2)
        gate.open()
        for task in background { try await task.value }
    }

    @Test func tryAcquireTakesAFreePlaceAtOnceAndNeverPassesTheLine() async throws {
        let limiter = try Self.limiter(initial: 1, share: 0)
        let held = try #require(limiter.tryAcquire())
        #expect(limiter.tryAcquire() == nil)  // full
        let waiter = Task { try await limiter.withPermit { 1 } }
        await yieldUntil { limiter.waiting == 1 }
        limiter.release(held, outcome: .ignored)  // the place goes to the waiter, not to a newcomer
        #expect(limiter.tryAcquire() == nil)  // handed to the waiter inside release, under the lock
        #expect(try await waiter.value == 1)
        let again = try #require(limiter.tryAcquire(priority: .background))
        limiter.release(again, outcome: .success)
        #expect(limiter.inFlight == 0)
    }

    @Test func backgroundWorkAloneNeverStarvesWhateverTheShare() async throws {
        for (initial, share) in [(1, 0.25), (4, 1.0)] {
            let limiter = try Self.limiter(initial: initial, share: share)
            let ran = try await limiter.withPermit(priority: .background) { limiter.inFlight }
            #expect(ran == 1)
        }
    }

    @Test func aConfigurationSetPartByPartIsMadeSoundNotTrusted() async throws {
        var configuration = AdaptiveConcurrencyLimiter.Configuration()
        configuration.minLimit = 0
        configuration.maxLimit = -5
        configuration.maxWaiting = -1
        configuration.interactiveShare = .nan
        configuration.maxWaitingPerLimit = .nan
        let limiter = AdaptiveConcurrencyLimiter(configuration: configuration)
        #expect(limiter.configuration.minLimit == 1 && limiter.configuration.maxLimit == 1)
        #expect(limiter.configuration.maxWaiting == 0 && limiter.configuration.interactiveShare == 0.25)
        #expect(limiter.configuration.maxWaitingPerLimit == AdaptiveConcurrencyLimiter.Configuration.defaultMaxWaitingPerLimit)
        #expect(limiter.currentLimit == 1)
        #expect(try await limiter.withPermit(priority: .background) { 1 } == 1)
    }

    /// The largest settings the throwing initializer accepts work: limits of `Int.max` are
    /// clamped to 2⁵³, a line of `Int.max`, a share of 1, and the limiter admits, refuses and
    /// releases without trapping.
    @Test func limitsAndLinesOfIntMaxAreClampedAndWork() async throws {
        let configuration = try AdaptiveConcurrencyLimiter.Configuration(
            algorithm: .aimd(), minLimit: .max, maxLimit: .max, maxWaiting: .max, maxWaitingPerLimit: .infinity,
            initialLimit: .max, interactiveShare: 1
        )
        #expect(configuration.minLimit == 1 << 53 && configuration.maxLimit == 1 << 53 && configuration.initialLimit == 1 << 53)
        #expect(configuration.maxWaiting == .max)
        for limiter in [AdaptiveConcurrencyLimiter(configuration: configuration), try Self.limiter(min: .max, max: .max, initial: .max, waiting: .max, share: 1)] {
            #expect(limiter.currentLimit == 1 << 53)
            let interactive = try #require(limiter.tryAcquire())
            let background = try #require(limiter.tryAcquire(priority: .background))
            #expect(limiter.tryAcquire(priority: .background) == nil)  // a share of 1: one background call at a time
            limiter.release(background, outcome: .success)
            limiter.release(interactive, outcome: .dropped)
            #expect(try await limiter.withPermit { limiter.inFlight } == 1)
            #expect(limiter.inFlight == 0 && limiter.currentLimit == 1 << 53)
        }
        var partByPart = AdaptiveConcurrencyLimiter.Configuration()
        partByPart.minLimit = .max
        partByPart.maxLimit = .max
        partByPart.initialLimit = .max
        let limiter = AdaptiveConcurrencyLimiter(configuration: partByPart)
        #expect(limiter.configuration.maxLimit == 1 << 53 && limiter.currentLimit == 1 << 53)
    }

    /// A line per place so large that `limit × maxWaitingPerLimit` is past `Int.max` is bounded by
    /// `maxWaiting`, not converted (which trapped on the first call that had to wait).
    @Test func aHugeLinePerPlaceIsBoundedByMaxWaiting() async throws {
        for (waiting, perLimit) in [(Int.max, 9e18), (Int.max, 1e300), (3, 1e300)] {
            let limiter = try Self.limiter(min: 2, max: 2, initial: 2, waiting: waiting, perLimit: perLimit, share: 0)
            let first = try #require(limiter.tryAcquire())
            let second = try #require(limiter.tryAcquire())
            let waiter = Task { try await limiter.withPermit { limiter.inFlight } }
            await yieldUntil { limiter.waiting == 1 }
            limiter.release(first, outcome: .success)
            #expect(try await waiter.value == 2)
            limiter.release(second, outcome: .success)
            #expect(limiter.inFlight == 0 && limiter.waiting == 0)
        }
    }

    /// A permit given back twice (or a copy of it given back after it) frees one place, not two:
    /// the in-flight count never goes below what runs, no more than the limit run at once, and
    /// each extra release is counted.
    @Test func aSecondReleaseOfAPermitChangesNothingAndIsCounted() async throws {
        let limiter = try Self.limiter(min: 2, max: 2, initial: 2, share: 0)
        let first = try #require(limiter.tryAcquire())
        let second = try #require(limiter.tryAcquire())
        limiter.release(first, outcome: .success)
        limiter.release(first, outcome: .success)
        let copy = first
        limiter.release(copy, outcome: .dropped)
        #expect(limiter.inFlight == 1)
        #expect(limiter.unmatchedReleases == 2)
        let third = try #require(limiter.tryAcquire())
        try #require(limiter.tryAcquire() == nil)  // two run: the limit
        #expect(limiter.inFlight == 2)

        // With a caller in line: the first release hands the place on, the second frees nothing.
        let waiter = Task { try await limiter.withPermit { limiter.inFlight } }
        await yieldUntil { limiter.waiting == 1 }
        limiter.release(second, outcome: .success)
        limiter.release(second, outcome: .success)
        #expect(limiter.tryAcquire() == nil)
        #expect(try await waiter.value == 2)
        limiter.release(third, outcome: .success)
        limiter.release(third, outcome: .success)
        #expect(limiter.inFlight == 0)
        let again = (0..<3).compactMap { _ in limiter.tryAcquire() }
        #expect(again.count == 2)
        for permit in again { limiter.release(permit, outcome: .ignored) }
        #expect(limiter.inFlight == 0 && limiter.unmatchedReleases == 4)
    }

    /// A permit of another limiter changes nothing here.
    @Test func aPermitOfAnotherLimiterChangesNothing() throws {
        let limiter = try Self.limiter(min: 1, max: 1, initial: 1)
        let other = try Self.limiter(min: 1, max: 1, initial: 1)
        let held = try #require(limiter.tryAcquire())
        let foreign = try #require(other.tryAcquire())
        limiter.release(foreign, outcome: .success)
        #expect(limiter.inFlight == 1 && limiter.tryAcquire() == nil)
        #expect(limiter.unmatchedReleases == 1)
        limiter.release(held, outcome: .success)
        other.release(foreign, outcome: .success)
        #expect(limiter.inFlight == 0 && other.inFlight == 0)
        #expect(limiter.unmatchedReleases == 1 && other.unmatchedReleases == 0)
    }

    /// By default the line holds half as many calls as the limit (rounded up), whatever
    /// `maxWaiting` allows: past the upstream's capacity the rest are refused at once.
    @Test func theLineFollowsTheLimit() async throws {
        let limiter = AdaptiveConcurrencyLimiter(
            configuration: try .init(algorithm: .aimd(), minLimit: 1, maxLimit: 100, maxWaiting: 100, initialLimit: 5, interactiveShare: 0)
        )
        #expect(limiter.configuration.maxWaitingPerLimit == 0.5)
        let gate = Gate()
        var running: [Task<Void, any Error>] = []
        for _ in 0..<8 { running.append(Task { try await limiter.withPermit { await gate.wait() } }) }
        await yieldUntil { limiter.inFlight == 5 && limiter.waiting == 3 }  // 5 × 0.5, rounded up
        await #expect(throws: LimiterRejection(reason: .concurrencyLimit(maxConcurrent: 5, maxWaiting: 3))) {
            try await limiter.withPermit { () }
        }
        gate.open()
        for task in running { try await task.value }
        #expect(limiter.inFlight == 0 && limiter.waiting == 0)
    }

    @Test func aCancelledWaiterLeavesAtOnceAndNoPlaceIsLost() async throws {
        let limiter = try Self.limiter(initial: 1, share: 0)
        let permit = try await limiter.acquire()
        let waiter = Task { try await limiter.withPermit { 1 } }
        await yieldUntil { limiter.waiting == 1 }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(limiter.waiting == 0)
        limiter.release(permit, outcome: .ignored)
        #expect(try await limiter.withPermit { limiter.inFlight } == 1)
        #expect(limiter.inFlight == 0)
    }

    @Test func aCallAlreadyCancelledNeverRuns() async throws {
        let limiter = try Self.limiter(initial: 1)
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await limiter.withPermit { true }
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(limiter.inFlight == 0)
    }
}

@Suite("RetryThrottle: gRPC's token count per server")
struct RetryThrottleTests {
    @Test func failuresTakeATokenSuccessesGiveTheRatioAndRetriesStopAtHalf() throws {
        let throttle = RetryThrottle(try RetryThrottling(maxTokens: 10, tokenRatio: 0.1))
        #expect(throttle.tokenCount == 10 && throttle.allowsRetry)
        for _ in 0..<4 { throttle.recordFailure() }
        #expect(throttle.tokenCount == 6 && throttle.allowsRetry)
        throttle.recordFailure()
        #expect(throttle.tokenCount == 5 && !throttle.allowsRetry)  // at half: no retries
        for _ in 0..<10 { throttle.recordSuccess() }
        #expect(throttle.tokenCount == 6)  // ten tenths make exactly one
        #expect(throttle.allowsRetry)
        for _ in 0..<100 { throttle.recordFailure() }
        #expect(throttle.tokenCount == 0)
        for _ in 0..<1_000 { throttle.recordSuccess() }
        #expect(throttle.tokenCount == 10)  // never above the ceiling
    }

    @Test func settingsThatCannotWorkAreErrors() throws {
        #expect(throws: RetryThrottling.ConfigurationError.maxTokensOutOfRange(0)) { try RetryThrottling(maxTokens: 0, tokenRatio: 0.1) }
        #expect(throws: RetryThrottling.ConfigurationError.maxTokensOutOfRange(1_001)) { try RetryThrottling(maxTokens: 1_001, tokenRatio: 0.1) }
        #expect(throws: RetryThrottling.ConfigurationError.tokenRatioOutOfRange(0.0001)) { try RetryThrottling(maxTokens: 10, tokenRatio: 0.0001) }
        #expect(throws: RetryThrottling.ConfigurationError.tokenRatioOutOfRange(-1)) { try RetryThrottling(maxTokens: 10, tokenRatio: -1) }
        #expect(throws: RetryThrottling.ConfigurationError.self) { try RetryThrottling(maxTokens: .nan, tokenRatio: 0.1) }
        #expect(try RetryThrottling(maxTokens: 10, tokenRatio: 0.1234).tokenRatio == 0.123)  // three decimals, as gRPC keeps
        #expect(try RetryThrottling() == RetryThrottling(maxTokens: 10, tokenRatio: 0.1))  // the defaults need no `try`
    }
}
