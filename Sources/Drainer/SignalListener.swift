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
/// While the listener is alive the signals' default action (terminate) is replaced: they are
/// delivered to `next()` instead. `cancel()` (or deinit) restores the default, so a second
/// SIGTERM or Ctrl-C after the first one is handled terminates the process as usual if the
/// service does not stop.
public final class SignalListener: Sendable {
    private struct State {
        var received: [Int32] = []
        var waiters: [CheckedContinuation<Int32?, Never>] = []
        var cancelled = false
    }

    /// A dispatch source is thread-safe; it is only created, resumed and cancelled here.
    private struct Source: @unchecked Sendable {
        let source: any DispatchSourceSignal
    }

    /// The signals listened for.
    public let signals: [Int32]
    private let state = Locked(State())
    private let sources: [Source]

    /// Starts listening for `signals` at once (before this returns), so none is missed.
    public init(signals: [Int32] = [SIGTERM, SIGINT]) {
        self.signals = signals
        let state = self.state
        let queue = DispatchQueue(label: "resilience.signal-listener")
        var sources: [Source] = []
        for number in signals {
            signal(number, SIG_IGN)  // Dispatch sees the signal; the default action does not run
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler {
                let waiter: CheckedContinuation<Int32?, Never>? = state.withLock { state in
                    if state.waiters.isEmpty {
                        state.received.append(number)
                        return nil
                    }
                    return state.waiters.removeFirst()
                }
                waiter?.resume(returning: number)
            }
            source.resume()
            sources.append(Source(source: source))
        }
        self.sources = sources
    }

    /// Waits for the next signal and returns its number; `nil` once the listener is cancelled.
    public func next() async -> Int32? {
        await withCheckedContinuation { continuation in
            let immediate: Int32?? = state.withLock { state in
                if state.cancelled { return .some(nil) }
                if !state.received.isEmpty { return .some(state.received.removeFirst()) }
                state.waiters.append(continuation)
                return .none
            }
            if case .some(let value) = immediate { continuation.resume(returning: value) }
        }
    }

    /// Stops listening, restores the signals' default action and ends every `next()` with `nil`.
    public func cancel() {
        let waiters: [CheckedContinuation<Int32?, Never>] = state.withLock { state in
            guard !state.cancelled else { return [] }
            state.cancelled = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: nil) }
        restoreDefaults()
    }

    private func restoreDefaults() {
        for source in sources { source.source.cancel() }
        for number in signals { signal(number, SIG_DFL) }
    }

    deinit {
        let alreadyCancelled = state.withLock { $0.cancelled }
        if !alreadyCancelled { restoreDefaults() }
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
