import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Runs every task of the process on one thread, one job at a time, in an order drawn from a
/// seed, with time that moves only when nothing can run.
///
/// Swift's global executor normally runs jobs on a pool of threads in whatever order they come.
/// While a simulation runs, the runtime's global-enqueue hook hands every job to this scheduler
/// instead: jobs of default actors and of unstructured, detached and child tasks alike (the
/// package's actors have no executors of their own). The scheduler keeps them in a list and runs
/// one picked at random with the simulation's generator, so one seed gives one interleaving and
/// other seeds explore others. When no job can run, the virtual clock moves to the earliest
/// sleeper's deadline; when no job can run and nobody sleeps while the simulation's body has not
/// finished, something waits for an event that will never come, and the run ends as stuck.
///
/// The hook is process-wide, so a simulation owns its process while it runs: run it from an
/// executable (`resilience-demo simulate`) or a test's exit-test child, never beside other
/// concurrent work. Meanwhile `SimulationPoints` is active: blocking file I/O runs inline on the
/// scheduler's thread, and waiters suspend once before they park, so other tasks can act in
/// that window as other threads could.
final class SimulationScheduler: SerialExecutor, @unchecked Sendable {
    typealias Original = @convention(thin) (UnownedJob) -> Void
    typealias Hook = @convention(thin) (UnownedJob, Original) -> Void

    /// How a run ended.
    enum Ending: Equatable {
        /// The body returned.
        case finished
        /// No job could run, no sleeper could be woken, and the body had not returned; with the
        /// places tasks wait at (`SimulationPoints.waitingSites`).
        case stuck(waiting: [String: Int])
        /// Virtual time passed the run's limit with the body still running.
        case timeLimit
        /// An invariant registered with `SimulationPoints.watch` broke after a step.
        case violated(String)
        /// The run took `stepLimit` steps without finishing: tasks keep running without time
        /// moving (a livelock), or the workload is far larger than a scenario's.
        case stepLimit
    }

    /// The most jobs a run may take (the package's scenarios take well under a million). The
    /// environment's `SIM_STEP_LIMIT` lowers it when hunting a livelock, so that `--trace` shows
    /// where time stopped in seconds rather than minutes.
    var stepLimit = ProcessInfo.processInfo.environment["SIM_STEP_LIMIT"].flatMap { Int($0) } ?? 20_000_000

    private let lock = NSLock()
    private var jobs: [UnownedJob] = []
    private var generator: SeededGenerator
    /// Jobs run so far.
    private(set) var steps = 0

    /// The scheduler the hook hands jobs to (one run at a time per process).
    nonisolated(unsafe) private static var current: SimulationScheduler?
    private static let hookLock = NSLock()

    private let seed: UInt64

    init(seed: UInt64) {
        self.seed = seed
        generator = SeededGenerator(seed: seed)
    }

    /// The thread running the simulation.
    private var owner: pthread_t?
    /// Jobs enqueued from another thread: work that escaped the scheduler (a system thread that
    /// resumed a task), which makes the run depend on more than its seed.
    private(set) var foreignEnqueues = 0

