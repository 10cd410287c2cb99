/// The circuit breaker's logic as a value: no lock, no clock, no I/O. Time is passed in as the
/// elapsed `Duration` on the owner's clock, so every transition is testable by hand.
struct CircuitBreakerStateMachine: Sendable {
    enum Decision: Equatable {
        case allowed(CircuitBreaker.Permit)
        case rejected
    }

    private enum Phase {
        /// Outcomes go to `window`.
        case closed
        case open(until: Duration)
        /// `granted` probes handed out so far, `succeeded` of them answered with a (fast) success.
        case halfOpen(granted: Int, succeeded: Int)
        /// Held open by `isolate()` until `reset()`.
        case isolated
    }

    let configuration: CircuitBreaker.Configuration
    private var phase: Phase = .closed
    /// The closed phase's outcomes. Kept beside the phase rather than inside it, so recording
    /// mutates the storage in place instead of copying it out of the enum and back.
    private var window: CircuitBreakerWindow
    /// Bumped on every transition. A permit carries the generation it was granted in, and its
    /// outcome only counts if the breaker has not changed state since — this guards the race where
    /// a slow call from the closed phase reports "success" while half-open probes are under way.
    private(set) var generation: UInt64 = 0

    init(configuration: CircuitBreaker.Configuration) {
        self.configuration = configuration
        self.window = CircuitBreakerWindow(configuration.window)
    }

    /// The state as seen at `now`: an open phase whose time ran out is half-open already.
    func state(now: Duration) -> CircuitBreaker.State {
        switch phase {
        case .closed: return .closed
        case .open(let until): return now >= until ? .halfOpen : .open
        case .halfOpen: return .halfOpen
        case .isolated: return .open
        }
    }

    /// The state of the phase as last changed (open stays open until a probe is let through):
    /// what state-change notifications report.
    var storedState: CircuitBreaker.State {
        switch phase {
        case .closed: return .closed
        case .open, .isolated: return .open
        case .halfOpen: return .halfOpen
        }
    }

    var isIsolated: Bool {
        if case .isolated = phase { return true }
        return false
    }

    /// Outcomes in the closed window (for tests).
    func windowTally(now: Duration) -> CircuitBreakerWindow.Tally {
        window.tally(now: now)
    }

    func remainingOpenTime(now: Duration) -> Duration {
        switch phase {
        case .open(let until) where now < until: return until - now
        case .isolated: return configuration.openDuration
        default: return .zero
        }
    }

    mutating func acquire(now: Duration) -> Decision {
        switch phase {
        case .closed:
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: false, startedAt: now))
        case .open(let until):
            guard now >= until else { return .rejected }
            transition(to: .halfOpen(granted: 1, succeeded: 0))
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: true, startedAt: now))
        case .halfOpen(let granted, let succeeded):
            guard granted < configuration.halfOpenProbes else { return .rejected }
            phase = .halfOpen(granted: granted + 1, succeeded: succeeded)
            return .allowed(CircuitBreaker.Permit(generation: generation, isProbe: true, startedAt: now))
        case .isolated:
            return .rejected
        }
    }

    mutating func record(_ outcome: CircuitBreaker.Outcome, for permit: CircuitBreaker.Permit, now: Duration) {
        guard permit.generation == generation else { return }  // stale: the state changed meanwhile
        let isSlow: Bool
        if outcome != .ignored, let slowCallDuration = configuration.slowCallDuration {
            isSlow = now - permit.startedAt > slowCallDuration
        } else {
            isSlow = false
        }
        switch phase {
        case .closed:
            guard outcome != .ignored else { return }
            window.add(failure: outcome == .failure, slow: isSlow, now: now)
            let tally = window.tally(now: now)
            guard tally.calls >= configuration.minimumCalls else { return }
            let failureRate = Double(tally.failures) / Double(tally.calls)
            let slowRate = Double(tally.slowCalls) / Double(tally.calls)
            if failureRate >= configuration.failureRateThreshold
                || (configuration.slowCallDuration != nil && tally.slowCalls > 0 && slowRate >= configuration.slowCallRateThreshold)
            {
                open(now: now)
            }
        case .open, .isolated:
            return  // cannot happen for a current-generation permit: both bump the generation
        case .halfOpen(let granted, let succeeded):
            switch outcome {
            case .failure:
                open(now: now)
            case .ignored:
                phase = .halfOpen(granted: granted - 1, succeeded: succeeded)  // free the probe slot
            case .success where isSlow:
                open(now: now)  // answering, but still too slowly to be let back in
            case .success:
                if succeeded + 1 >= configuration.halfOpenProbes {
                    close()
                } else {
                    phase = .halfOpen(granted: granted, succeeded: succeeded + 1)
                }
            }
        }
    }

    /// Manual control: hold open until `reset()`.
    mutating func isolate() {
        transition(to: .isolated)
    }

    /// Manual control: closed, with an empty window, from any state.
    mutating func reset() {
        close()
    }

    private mutating func open(now: Duration) {
        transition(to: .open(until: now + configuration.openDuration))
    }

    private mutating func close() {
        window.removeAll()
        transition(to: .closed)
    }

    private mutating func transition(to newPhase: Phase) {
        phase = newPhase
        generation &+= 1
    }
}

