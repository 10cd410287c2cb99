/// The live `AsyncStream`s handed out by one publisher (queue results, drain reports,
/// connectivity), and what they all receive.
///
/// A stream leaves the moment its consumer stops listening (its `onTermination` removes it
/// under the lock; no task, no actor hop). Continuations are yielded to and finished outside the
/// lock, because finishing one runs its `onTermination`, which takes the lock again. Callers that
/// need an order between `yield`s (every current one does) call them from one actor.
package final class StreamSubscribers<Element: Sendable>: Sendable {
    package typealias ID = UInt64

    private struct State: Sendable {
        var nextID: ID = 0
        var continuations: [ID: AsyncStream<Element>.Continuation] = [:]
    }

    private let state = Locked(State())

    package init() {}

    /// A new stream that gets `first` (if any) before anything else, then every later `yield`
    /// until it is finished or its consumer stops listening.
    package func stream(
        bufferingPolicy: AsyncStream<Element>.Continuation.BufferingPolicy = .unbounded,
        first: Element? = nil
    ) -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream<Element>.makeStream(bufferingPolicy: bufferingPolicy)
        if let first { continuation.yield(first) }
        let id = state.withLock { state in
            defer { state.nextID &+= 1 }
            state.continuations[state.nextID] = continuation
            return state.nextID
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLock { _ = $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    /// Sends `element` to every live stream, oldest subscription first (a dictionary's own order
    /// changes from one instance to the next: who wakes first must not).
    ///
    /// Called on every queue change and result, usually with nobody listening: that case takes the
    /// lock and returns. No key path here (`map(\.value)`): in a generic type Swift builds one at
    /// run time on every call, demangling its type, which cost the queue's replay more than its
    /// own bookkeeping (Benchmarks/README.md, "OfflineQueue").
    package func yield(_ element: Element) {
        for continuation in state.withLock({ Self.inOrder($0.continuations) }) {
            continuation.yield(element)
        }
    }

    /// The continuations, oldest subscription first.
    private static func inOrder(_ continuations: [ID: AsyncStream<Element>.Continuation]) -> [AsyncStream<Element>.Continuation] {
        switch continuations.count {
        case 0: return []
        case 1: return [continuations.first!.value]
        default: return continuations.sorted { $0.key < $1.key }.map { $0.value }
        }
    }

    /// The streams live now, to finish later with `finish(_:)` without touching newer ones.
    package var current: [ID] {
        state.withLock { $0.continuations.keys.sorted() }
    }

    /// Finishes the given streams (those still live).
    package func finish(_ ids: [ID]) {
        let ending = state.withLock { state in ids.compactMap { state.continuations.removeValue(forKey: $0) } }
        for continuation in ending { continuation.finish() }
    }

    /// Finishes every live stream.
    package func finishAll() {
        let ending = state.withLock { state -> [AsyncStream<Element>.Continuation] in
            defer { state.continuations.removeAll() }
            return Self.inOrder(state.continuations)
        }
        for continuation in ending { continuation.finish() }
    }

    /// The number of live streams.
    package var count: Int {
        state.withLock { $0.continuations.count }
    }
}
