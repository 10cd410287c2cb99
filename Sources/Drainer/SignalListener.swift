import Dispatch
import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// Turns process signals (SIGTERM, SIGINT) into something a service can `await`, so it can stop
/// its drain service cleanly instead of being killed mid-cycle.
///
/// ```swift
/// let signals = SignalListener()               // handles SIGTERM and SIGINT from now on
/// await drainer.start()
/// let signal = await signals.next()            // a deployment stops the service
/// await drainer.stop()                         // the cycle in flight ends within its budget
/// ```
///
/// The handler is installed before `init` returns (`isListening`), so no signal sent after that is
/// missed. While a listener lives, its signals' previous action (by default: terminate) is
/// replaced: they are delivered to `next()` instead (every live listener of a signal receives
/// it). `cancel()` (or deinit) restores the previous action once no listener of that signal is
/// left, so a second SIGTERM or Ctrl-C after the first one was handled terminates the process as
/// usual if the service does not stop.
public final class SignalListener: Sendable {
    private struct State {
        var received: [Int32] = []
        /// Callers of `next()`: resumed with a signal, or `nil` when cancelled.
        var waiters = WaiterList<Int32?, Void>()
        var cancelled = false
    }

    /// The signals listened for.
    public let signals: [Int32]
    /// Whether the handlers are installed. `false` only when the process could not create the
    /// self-pipe (no file descriptors left): the signals then keep their previous action
    /// (SIGTERM still terminates), rather than being swallowed with nobody told.
    public let isListening: Bool
    private let state = Locked(State())
    private let id: UInt64?

    /// Starts listening for `signals` at once (before this returns), so none is missed.
    public init(signals: [Int32] = [SIGTERM, SIGINT]) {
        self.signals = signals
        let state = self.state
        id = SignalHub.shared.add(signals: signals) { number in
            let waiter = state.withLock { state -> WaiterList<Int32?, Void>.Waiter? in
                guard !state.cancelled else { return nil }
                switch state.waiters.resumeFirst(with: number) {
                case .resume(let waiter)?: return waiter
                case .handedToPending?: return nil
                case nil:
                    state.received.append(number)
                    return nil
                }
            }
            waiter?.resume(returning: number)
        }
        isListening = id != nil
    }

    /// Waits for the next signal and returns its number; `nil` once the listener is cancelled or
    /// when the calling task is cancelled.
    public func next() async -> Int32? {
        await state.wait(on: \.waiters, tag: (), cancelled: nil) { state -> Int32?? in
            if !state.received.isEmpty { return .some(state.received.removeFirst()) }
            if state.cancelled { return .some(nil) }
            return .none
        }
    }

    /// Stops listening, restores the signals' previous actions (once no other listener has them)
    /// and ends every `next()` with `nil`.
    public func cancel() {
        _ = cancelReturningUnconsumed()
    }

    /// `cancel()`, returning the signals received but never handed to `next()`.
    func cancelReturningUnconsumed() -> [Int32] {
        let ended = state.withLock { state -> (waiters: [WaiterList<Int32?, Void>.Waiter], unconsumed: [Int32])? in
            guard !state.cancelled else { return nil }
            state.cancelled = true
            defer { state.received.removeAll() }
            // Callers on their way to suspend see `cancelled` as they do.
            return (state.waiters.takeAll(), state.received)
        }
        guard let ended else { return [] }
        if let id { SignalHub.shared.remove(id) }
        for waiter in ended.waiters { waiter.resume(returning: nil) }
        return ended.unconsumed
    }

    deinit {
        cancel()
    }
}

/// The write end of the self-pipe the C signal handler writes to. Set once, under the hub's lock,
/// before the first handler is installed; never changed afterwards.
nonisolated(unsafe) private var signalPipeWriteEnd: Int32 = -1

/// The signal handler: only async-signal-safe work — one byte into a non-blocking pipe, with
/// `errno` saved and restored for the code it interrupted.
private func forwardSignal(_ number: Int32) {
    let savedErrno = errno
    var byte = UInt8(truncatingIfNeeded: number)
    _ = write(signalPipeWriteEnd, &byte, 1)
    errno = savedErrno
}

/// A `sigaction` saved at install time, restored when the last listener of the signal leaves.
/// Plain C data, only read and written under the hub's lock.
private struct SavedAction: @unchecked Sendable {
    var action: sigaction
}

/// Process-wide: installs the handlers with `sigaction` synchronously (so there is no window in
/// which a signal is lost, as there is with a Dispatch signal source whose registration completes
/// later on another thread), remembers the actions it replaced, and fans the signals read from the
/// self-pipe out to the listeners.
private final class SignalHub: Sendable {
    static let shared = SignalHub()