    func enqueue(_ job: UnownedJob) {
        lock.lock()
        if let owner, pthread_equal(owner, pthread_self()) == 0 { foreignEnqueues += 1 }
        jobs.append(job)
        lock.unlock()
    }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Runs `body` and everything it starts until `body` returns, gets stuck, or `clock` passes
    /// `timeLimit`. Blocks the calling thread, which must not be one of Swift's pool threads.
    func run(clock: ManualClock, disk: SimulatedDisk, timeLimit: Duration, _ body: @escaping @Sendable () async -> Void) -> Ending {
        Self.hookLock.lock()
        defer { Self.hookLock.unlock() }
        let hook = Self.hookPointer
        Self.current = self
        hook.pointee = { job, _ in SimulationScheduler.current?.enqueue(job) }
        // The simulation's wall clock: a fixed date plus virtual time.
        let epoch = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01
        SimulationPoints.setActive(
            true,
            seed: seed,
            date: { epoch.addingTimeInterval(Double(clock.now.offset / .nanoseconds(1)) / 1e9) },
            pause: { [self] continuation in pause(continuation, now: clock.now.offset) },
            fileSystem: disk
        )
        defer {
            hook.pointee = nil
            SimulationPoints.setActive(false)
            Self.current = nil
        }
        owner = pthread_self()
        let done = Locked(false)
        Task {
            await body()
            done.withLock { $0 = true }
        }
        while true {
            if let job = nextJob() {
                job.runSynchronously(on: asUnownedSerialExecutor())
                steps += 1
                if steps >= stepLimit { return .stepLimit }
                if let broken = SimulationPoints.brokenInvariant() { return .violated("\(broken) (after step \(steps))") }
                continue
            }
            if done.withLock({ $0 }) { return .finished }
            // Time moves to the earliest sleeper or paused waiter.
            let paused = lock.withLock { self.paused.map(\.until).min() }
            let sleeper = clock.nextFutureDeadline?.offset
            guard let next = [paused, sleeper].compactMap({ $0 }).min() else { return .stuck(waiting: SimulationPoints.waitingSites) }
            guard next <= timeLimit else { return .timeLimit }
            clock.advance(to: ManualClock.Instant(offset: next))
            let due = lock.withLock {
                let due = self.paused.filter { $0.until <= next }
                self.paused.removeAll { $0.until <= next }
                return due
            }
            for waiter in due { waiter.continuation.resume() }
        }
    }

    /// A waiter held back in the window between joining a line and suspending
    /// (`SimulationPoints.yield()`), until a virtual time.
    private struct Paused {
        let until: Duration
        let continuation: UnsafeContinuation<Void, Never>
    }

    private var paused: [Paused] = []

    /// Lets other tasks run before `continuation`'s task goes on: usually just a turn (a new
    /// task resumes it, scheduled like any other job); one time in four, a pause of 1 to 50 ms of
    /// virtual time, as a thread can be preempted at that point for that long, so that
    /// cancellations, hand-overs and other callers land in the window.
    private func pause(_ continuation: UnsafeContinuation<Void, Never>, now: Duration) {
        lock.lock()
        let draw = generator.next()
        if draw % 4 == 0 {
            let length = Duration.milliseconds(1 + Int((draw >> 8) % 50))
            paused.append(Paused(until: now + length, continuation: continuation))
            lock.unlock()
            PauseLedger.current?.add(length)
        } else {
            lock.unlock()
            Task { continuation.resume() }
        }
    }

    private func nextJob() -> UnownedJob? {
        lock.lock()
        defer { lock.unlock() }
        guard !jobs.isEmpty else { return nil }
        let index = Int(generator.next() % UInt64(jobs.count))
        return jobs.remove(at: index)
    }

    /// The Swift runtime's `swift_task_enqueueGlobal_hook`.
    // Written only under `hookLock`, by `run`.
    nonisolated(unsafe) private static let hookPointer: UnsafeMutablePointer<Hook?> = {
        let handle = dlopen(nil, RTLD_NOW)
        guard let symbol = dlsym(handle, "swift_task_enqueueGlobal_hook") else {
            fatalError("ResilienceSimulation: this Swift runtime has no swift_task_enqueueGlobal_hook")
        }
        return symbol.assumingMemoryBound(to: Hook?.self)
    }()
}

/// The virtual time a task (and the tasks it starts, which inherit the ledger) spent paused by
/// the scheduler in windows it opened: time a real thread could lose to preemption, which an
/// invariant on elapsed time (a deadline) must allow for.
final class PauseLedger: Sendable {
    @TaskLocal static var current: PauseLedger?

    private let total = Locked(Duration.zero)

    func add(_ pause: Duration) {
        total.withLock { $0 += pause }
    }

    var paused: Duration { total.withLock { $0 } }
}
