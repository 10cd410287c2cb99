/// The drain service's lifecycle as a value: which phase it is in, where its loop is, and what each
/// event (`start`, `stop`, a cycle's turn, a cycle's end, a reconnect, a wake-up) makes it do.
/// `DrainService` holds one, feeds it the events, and performs the actions it returns (starting,
/// cancelling or awaiting its tasks); the machine itself does no I/O and reads no clock, so every
/// transition is unit-tested by hand (`DrainServiceStateMachineTests`).
///
/// ```
///            start()                      stop()                     loop ended
///   idle ───────────► running(step) ─────────────► stopping ──────────────────► idle
///                      │  ▲
///                      ▼  │ subscribing → waitingForTurn → cycling → sleeping → waitingForTurn …
/// ```
struct DrainServiceStateMachine: Sendable {
    enum Phase: Equatable, Sendable {
        /// Not started, or stopped and the loop has ended.
        case idle
        /// The loop runs; `step` is where it is.
        case running(Running)
        /// `stop()` was called; the loop's cycle in flight (if any) ends, then the loop does.
        case stopping(loop: UInt64)
    }

    struct Running: Equatable, Sendable {
        /// Which loop (the n-th started), so the end of an old loop is never taken for this one's.
        var loop: UInt64
        var step: Step
        /// Connectivity returned and its cycle has not begun yet.
        var reconnectPending: Bool
    }

    /// Where the running loop is.
    enum Step: Equatable, Sendable {
        /// Subscribing to connectivity before the first cycle.
        case subscribing
        /// Waiting for its turn behind `drainNow()` cycles (one cycle at a time).
        case waitingForTurn
        /// A cycle runs.
        case cycling
        /// Waiting for the next timed cycle (or a reconnect).
        case sleeping
    }

    /// What `stop()` must do.
    struct StopAction: Equatable, Sendable {
        /// End the connectivity listener and wake the loop's sleep (the loop was running).
        var endListenerAndSleep = false
        /// Cancel the loop task: it waits for its turn (and must leave the line), or the caller
        /// asked to interrupt the cycle in flight.
        var cancelLoop = false
        /// Wait for the loop task to end (a loop is running or winding down).
        var awaitLoop = false
    }

    /// What the loop does after a cycle.
    enum AfterCycle: Equatable, Sendable {
        /// Run the next cycle at once: connectivity returned during this one.
        case runForReconnect
        /// Sleep until the next timed cycle.
        case sleep
        /// Stop looping: `stop()` was called.
        case exit
    }

    /// Why the loop's sleep ended.
    enum Wake: Equatable, Sendable {
        case elapsed, reconnect, stopped
    }

    private(set) var phase: Phase = .idle
    /// `stop()` calls so far: a `start()` that waited for a stop ignores itself if another stop
    /// came meanwhile.
    private(set) var stopsRequested: UInt64 = 0
    /// Loops started so far; the current loop is the last.
    private(set) var loopsStarted: UInt64 = 0

    var isRunning: Bool {
        if case .running = phase { return true }
        return false
    }

    var reconnectPending: Bool {
        if case .running(let running) = phase { return running.reconnectPending }
        return false
    }

    // MARK: start / stop

    /// `start()`, once no stop is winding down: `true` when the loop is to be started now. A
    /// running service, or a stop asked for since `stopsBefore` was read, starts nothing.
    mutating func start(stopsBefore: UInt64) -> Bool {
        guard case .idle = phase, stopsRequested == stopsBefore else { return false }
        loopsStarted &+= 1
        phase = .running(Running(loop: loopsStarted, step: .subscribing, reconnectPending: false))
        return true
    }

    /// `stop(interruptingCycle:)`.
    mutating func stop(interruptingCycle: Bool) -> StopAction {
        stopsRequested &+= 1
        switch phase {
        case .idle:
            return StopAction()
        case .running(let running):
            phase = .stopping(loop: running.loop)
            return StopAction(
                endListenerAndSleep: true,
                cancelLoop: interruptingCycle || running.step == .waitingForTurn,
                awaitLoop: true
            )
        case .stopping:
            // A second stop while the first still waits: it may interrupt the cycle.
            return StopAction(cancelLoop: interruptingCycle, awaitLoop: true)
        }
    }

    /// Loop `loop` has ended (seen by whoever awaited it: a `stop()`, or a `start()` waiting for
    /// a stop to complete). The end of a loop other than the one stopping changes nothing.
    mutating func loopEnded(_ loop: UInt64) {
        if case .stopping(loop) = phase { phase = .idle }
    }

    // MARK: The loop

    /// The loop has subscribed to connectivity: `false` when it must end instead.
    func subscribed() -> Bool {
        isRunning
    }

    /// The loop is about to ask for its turn to run a cycle: `false` when it must end instead.
    mutating func cycleWanted() -> Bool {
        guard case .running(let running) = phase else { return false }
        phase = .running(Running(loop: running.loop, step: .waitingForTurn, reconnectPending: false))
        return true
    }

    /// The loop got its turn: `true` to run the cycle, `false` to give the turn back unused (a
    /// stop came while it waited).
    mutating func turnGranted() -> Bool {
        guard case .running(var running) = phase else { return false }
        running.step = .cycling
        phase = .running(running)
        return true
    }

    /// The loop's cycle ended.
    mutating func cycleEnded(loopCancelled: Bool) -> AfterCycle {
        guard !loopCancelled, case .running(var running) = phase else { return .exit }
        if running.reconnectPending { return .runForReconnect }
        running.step = .sleeping
        phase = .running(running)
        return .sleep
    }

    /// Connectivity returned: `true` when the loop's sleep is to be cut short (a running service
    /// runs a reconnect cycle next, and its failure count restarts).
    mutating func connectivityReturned() -> Bool {
        guard case .running(var running) = phase else { return false }
        running.reconnectPending = true
        phase = .running(running)
        return true
    }

    /// The loop's sleep ended: on its own (`elapsed`), or cut short.
    func sleepEnded(elapsed: Bool, loopCancelled: Bool) -> Wake {
        guard !loopCancelled, case .running(let running) = phase else { return .stopped }
        if elapsed { return .elapsed }
        return running.reconnectPending ? .reconnect : .stopped
    }
}