    private struct Listener {
        let signals: Set<Int32>
        let deliver: @Sendable (Int32) -> Void
    }

    private struct State {
        var listeners: [UInt64: Listener] = [:]
        var nextID: UInt64 = 0
        var pipeReady: Bool?  // nil: not tried yet
        var saved: [Int32: SavedAction] = [:]
    }

    private let state = Locked(State())

    /// Registers a listener and installs the handlers; `nil` when no self-pipe could be made (then
    /// nothing is installed).
    func add(signals: [Int32], deliver: @escaping @Sendable (Int32) -> Void) -> UInt64? {
        state.withLock { state in
            // A failed pipe (no descriptors left) is tried again by the next listener.
            if state.pipeReady != true { state.pipeReady = startReader() }
            guard state.pipeReady == true else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.listeners[id] = Listener(signals: Set(signals), deliver: deliver)
            for number in Set(signals) where state.saved[number] == nil {
                var action = sigaction()
                #if canImport(Darwin)
                action.__sigaction_u.__sa_handler = forwardSignal
                #elseif canImport(Glibc)
                action.__sigaction_handler.sa_handler = forwardSignal
                #elseif canImport(Musl)
                action.__sa_handler.sa_handler = forwardSignal
                #else
                action.sa_handler = forwardSignal
                #endif
                action.sa_flags = SA_RESTART
                sigemptyset(&action.sa_mask)
                var previous = sigaction()
                if sigaction(number, &action, &previous) == 0 {
                    state.saved[number] = SavedAction(action: previous)
                }
            }
            return id
        }
    }

    func remove(_ id: UInt64) {
        state.withLock { state in
            guard let removed = state.listeners.removeValue(forKey: id) else { return }
            let stillWanted = state.listeners.values.reduce(into: Set<Int32>()) { $0.formUnion($1.signals) }
            for number in removed.signals where !stillWanted.contains(number) {
                guard var saved = state.saved.removeValue(forKey: number) else { continue }
                _ = sigaction(number, &saved.action, nil)
            }
        }
    }

    /// Called once, under the lock, before any handler is installed. Returns whether the pipe and
    /// its reader exist.
    private func startReader() -> Bool {
        var ends: [Int32] = [-1, -1]
        // Made once per process, at the first listener. (`pipe2` with O_CLOEXEC would close the
        // short window before `fcntl` in which a child spawned by another thread could inherit
        // the ends; Glibc declares it only under _GNU_SOURCE, which Swift's module does not set.)
        guard pipe(&ends) == 0 else { return false }
        for fd in ends { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        // A full pipe must never block a signal handler: extra signals are dropped instead (the
        // reader already has bytes to wake for).
        _ = fcntl(ends[1], F_SETFL, fcntl(ends[1], F_GETFL) | O_NONBLOCK)
        signalPipeWriteEnd = ends[1]
        let readEnd = ends[0]
        let thread = Thread { [self] in
            var byte: UInt8 = 0
            while true {
                let count = read(readEnd, &byte, 1)
                if count == 1 {
                    let number = Int32(byte)
                    let targets = state.withLock { state in
                        state.listeners.values.filter { $0.signals.contains(number) }.map(\.deliver)
                    }
                    for deliver in targets { deliver(number) }
                } else if count < 0 && errno == EINTR {
                    continue
                } else {
                    return
                }
            }
        }
        thread.name = "resilience.signals"
        thread.start()
        return true
    }
}

extension DrainService {
    /// Starts the service, waits for one of `signals` (SIGTERM and SIGINT by default), stops
    /// listening (so a second signal acts as it did before, e.g. terminates), stops the service
    /// cleanly — waiting for the cycle in flight, or interrupting it with `.interruptingCycle` —
    /// and returns the signal received; `nil` when the calling task
    /// was cancelled instead (the service is stopped then too).
    ///
    /// ```swift
    /// // main.swift of a service
    /// let signal = await drainer.runUntilSignalled()
    /// print("stopped on signal \(signal ?? 0)")
    /// ```
    @discardableResult
    public func runUntilSignalled(
        _ signals: [Int32] = [SIGTERM, SIGINT],
        stopping mode: StopMode = .lettingCycleFinish
    ) async -> Int32? {
        let listener = SignalListener(signals: signals)
        await start()
        let signal = await listener.next()
        // A second signal that came before the previous action was back gets that action now.
        for unconsumed in listener.cancelReturningUnconsumed() { raise(unconsumed) }
        await stop(mode)
        return signal
    }
}
