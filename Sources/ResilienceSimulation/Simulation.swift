import Foundation
import Reachability
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting

/// One seeded, deterministic world for the package's layers to run in: a virtual clock, a
/// network of simulated hosts (``SimulatedNetwork``) with an origin that counts effects
/// (``SimulatedOrigin``), connectivity that flips when told, a disk that fails and crashes
/// (``SimulatedDisk``), and a trace of what happened.
///
/// Everything random in the world — latencies, faults, the workload a scenario draws, and the
/// order in which concurrent tasks run — comes from `seed`, so one seed is one run, repeated
/// exactly by running it again:
///
/// ```swift
/// let run = Simulation.run(seed: 42) { simulation in
///     let engine = AsyncRequestEngine(session: simulation.network, clock: simulation.clock)
///     // drive it, and check what simulation.origin saw
/// }
/// print(run.trace)
/// ```
///
/// `run` takes over the process's task scheduling while it runs (see ``Simulation/run(seed:timeLimit:_:)``).
public final class Simulation: Sendable {
    /// The seed everything in this world is drawn from.
    public let seed: UInt64
    /// The virtual clock: give it to every layer (`clock:` parameters). It moves only when no task
    /// can run, to the next sleeper's deadline.
    public let clock: ManualClock
    /// The device's connectivity, as the layers' `ReachabilityMonitoring` sees it.
    public let connectivity: ManualReachabilityMonitor
    /// The server side: resources, effects, tokens.
    public let origin: SimulatedOrigin
    /// The network between the layers and `origin`.
    public let network: SimulatedNetwork
    /// The disk the stores' files live on while the simulation runs: faults, crashes.
    public let disk: SimulatedDisk

    private struct State {
        var generator: SeededGenerator
        var trace: [String] = []
        var offline = false
    }

    private let state: Locked<State>

    /// A world drawn from `seed`, online, at virtual time zero.
    public init(seed: UInt64) {
        self.seed = seed
        clock = ManualClock()
        connectivity = ManualReachabilityMonitor(isConnected: true)
        state = Locked(State(generator: SeededGenerator(seed: seed)))
        origin = SimulatedOrigin()
        network = SimulatedNetwork()
        disk = SimulatedDisk(seed: seed)
        network.attach(to: self)
        disk.attach(to: self)
    }

    /// Virtual time since the start.
    public var now: Duration { clock.now.offset }

    /// Whether the device is offline (the network then fails every request with `.noConnection`).
    public var isOffline: Bool { state.withLock { $0.offline } }

    /// Takes the device off the network, or puts it back, and tells `connectivity`'s observers.
    public func setOnline(_ online: Bool) async {
        state.withLock { $0.offline = !online }
        record("connectivity \(online ? "online" : "offline")")
        await connectivity.setConnected(online)
    }

    /// The next raw draw from the seed.
    func nextRandom() -> UInt64 {
        state.withLock { $0.generator.next() }
    }

    /// A number drawn uniformly from `range`.
    public func random(in range: ClosedRange<Int>) -> Int {
        state.withLock { Int.random(in: range, using: &$0.generator) }
    }

    /// A duration drawn uniformly from `range`, to the millisecond.
    public func random(in range: ClosedRange<Duration>) -> Duration {
        let low = Int(range.lowerBound / .milliseconds(1))
        let high = Int(range.upperBound / .milliseconds(1))
        return .milliseconds(random(in: low...max(low, high)))
    }

    /// True with probability `probability` (0 never, 1 always).
    public func chance(_ probability: Double) -> Bool {
        guard probability > 0 else { return false }
        return state.withLock { Double.random(in: 0..<1, using: &$0.generator) } < probability
    }

    /// One element of `elements`, drawn uniformly.
    public func pick<T>(_ elements: [T]) -> T {
        elements[random(in: 0...(elements.count - 1))]
    }

    /// Appends a line to the trace, stamped with the virtual time in milliseconds.
    public func record(_ line: String) {
        let stamp = now / .milliseconds(1)
        state.withLock { $0.trace.append("\(Int(stamp)) \(line)") }
    }

