import Dispatch
import Foundation
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
/// The handler is installed before `init` returns, so no signal sent after that is missed. While
/// a listener lives, its signals' default action (terminate) is replaced: they are delivered to
/// `next()` instead (every live listener of a signal receives it). `cancel()` (or deinit) restores
/// the default once no listener of that signal is left, so a second SIGTERM or Ctrl-C after the
/// first one was handled terminates the process as usual if the service does not stop.
public final class SignalListener: Sendable {
    private struct State {
        var received: [Int32] = []
        var waiters: [CheckedContinuation<Int32?, Never>] = []
        var cancelled = false
    }

    /// The signals listened for.
    public let signals: [Int32]
    private let state = Locked(State())
    private let id: UInt64

    /// Starts listening for `signals` at once (before this returns), so none is missed.
    public init(signals: [Int32] = [SIGTERM, SIGINT]) {
        self.signals = signals
        let state = self.state
        id = SignalHub.shared.add(signals: signals) { number in
            let waiter: CheckedContinuation<Int32?, Never>? = state.withLock { state in
                guard !state.cancelled else { return nil }
                if state.waiters.isEmpty {
                    state.received.append(number)
                    return nil
                }
                return state.waiters.removeFirst()
            }
            waiter?.resume(returning: number)
        }
    }

    /// Waits for the next signal and returns its number; `nil` once the listener is cancelled.
    public func next() async -> Int32? {
        await withCheckedContinuation { continuation in
            let immediate: Int32?? = state.withLock { state in
                if !state.received.isEmpty { return .some(state.received.removeFirst()) }
                if state.cancelled { return .some(nil) }
                state.waiters.append(continuation)
                return .none
            }
            if case .some(let value) = immediate { continuation.resume(returning: value) }
        }
    }

    /// Stops listening, restores the signals' default action (once no other listener has them)
    /// and ends every `next()` with `nil`.
    public func cancel() {
        let waiters: [CheckedContinuation<Int32?, Never>]? = state.withLock { state in
            guard !state.cancelled else { return nil }
            state.cancelled = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        guard let waiters else { return }
        SignalHub.shared.remove(id)
        for waiter in waiters { waiter.resume(returning: nil) }
    }

    deinit {
        cancel()
    }
}

/// The write end of the self-pipe the C signal handler writes to. Set once, under the hub's lock,
/// before the first handler is installed; never changed afterwards.
nonisolated(unsafe) private var signalPipeWriteEnd: Int32 = -1

/// The signal handler: only async-signal-safe work — one byte into the pipe.
private func forwardSignal(_ number: Int32) {
    var byte = UInt8(truncatingIfNeeded: number)
    _ = write(signalPipeWriteEnd, &byte, 1)
}

/// Process-wide: installs `sigaction`-level handlers synchronously (so there is no window in which
/// a signal is lost, as there is with a Dispatch signal source whose registration completes later
/// on another thread), and fans the signals read from the self-pipe out to the listeners.
private final class SignalHub: Sendable {
    static let shared = SignalHub()

    private struct Listener {
        let signals: Set<Int32>
        let deliver: @Sendable (Int32) -> Void
    }

    private struct State {
        var listeners: [UInt64: Listener] = [:]
        var nextID: UInt64 = 0
        var readerStarted = false
    }

    private let state = Locked(State())

    func add(signals: [Int32], deliver: @escaping @Sendable (Int32) -> Void) -> UInt64 {
        state.withLock { state in
            if !state.readerStarted {
                startReader()
                state.readerStarted = true
            }
            let id = state.nextID
            state.nextID += 1
            state.listeners[id] = Listener(signals: Set(signals), deliver: deliver)
            for number in signals { _ = signal(number, forwardSignal) }
            return id
        }
    }

    func remove(_ id: UInt64) {
        state.withLock { state in
            guard let removed = state.listeners.removeValue(forKey: id) else { return }
            let stillWanted = state.listeners.values.reduce(into: Set<Int32>()) { $0.formUnion($1.signals) }
            for number in removed.signals where !stillWanted.contains(number) {
                _ = signal(number, SIG_DFL)
            }
        }
    }

    /// Called once, under the lock, before any handler is installed.
    private func startReader() {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { return }  // no pipe: the handlers' writes fail harmlessly
        for fd in ends { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
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
    }
}

extension DrainService {
    /// Starts the service, waits for one of `signals` (SIGTERM and SIGINT by default), stops it
    /// cleanly — waiting for the cycle in flight, or interrupting it with
    /// `interruptingCycle: true` — and returns the signal received.
    ///
    /// ```swift
    /// // main.swift of a service
    /// let signal = await drainer.runUntilSignalled()
    /// print("stopped on signal \(signal)")
    /// ```
    @discardableResult
    public func runUntilSignalled(
        _ signals: [Int32] = [SIGTERM, SIGINT],
        interruptingCycle: Bool = false
    ) async -> Int32 {
        let listener = SignalListener(signals: signals)
        defer { listener.cancel() }
        await start()
        let signal = await listener.next() ?? 0
        await stop(interruptingCycle: interruptingCycle)
        return signal
    }
}
