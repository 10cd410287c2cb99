import Foundation
import Synchronization

/// Whether a deterministic simulation (the ResilienceSimulation product) runs this process, and
/// what changes while it does.
///
/// The simulation runs every task on one thread, one job at a time, in an order drawn from its
/// seed. While it is active, the package's code changes in these ways, and in no other:
/// - `BlockingIOPool` runs its jobs inline on the caller's thread (a job finishing on a pool
///   thread at a moment of the kernel's choosing would make the run depend on more than its seed);
/// - the wall-clock time layers start their clocks from (`SimulationPoints.date()`) is the
///   simulation's, so the dates they compute follow the seed and not the machine's clock;
/// - identifiers the layers make (`SimulationPoints.uuid()`) are drawn from the seed, so
///   collections keyed by them are visited in the same order in every run of a seed, and so is
///   the drain service's jitter (`randomUnit()`);
/// - with a simulated disk (`fileSystem`), every `FileSystem` operation of the stores goes to it
///   instead of the kernel, so files, faults and crashes follow the seed too;
/// - objects that keep an invariant the simulation cannot see from outside (a wait line that
///   must be empty while a place is free) register a check (`watch(_:)`), run after every step;
/// - `suspendCancellably` suspends once before it installs its continuation. On real threads,
///   another thread can cancel the task, or hand it a value, in the window between a caller
///   joining a waiter line and suspending; on one thread nothing else runs in that window unless
///   it suspends. The suspension opens it, so the simulation explores what real threads can do
///   there (FoundationDB's simulator calls such points "buggify").
@usableFromInline
package enum SimulationPoints {
    private static let active = Atomic(false)

    /// Whether a simulation is running.
    @usableFromInline
    package static var isActive: Bool { active.load(ordering: .relaxed) }

    /// Set by the simulation as it starts and ends; `date` is its wall clock.
    package static func setActive(
        _ on: Bool,
        seed: UInt64 = 0,
        date: (@Sendable () -> Date)? = nil,
        pause: (@Sendable (UnsafeContinuation<Void, Never>) -> Void)? = nil,
        fileSystem: (any FileSystemStandIn)? = nil
    ) {
        disk.withLock { $0 = on ? fileSystem : nil }
        wallClock.withLock { $0 = on ? date.map(LockedFunction.init) : nil }
        pauser.withLock { $0 = on ? pause.map(LockedFunction.init) : nil }
        identifiers.withLock { $0 = SeededGenerator(seed: seed ^ 0x1D_E471_F1E5) }
        active.store(on, ordering: .relaxed)
        if !on {
            waiters.withLock { $0 = [:] }
            checks.withLock { $0 = [] }
        }
    }

    private struct Check: @unchecked Sendable {  // `owner` is only compared with nil
        weak var owner: AnyObject?
        let check: @Sendable () -> String?
    }

    private static let checks = Mutex<[Check]>([])

    /// Registers `check` for as long as `owner` lives, while a simulation runs (nothing
    /// otherwise): it runs after every step of the run and returns a description of the broken
    /// invariant, or nil. Capture `owner` weakly in it.
    package static func watch(_ owner: AnyObject, _ check: @escaping @Sendable () -> String?) {
        guard isActive else { return }
        checks.withLock { $0.append(Check(owner: owner, check: check)) }
    }

    /// The first registered invariant that does not hold now, if any.
    package static func brokenInvariant() -> String? {
        let live = checks.withLock { checks in
            checks.removeAll { $0.owner == nil }
            return checks.map(\.check)
        }
        for check in live {
            if let broken = check() { return broken }
        }
        return nil
    }

    private static let disk = Mutex<(any FileSystemStandIn)?>(nil)

    /// The simulated file system every `FileSystem` operation goes to while a simulation runs with
    /// one; nil otherwise (one relaxed atomic load on the real path).
    package static var fileSystem: (any FileSystemStandIn)? {
        guard isActive else { return nil }
        return disk.withLock { $0 }
    }

    private static let wallClock = Mutex<LockedFunction<@Sendable () -> Date>?>(nil)
    private static let identifiers = Mutex(SeededGenerator(seed: 0))

    /// A new random identifier: `UUID()`, or one drawn from the simulation's seed while one runs.
    package static func uuid() -> UUID {
        guard isActive else { return UUID() }
        return identifiers.withLock { generator in
            var bytes = (generator.next(), generator.next())
            return withUnsafeBytes(of: &bytes) { raw in
                var uuid = UUID().uuid
                withUnsafeMutableBytes(of: &uuid) { $0.copyBytes(from: raw) }
                uuid.6 = (uuid.6 & 0x0F) | 0x40  // version 4
                uuid.8 = (uuid.8 & 0x3F) | 0x80  // RFC 4122 variant
                return UUID(uuid: uuid)
            }
        }
    }

    /// A number in 0..<1 for jitter: `Double.random(in: 0..<1)`, or drawn from the seed while a
    /// simulation runs.
    package static func randomUnit() -> Double {
        guard isActive else { return Double.random(in: 0..<1) }
        return identifiers.withLock { Double($0.next() >> 11) * 0x1p-53 }
    }

    /// The current date: the machine's, or the simulation's while one runs. Layers that measure
    /// wall-clock times on an injected clock take their starting date from here.
    package static func date() -> Date {
        guard isActive, let date = wallClock.withLock({ $0 }) else { return Date() }
        return date.function()
    }

    /// Tasks suspended in `suspendCancellably` while the simulation runs, by the place they wait
    /// at: what a stuck run reports.
    private static let waiters = Mutex<[String: Int]>([:])

    /// Counts a task as waiting at `site`:`line` (until `resumed(_:)` with the key returned).
    @usableFromInline
    static func suspending(at site: StaticString, line: UInt) -> String {
        let key = "\(site):\(line)"
        waiters.withLock { $0[key, default: 0] += 1 }
        return key
    }

    /// The task counted by `suspending(at:line:)` under `key` goes on.
    @usableFromInline
    static func resumed(_ key: String) {
        waiters.withLock { waiters in
            waiters[key, default: 1] -= 1
            if waiters[key] == 0 { waiters[key] = nil }
        }
    }

    private static let pauser = Mutex<LockedFunction<@Sendable (UnsafeContinuation<Void, Never>) -> Void>?>(nil)

    /// Lets other tasks run before the caller goes on, for a turn or a while of virtual time, as
    /// the simulation decides. (`Task.yield()` is not used: Swift 6.3 enqueues its job past the
    /// runtime's global-enqueue hook, on a thread of the system's pool.)
    @usableFromInline
    static func yield() async {
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            if let pause = pauser.withLock({ $0 }) {
                pause.function(continuation)
            } else {
                Task { continuation.resume() }
            }
        }
    }

    /// Where tasks wait now, with how many at each place (call sites of the package's waits).
    package static var waitingSites: [String: Int] { waiters.withLock { $0 } }
}
