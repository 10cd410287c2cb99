import Foundation

/// An `OfflineQueueEngine`'s life as one value, with the tasks it owns in its cases: stopped;
/// started — its connectivity loop, its arrivals follower (storage other than the disk), and its
/// timer idle or armed, with the passes of timers that fired still running; or closed, for good.
/// The engine asks it what to do and performs it (creates, cancels and awaits the tasks); nothing
/// here awaits or does I/O, so each transition is tested on its own (`QueueEngineLifecycleTests`).
///
/// | state | `start` | `arm(at:)` | timer fires | `disarm` | `stop` | `close` |
/// | --- | --- | --- | --- | --- | --- | --- |
/// | stopped | started, timer idle | nothing | no pass | nothing | nothing | closed |
/// | started, timer idle | nothing | armed | no pass | nothing | stopped, tasks ended | closed, tasks ended |
/// | started, timer armed (n, d) | nothing | armed again only for an earlier date | if n: a pass (idle meanwhile); else none | idle | stopped, tasks ended | closed, tasks ended |
/// | closed | nothing | nothing | no pass | nothing | nothing | nothing |
///
/// A timer is numbered when armed: one replaced or cancelled after its sleep ended finds another
/// number (or none) and runs no pass — the `queue-stop-timer-pass` simulation patch puts back the
/// bug where a stopped queue's timer ran one.
struct QueueEngineLifecycle {
    enum State {
        case stopped
        case started(Started)
        case closed
    }

    struct Started {
        /// Follows the reachability monitor: a pass on every reconnect.
        var loop: Task<Void, Never>
        /// On storage other than the disk: a pass on each arrival another consumer announces.
        var arrivals: Task<Void, Never>?
        var timer: Timer = .idle
        /// Timers that fired, by number, whose pass runs or waits for its turn: `stop()` cancels
        /// and awaits them (the pass of one may arm the next while it waits).
        var firing: [UInt64: Task<Void, Never>] = [:]
    }

    enum Timer {
        case idle
        case armed(number: UInt64, deadline: Date, task: Task<Void, Never>)
    }

    private(set) var state: State = .stopped
    private var lastTimerNumber: UInt64 = 0

    var isStarted: Bool {
        if case .started = state { true } else { false }
    }

    var isClosed: Bool {
        if case .closed = state { true } else { false }
    }

    /// The date the armed timer fires at, if one is armed.
    var timerDeadline: Date? {
        guard case .started(let started) = state, case .armed(_, let deadline, _) = started.timer else { return nil }
        return deadline
    }

    /// Starts, with the tasks `make` returns (called only when stopped): false when started
    /// already or closed.
    mutating func start(_ make: () -> (loop: Task<Void, Never>, arrivals: Task<Void, Never>?)) -> Bool {
        guard case .stopped = state else { return false }
        let tasks = make()
        state = .started(Started(loop: tasks.loop, arrivals: tasks.arrivals))
        return true
    }

    /// Arms the timer for `deadline` unless it is armed for that date or earlier already, with the
    /// task `make` returns for the timer's number; returns the task of the timer it replaces, to
    /// cancel. Only while started.
    mutating func arm(at deadline: Date, _ make: (_ number: UInt64) -> Task<Void, Never>) -> Task<Void, Never>? {
        guard case .started(var started) = state else { return nil }
        var replaced: Task<Void, Never>?
        if case .armed(_, let current, let task) = started.timer {
            guard deadline < current else { return nil }
            replaced = task
        }
        lastTimerNumber &+= 1
        started.timer = .armed(number: lastTimerNumber, deadline: deadline, task: make(lastTimerNumber))
        state = .started(started)
        return replaced
    }

    /// No timer while offline: returns the armed one's task, to cancel.
    mutating func disarm() -> Task<Void, Never>? {
        guard case .started(var started) = state, case .armed(_, _, let task) = started.timer else { return nil }
        started.timer = .idle
        state = .started(started)
        return task
    }

    /// The timer numbered `number` ended its sleep: true when it is still the armed one, which
    /// then counts as firing (its pass runs) and leaves the timer idle for the next to be armed.
    mutating func timerFired(_ number: UInt64) -> Bool {
        guard case .started(var started) = state, case .armed(number, _, let task) = started.timer else { return false }
        started.timer = .idle
        started.firing[number] = task
        state = .started(started)
        return true
    }

    /// The pass of the timer numbered `number` ended.
    mutating func firingEnded(_ number: UInt64) {
        guard case .started(var started) = state else { return }
        started.firing[number] = nil
        state = .started(started)
    }

    /// Stops: returns the tasks to cancel and then await, in that order (arrivals, loop, timer,
    /// the firing timers oldest first).
    mutating func stop() -> [Task<Void, Never>] {
        guard case .started(let started) = state else { return [] }
        state = .stopped
        return Self.tasks(of: started)
    }

    /// Closes for good: `stop()`, and nothing starts again.
    mutating func close() -> [Task<Void, Never>] {
        let tasks = stop()
        state = .closed
        return tasks
    }

    /// Every task the engine owns now (for its `deinit`, which can only cancel them).
    var tasks: [Task<Void, Never>] {
        if case .started(let started) = state { Self.tasks(of: started) } else { [] }
    }

    private static func tasks(of started: Started) -> [Task<Void, Never>] {
        var tasks = [started.arrivals, started.loop].compactMap { $0 }
        if case .armed(_, _, let task) = started.timer { tasks.append(task) }
        tasks += started.firing.sorted { $0.key < $1.key }.map(\.value)
        return tasks
    }
}
