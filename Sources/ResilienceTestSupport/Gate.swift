@_spi(ResilienceCore) import ResilienceCore

/// A one-shot async gate: `wait()` suspends until `open()`; after that it returns at once.
package final class Gate: Sendable {
    private struct State {
        var isOpen = false
        var waiters = WaiterList<Void, Void>()
    }
    private let state = Locked(State())

    package init() {}

    package func open() {
        let waiters = state.withLock { state in
            state.isOpen = true
            return state.waiters.takeAll()
        }
        for waiter in waiters { waiter.resume(returning: ()) }
    }

    /// Returns once the gate is open, or the waiting task is cancelled.
    package func wait() async {
        await state.wait(on: \.waiters, tag: (), cancelled: ()) { $0.isOpen ? () : nil }
    }
}

/// A thread-safe append-only log, readable from the test while the code under test runs elsewhere.
package final class Log<Element: Sendable>: Sendable {
    private let entries = Locked<[Element]>([])

    package init() {}

    package func append(_ element: Element) {
        entries.withLock { $0.append(element) }
    }

    package var values: [Element] {
        entries.withLock { $0 }
    }

    package var count: Int {
        entries.withLock { $0.count }
    }
}

/// Yields until `condition` holds (other tasks run meanwhile; no wall-clock waiting). Gives up
/// when the test's time limit cancels it: the test's own expectations then fail.
package func yieldUntil(_ condition: () -> Bool) async {
    while !condition() {
        if Task.isCancelled { return }
        await Task.yield()
    }
}
