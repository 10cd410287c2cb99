import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// Drains an `OfflineQueueEngine` on a timer, each cycle bounded by a time budget — the stand-in,
/// on servers and Linux, for a background processing task that the system may expire at any time.
///
/// ```swift
/// let drainer = DrainService(queue: queue, interval: .seconds(60), cycleBudget: .seconds(20))
/// let reports = await drainer.reports
/// Task { for await report in reports { print(report) } }   // ends at stop()
/// await drainer.start()          // a cycle now, then every minute (±10 %), and on reconnect
/// // …
/// await drainer.stop()           // waits for the cycle in flight
/// ```
///
/// - A cycle runs at `start()`, then every `interval` with jitter, and at once when the queue's
///   reachability monitor reports that connectivity returned.
/// - A failed cycle (offline, or an entry failed transiently) makes the next wait grow:
///   `interval × multiplier^failures`, capped at `backoff.maximum`; a successful or reconnect
///   cycle resets it.
/// - Each cycle ends when the queue is drained or `cycleBudget` runs out, whichever is first; at
///   the budget the request in flight is cancelled and its entry stays queued with the same
///   idempotency key for the next cycle.
/// - Cycles never overlap, neither with each other nor with the queue's own passes
///   (`OfflineQueueEngine.start()`, `flush()`): the queue runs one pass at a time.
///
/// See Sources/Drainer/Drainer.docc/DrainerGuide.md.
public actor DrainService {
    /// How the wait grows after failed cycles.
    public struct Backoff: Sendable, Hashable {
        /// The factor applied per consecutive failed cycle (at least 1).
        public var multiplier: Double
        /// The longest wait between cycles before jitter (never shorter than the interval); jitter
        /// may add up to `jitter` × this on top.
        public var maximum: Duration

        public init(multiplier: Double = 2, maximum: Duration = .seconds(3600)) {
            self.multiplier = multiplier.isFinite ? max(1, multiplier) : 2
            self.maximum = max(.zero, maximum)
        }
    }

    /// The queue this service drains.
    public nonisolated let queue: OfflineQueueEngine
    /// The wait between cycles when the last one succeeded (before jitter).
    public nonisolated let interval: Duration
    /// The most time one cycle may take.
    public nonisolated let cycleBudget: Duration
    /// Each wait is multiplied by a random factor in `1 ± jitter` (0…1).
    public nonisolated let jitter: Double
    public nonisolated let backoff: Backoff

    private let time: TimeSource
    private let randomUnit: @Sendable () -> Double

    /// The lifecycle: phase and loop position. The tasks below are its I/O.
    private(set) var machine = DrainServiceStateMachine()
    /// The loop task, while running and while a stop waits for it to end.
    private var loopTask: Task<Void, Never>?
    private var listenerTask: Task<Void, Never>?
    private var sleepTask: Task<Bool, Never>?
    /// One cycle at a time (the loop's, `drainNow()`'s); FIFO; a cancelled waiter leaves the line.
    let cycleGate = AdmissionGate(limit: 1)
    private nonisolated let subscribers = StreamSubscribers<DrainCycleReport>()

    /// Consecutive failed cycles (0 after a success).
    public private(set) var consecutiveFailures = 0
    /// The last cycle's report.
    public private(set) var lastReport: DrainCycleReport?
    /// Cycles run since the service was made.
    public private(set) var cyclesRun = 0
    /// When the next timed cycle is due, while the service waits for it.
    public private(set) var nextCycleAt: Date?

    /// - Parameters:
    ///   - queue: the queue to drain.
    ///   - interval: the wait between cycles (at least 1 ms).
    ///   - cycleBudget: the most time one cycle may take (at least 1 ms).
    ///   - jitter: each wait is multiplied by a random factor in `1 ± jitter`; clamped to 0…1,
    ///     default 0.1 (±10 %), so many processes started together spread out.
    ///   - backoff: how the wait grows after failed cycles.
    ///   - clock: the clock interval, jitter and budget run on.
    public init(
        queue: OfflineQueueEngine,
        interval: Duration,
        cycleBudget: Duration,
        jitter: Double = 0.1,
        backoff: Backoff = Backoff(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.init(
            queue: queue, interval: interval, cycleBudget: cycleBudget, jitter: jitter, backoff: backoff,
            clock: clock, randomUnit: { SimulationPoints.randomUnit() })  // Double.random, or the simulation's seed
    }

    /// For tests: `randomUnit` returns a value in 0..<1 that picks the jitter factor.
    init(
        queue: OfflineQueueEngine,
        interval: Duration,
        cycleBudget: Duration,
        jitter: Double,
        backoff: Backoff,
        clock: some Clock<Duration>,
        randomUnit: @escaping @Sendable () -> Double
    ) {
        self.queue = queue
        self.interval = max(.milliseconds(1), interval)
        self.cycleBudget = max(.milliseconds(1), cycleBudget)
        self.jitter = jitter.isNaN ? 0.1 : min(1, max(0, jitter))
        self.backoff = backoff
        self.time = TimeSource(clock)
        self.randomUnit = randomUnit
    }

    // MARK: - Running

    /// Whether `start()` is in effect.
    public var isRunning: Bool { machine.isRunning }

    /// Runs a cycle now and then keeps cycling until `stop()`. Calling it again while running does
    /// nothing; after `stop()` it starts afresh (backoff reset). A `start()` called while a `stop()`
    /// still waits for its cycle starts after that stop completes.
    public func start() async {
        let stopsBefore = machine.stopsRequested
        while case .stopping(let id) = machine.phase, let loop = loopTask {
            await loop.value
            machine.loopEnded(id)
        }
        // A stop() asked for while this start() waited wins (the machine refuses): starting now
        // would leave a loop running behind a stop() that has returned.
        guard machine.start(stopsBefore: stopsBefore) else { return }
        consecutiveFailures = 0
        // No suspension between the machine's decision and this line: a concurrent stop() either
        // sees the loop and stops it, or comes before it and is a no-op.
        loopTask = Task { await self.runLoop() }
    }

    /// What `stop(_:)` does with the loop's cycle in flight.
    public enum StopMode: Sendable, Hashable {
        /// It ends on its own, within its budget (the default).
        case lettingCycleFinish
        /// It is cancelled at once: the request in flight is cancelled and its entry stays queued;
        /// the cycle's report says `interrupted`.
        case interruptingCycle
    }

    /// Stops the service: no cycle of its loop starts after this is called, and it waits for the
    /// loop's cycle in flight to end — on its own, within its budget, or at once with
    /// `.interruptingCycle` (the request in flight is cancelled and its entry stays queued).
    /// Every `reports` stream obtained before the call ends. A `drainNow()` call in flight is its
    /// caller's and runs to its end.
    ///
    /// ```swift
    /// await drainer.stop()                     // the cycle in flight finishes within its budget
    /// await drainer.stop(.interruptingCycle)   // or is cut short now
    /// ```
    public func stop(_ mode: StopMode = .lettingCycleFinish) async {
        // The streams to end are those that exist now, not ones a later start() subscribes.
        let endingReports = subscribers.current
        defer { subscribers.finish(endingReports) }
        let action = machine.stop(interruptingCycle: mode == .interruptingCycle)
        if action.endListenerAndSleep {
            listenerTask?.cancel()
            listenerTask = nil
            sleepTask?.cancel()
        }
        // A loop cycle still waiting for its turn (behind drainNow() cycles) never runs: the
        // cancelled loop leaves the line, or, if handed the turn meanwhile, gives it back unused.
        guard action.awaitLoop, case .stopping(let id) = machine.phase, let loop = loopTask else { return }
        if action.cancelLoop { loop.cancel() }
        await loop.value
        machine.loopEnded(id)
        if loopTask == loop, case .idle = machine.phase { loopTask = nil }
    }

    /// Runs one cycle now (bounded by `cycleBudget`), after any cycle in flight, whether or not the
    /// service is started. Cancelling the caller interrupts it, also while it waits for its turn
    /// (the report then says `interrupted` and nothing was sent).
    @discardableResult
    public func drainNow() async -> DrainCycleReport {
        if let report = await runCycle(.manual, forLoop: false) { return report }
        return await interruptedBeforeStarting(.manual)
    }

    /// A new stream of cycle reports for each access. It ends at the next `stop()` (subscribe again
    /// after a restart), or when the service is deinitialised.
    public var reports: AsyncStream<DrainCycleReport> {
        subscribers.stream(bufferingPolicy: .bufferingNewest(1000))
    }

    /// The wait before the next timed cycle, before jitter: the interval, or after `n` failed
    /// cycles `interval × multiplier^n`, capped at `max(interval, backoff.maximum)`.
    public var scheduledDelay: Duration {
        guard consecutiveFailures > 0 else { return interval }
        let cap = max(interval, backoff.maximum)
        let factor = pow(backoff.multiplier, Double(min(consecutiveFailures, 1000)))
        return Duration.clamped(seconds: interval.seconds * factor, upperBound: cap)
    }

    // MARK: - Internals

    private func runLoop() async {
        // Subscribe before the first cycle so a reconnect during it is not missed.
        let monitor = queue.reachabilityMonitor
        let wasConnected = await monitor.isConnected
        let connectivity = await monitor.connectivity
        guard machine.subscribed(), !Task.isCancelled else { return }
        listenerTask = Task { [weak self] in
            var last = wasConnected
            for await connected in connectivity {
                if connected && !last { await self?.connectivityReturned() }
                last = connected
            }
        }
        var trigger = DrainCycleReport.Trigger.start
        while machine.cycleWanted() {
            guard await runCycle(trigger, forLoop: true) != nil else { return }
            switch machine.cycleEnded(loopCancelled: Task.isCancelled) {
            case .exit: return
            case .runForReconnect:
                trigger = .reconnect
                continue
            case .sleep:
                break
            }
            switch await sleepUntilNextCycle() {
            case .elapsed: trigger = consecutiveFailures > 0 ? .retry : .interval
            case .reconnect: trigger = .reconnect
            case .stopped: return
            }
        }
    }

    private func sleepUntilNextCycle() async -> DrainServiceStateMachine.Wake {
        let base = scheduledDelay.seconds
        let factor = 1 + jitter * (2 * min(max(randomUnit(), 0), 1) - 1)
        let delay = Duration.clamped(seconds: base * factor, upperBound: .seconds(86_400 * 365))
        nextCycleAt = queue.now.addingTimeInterval(delay.seconds)
        defer { nextCycleAt = nil }
        let time = self.time
        let sleeper = Task {
            do {
                try await time.sleep(delay)
                return true
            } catch {
                return false
            }
        }
        sleepTask = sleeper
        let elapsed = await withTaskCancellationHandler {
            await sleeper.value
        } onCancel: {
            sleeper.cancel()
        }
        sleepTask = nil
        return machine.sleepEnded(elapsed: elapsed, loopCancelled: Task.isCancelled)
    }

    private func connectivityReturned() {
        guard machine.connectivityReturned() else { return }
        consecutiveFailures = 0
        sleepTask?.cancel()
    }

    /// One cycle, after any cycle in flight. `nil` when the caller was cancelled while it waited
    /// for its turn, or, for the loop, when `stop()` was asked for meanwhile: nothing was sent.
    private func runCycle(_ trigger: DrainCycleReport.Trigger, forLoop: Bool) async -> DrainCycleReport? {
        guard (try? await cycleGate.enter()) != nil else { return nil }
        defer { cycleGate.leave() }
        if forLoop && !machine.turnGranted() { return nil }
        let report = await DrainCycle.run(queue: queue, trigger: trigger, budget: cycleBudget, time: time)
        cyclesRun += 1
        lastReport = report
        if report.isFailure {
            consecutiveFailures += 1
        } else if !report.interrupted {
            consecutiveFailures = 0
        }
        subscribers.yield(report)
        return report
    }

    private func interruptedBeforeStarting(_ trigger: DrainCycleReport.Trigger) async -> DrainCycleReport {
        var flush = FlushReport(trigger: .flush)
        flush.wasCancelled = true
        flush.remaining = await queue.pendingCount()
        let now = queue.now
        return DrainCycleReport(trigger: trigger, startedAt: now, endedAt: now, flush: flush, budgetExhausted: false, interrupted: true)
    }

    deinit {
        subscribers.finishAll()
        listenerTask?.cancel()
        loopTask?.cancel()
    }
}
