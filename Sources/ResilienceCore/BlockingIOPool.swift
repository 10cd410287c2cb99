import Foundation

/// A small pool of dedicated threads for work that blocks: file I/O (`fsync` can block for
/// milliseconds) and, on Linux, calls into `URLSession` that wait for its work queue.
///
/// Swift's cooperative thread pool has one thread per core and must never block, and GCD on Linux
/// does not add threads when workers block, so such work runs here. Concurrent writers then fsync
/// in parallel, which is what makes group commit pay off. Threads start as jobs arrive and end
/// after a while without work.
package final class BlockingIOPool: Sendable {
    private struct State {
        var jobs: [@Sendable () -> Void] = []
        var started = 0
        var idle = 0
    }

    private let condition = NSCondition()
    // Guarded by `condition` (not `Locked`), because workers must wait on it.
    private nonisolated(unsafe) var state = State()
    private let maxThreads: Int
    private let name: String
    private let yieldsToOtherWork: Bool

    package static let shared = BlockingIOPool(maxThreads: 32, name: "resilience.blocking-io")

    /// For work that is not on anyone's path — the deferred deletions of a queue's finished
    /// entries — on threads that yield the CPU to the rest of the process (`yieldsToOtherWork`).
    /// On two busy cores, a deletion thread at normal priority took the CPU from the threads a
    /// replay's requests go through (Benchmarks/README.md, "OfflineQueue"). Only `submit` work
    /// that neither resumes a task nor starts a thread: a thread started from one of these (by
    /// libdispatch, say, for a resumed continuation) would inherit its lower priority, so `run`
    /// refuses this pool. Whoever waits for such work (a pass waiting at its end for the batch
    /// of deletions in progress) may wait a little longer on a busy CPU.
    package static let background = BlockingIOPool(maxThreads: 4, name: "resilience.background-io", yieldsToOtherWork: true)

    /// How long a thread waits for work before it ends.
    private static let idleLifetime: TimeInterval = 30

    /// A pool of at most `maxThreads` threads, named `name`, started as jobs arrive (1 makes it serial).
    ///
    /// With `yieldsToOtherWork`, its threads run at a lower priority (a nice value 10 higher than
    /// the process's on Linux, the utility quality of service on Apple platforms): they still get
    /// a share of a busy CPU, so their work is delayed, never starved.
    package init(maxThreads: Int, name: String, yieldsToOtherWork: Bool = false) {
        self.maxThreads = max(1, maxThreads)
        self.name = name
        self.yieldsToOtherWork = yieldsToOtherWork
    }

    /// Runs `body` on a pool thread and returns its result.
    /// While a simulation runs (`SimulationPoints`), it runs `body` at once on the caller's thread.
    /// Not on a pool that `yieldsToOtherWork` (see `background`).
    package func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        precondition(!yieldsToOtherWork, "run(_:) on a lower-priority pool: its threads would pass their priority on")
        if SimulationPoints.isActive { return try body() }
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            submit {
                do { continuation.resume(returning: try body()) } catch { continuation.resume(throwing: error) }
            }
        }
    }

    /// Jobs submitted and not yet started (tests use it to order work behind a held thread).
    package var queuedJobCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return state.jobs.count
    }

    /// Runs `job` on a pool thread without waiting for it.
    package func submit(_ job: @escaping @Sendable () -> Void) {
        if SimulationPoints.isActive { return job() }
        condition.lock()
        state.jobs.append(job)
        // A worker that was signalled but has not woken yet still counts as idle, so compare the
        // backlog with the idle workers rather than testing for none idle: a burst of jobs must
        // get as many threads as it can use.
        let spawn = state.jobs.count > state.idle && state.started < maxThreads
        if spawn { state.started += 1 }
        condition.signal()
        condition.unlock()
        if spawn {
            let lower = yieldsToOtherWork
            let thread = Thread { [self] in
                if lower { Self.lowerThisThreadsPriority() }
                self.work()
            }
            thread.name = name
            #if canImport(Darwin)
            if lower { thread.qualityOfService = .utility }
            #endif
            thread.start()
        }
    }

    /// Linux: the calling thread's nice value raised by 10 (at most 19), for that thread only —
    /// Linux keeps a nice value per thread, and `setpriority`'s `who` 0 is the calling one.
    /// Relative, so a process already running at a lower priority is never raised by it. A
    /// failure leaves the thread at its priority, which is only slower for others.
    private static func lowerThisThreadsPriority() {
        #if canImport(Glibc)
        let which = __priority_which_t(PRIO_PROCESS.rawValue)
        #elseif canImport(Musl)
        let which = PRIO_PROCESS
        #endif
        #if canImport(Glibc) || canImport(Musl)
        errno = 0
        let current = getpriority(which, 0)
        guard errno == 0 else { return }
        _ = setpriority(which, 0, min(current + 10, 19))
        #endif
    }

    private func work() {
        while true {
            condition.lock()
            while state.jobs.isEmpty {
                state.idle += 1
                let woken = condition.wait(until: Date(timeIntervalSinceNow: Self.idleLifetime))
                state.idle -= 1
                if !woken, state.jobs.isEmpty {
                    state.started -= 1  // a later burst starts threads again
                    condition.unlock()
                    return
                }
            }
            let job = state.jobs.removeFirst()
            condition.unlock()
            job()
        }
    }
}
