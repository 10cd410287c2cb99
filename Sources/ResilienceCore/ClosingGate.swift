/// Admits operations until it is closed; `close()` refuses new ones and returns once every
/// admitted one has left. The stores use one each, so that `close()` lets go of their folder only
/// when nothing of theirs is touching it any more: a `DiskQueueStore` around every operation on its
/// files, a `DiskResponseCache` around its reads of files and `clear()` (its file loops it waits
/// for on its own).
///
/// The check and the count are one step: an operation admitted before `close()` is waited for, one
/// that comes after is refused, and none slips between.
package final class ClosingGate: Sendable {
    private struct State: Sendable {
        var closed = false
        var admitted = 0
        var closers = WaiterList<Void, Void>()
    }

    private let state = Locked(State())

    package init() {}

    /// Admits an operation: true, and then `leave()` must follow; false once closed.
    package func enter() -> Bool {
        state.withLock { state in
            guard !state.closed else { return false }
            state.admitted += 1
            return true
        }
    }

    /// An admitted operation has ended.
    package func leave() {
        let closers = state.withLock { state in
            state.admitted -= 1
            return state.admitted == 0 ? state.closers.takeAll() : []
        }
        for closer in closers { closer.resume(returning: ()) }
    }

    /// Whether `close()` was called (the operations it waits for may still be running).
    package var isClosed: Bool { state.withLock { $0.closed } }

    /// Refuses every operation from now on and returns once those admitted have left — whether or
    /// not the calling task is cancelled: what it waits for is I/O, which always ends.
    package func close() async {
        state.withLock { $0.closed = true }
        await Task { [state] in
            while state.withLock({ $0.admitted > 0 }) {
                await state.wait(on: \.closers, tag: (), cancelled: ()) { $0.admitted == 0 ? () : nil }
            }
        }.value
    }
}