    /// The trace so far, one line per event.
    public var trace: [String] { state.withLock { $0.trace } }

    // MARK: - Running

    /// What a ``Simulation/run(seed:timeLimit:_:)`` did.
    public struct Run: Sendable {
        /// How the run ended.
        public enum Ending: Sendable, Hashable, CustomStringConvertible {
            /// `body` returned.
            case finished
            /// Every task waited for something that nothing would ever do (a waiter left
            /// suspended); `waiting` names the places in the package's code where tasks wait.
            case stuck(waiting: [String])
            /// Virtual time passed the limit with `body` still running.
            case timeLimit
            /// An invariant kept inside the package's code (a wait line that must be empty while a
            /// place is free) broke after a step; the run stopped there.
            case violated(String)
            /// The run took 20 million scheduler steps without finishing: tasks kept running
            /// without time moving (a livelock).
            case stepLimit

            public var description: String {
                switch self {
                case .finished: "finished"
                case .stuck(let waiting): "stuck, tasks waiting at \(waiting.isEmpty ? "places outside the package" : waiting.joined(separator: ", "))"
                case .timeLimit: "time limit"
                case .violated(let invariant): "violated: \(invariant)"
                case .stepLimit: "step limit (a livelock?)"
                }
            }
        }

        /// The seed.
        public let seed: UInt64
        /// How it ended.
        public let ending: Ending
        /// The trace, one line per event: the same seed gives the same lines.
        public let trace: [String]
        /// Virtual time at the end.
        public let elapsed: Duration
        /// Scheduler steps (jobs run).
        public let steps: Int
        /// Jobs that reached the scheduler from another thread: work that ran outside the
        /// simulation (a system thread resumed a task), so the run may not repeat exactly. Zero
        /// for every run of the package's scenarios.
        public let escapedJobs: Int
    }

    /// Builds a world from `seed` and runs `body` in it, with every task of the process on one
    /// thread in an order drawn from `seed` and the clock moving only when no task can run.
    /// Returns when `body` returns, when every task is stuck waiting, or when virtual time passes
    /// `timeLimit`.
    ///
    /// While it runs, the simulation owns the process's task scheduling (through the Swift
    /// runtime's global-enqueue hook): run it from an executable or an exit-test child, not beside
    /// other concurrent work. The package's stores keep their files on ``disk`` meanwhile (nothing
    /// reaches the machine's file system), and their blocking I/O runs inline.
    /// Two runs of one seed in one process give the same trace; across processes, set
    /// `SWIFT_DETERMINISTIC_HASHING=1` (dictionary order follows the process's hash seed), as
    /// `resilience-demo simulate` does.
    public static func run(
        seed: UInt64,
        timeLimit: Duration = .seconds(3_600),
        _ body: @escaping @Sendable (Simulation) async -> Void
    ) -> Run {
        let simulation = Simulation(seed: seed)
        let scheduler = SimulationScheduler(seed: seed ^ 0x5DEE_CE66_D1CE_5EED)
        let ending = Locked<SimulationScheduler.Ending?>(nil)
        let finished = DispatchSemaphore(value: 0)
        // A thread of its own: the scheduler runs jobs synchronously, which a Swift pool thread
        // (already inside a job) must not do.
        let thread = Thread {
            let result = scheduler.run(clock: simulation.clock, disk: simulation.disk, timeLimit: timeLimit) { await body(simulation) }
            ending.withLock { $0 = result }
            finished.signal()
        }
        thread.stackSize = 8 << 20
        thread.start()
        finished.wait()
        let result: Run.Ending =
            switch ending.withLock({ $0 }) {
            case .finished?: .finished
            case .stuck(let waiting)?: .stuck(waiting: waiting.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" })
            case .violated(let invariant)?: .violated(invariant)
            case .stepLimit?: .stepLimit
            case .timeLimit?, nil: .timeLimit
            }
        if result != .finished { simulation.record("run ended: \(result)") }
        return Run(seed: seed, ending: result, trace: simulation.trace, elapsed: simulation.now, steps: scheduler.steps, escapedJobs: scheduler.foreignEnqueues)
    }
}
