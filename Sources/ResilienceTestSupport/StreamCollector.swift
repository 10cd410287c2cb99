@_spi(ResilienceCore) import ResilienceCore

/// Collects an async stream's elements and lets a test wait for a number of them.
package final class StreamCollector<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        /// Tagged with the number of elements they wait for.
        var waiters = WaiterList<Void, Int>()
        var finished = false
    }

    private let state = Locked(State())
    private let task: Task<Void, Never>

    package init(_ stream: AsyncStream<Element>) {
        let state = self.state
        task = Task {
            for await item in stream {
                let ready = state.withLock { state in
                    state.items.append(item)
                    let count = state.items.count
                    return state.waiters.takeAll { $0 <= count }
                }
                for waiter in ready { waiter.resume(returning: ()) }
            }
            // The stream ended: nobody waits for more.
            let waiting = state.withLock { state in
                state.finished = true
                return state.waiters.takeAll()
            }
            for waiter in waiting { waiter.resume(returning: ()) }
        }
    }

    deinit { task.cancel() }

    /// The elements so far, in arrival order.
    package var items: [Element] { state.withLock { $0.items } }

    /// Suspends until `count` elements arrived, the stream ended, or the waiting task is cancelled.
    package func wait(for count: Int) async {
        await state.wait(on: \.waiters, tag: count, cancelled: ()) { state in
            state.items.count >= count || state.finished ? () : nil
        }
    }
}