/// The closed breaker's sliding window: the last N outcomes in a ring, or the outcomes of the
/// last stretch of time in ten buckets. Fixed memory either way.
struct CircuitBreakerWindow: Sendable {
    struct Tally: Sendable, Hashable {
        var calls = 0
        var failures = 0
        var slowCalls = 0

        mutating func add(failure: Bool, slow: Bool) {
            calls += 1
            if failure { failures += 1 }
            if slow { slowCalls += 1 }
        }

        mutating func remove(failure: Bool, slow: Bool) {
            calls -= 1
            if failure { failures -= 1 }
            if slow { slowCalls -= 1 }
        }
    }

    /// One recorded outcome of a count window.
    private struct Entry: Sendable {
        var failure: Bool
        var slow: Bool
    }

    /// The calls recorded during one bucket's stretch of a time window.
    private struct Bucket: Sendable {
        /// Which stretch (`elapsed / width`) the tally belongs to; -1 for never used.
        var index: Int64 = -1
        var tally = Tally()
    }

    static let bucketCount = 10

    private enum Storage: Sendable {
        case ring(capacity: Int)
        /// `width` in nanoseconds, at least 1.
        case buckets(width: Int64)
    }

    private let storage: Storage
    private var entries: [Entry] = []
    private var next = 0
    private var ringTally = Tally()
    private var buckets: [Bucket] = []

    init(_ window: CircuitBreaker.Configuration.Window) {
        switch window {
        case .count(let size):
            storage = .ring(capacity: max(1, size))
        case .time(let duration):
            storage = .buckets(width: max(1, duration.saturatingNanoseconds / Int64(Self.bucketCount)))
            buckets = Array(repeating: Bucket(), count: Self.bucketCount)
        }
    }

    mutating func add(failure: Bool, slow: Bool, now: Duration) {
        switch storage {
        case .ring(let capacity):
            let entry = Entry(failure: failure, slow: slow)
            if entries.count < capacity {
                entries.append(entry)
            } else {
                ringTally.remove(failure: entries[next].failure, slow: entries[next].slow)
                entries[next] = entry
            }
            next = (next + 1) % capacity
            ringTally.add(failure: failure, slow: slow)
        case .buckets(let width):
            let index = Self.bucketIndex(now: now, width: width)
            let slot = Int(index % Int64(Self.bucketCount))
            if buckets[slot].index != index { buckets[slot] = Bucket(index: index) }
            buckets[slot].tally.add(failure: failure, slow: slow)
        }
    }

    /// The outcomes in the window at `now` (for a time window, the buckets of the last ten stretches).
    func tally(now: Duration) -> Tally {
        switch storage {
        case .ring:
            return ringTally
        case .buckets(let width):
            let current = Self.bucketIndex(now: now, width: width)
            var total = Tally()
            for bucket in buckets where bucket.index >= 0 && bucket.index > current - Int64(Self.bucketCount) && bucket.index <= current {
                total.calls += bucket.tally.calls
                total.failures += bucket.tally.failures
                total.slowCalls += bucket.tally.slowCalls
            }
            return total
        }
    }

    mutating func removeAll() {
        entries.removeAll(keepingCapacity: true)
        next = 0
        ringTally = Tally()
        for slot in buckets.indices { buckets[slot] = Bucket() }
    }

    private static func bucketIndex(now: Duration, width: Int64) -> Int64 {
        max(0, now.saturatingNanoseconds) / width
    }
}
