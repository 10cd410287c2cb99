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
    /// How many streams are live: `state.continuations.count`, kept beside it (changed under
    /// `state`'s lock) in a lock of a concrete type, so that `yield` with nobody listening — every
    /// queue change and result, mostly — returns before touching the generic state. Through
    /// `state`, that case looked up the generic metadata of its types on every call (this type is
    /// not specialised in the modules that use it), a visible share of a replayed entry's CPU.
    private let live = Locked(0)

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
            live.withLock { $0 = state.continuations.count }
            return state.nextID
        }
        continuation.onTermination = { [weak self] _ in
            self?.remove([id])
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
        guard live.withLock({ $0 }) > 0 else { return }
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
        for continuation in remove(ids) { continuation.finish() }
    }

    /// Takes the given streams (those still live) out.
    @discardableResult
    private func remove(_ ids: [ID]) -> [AsyncStream<Element>.Continuation] {
        state.withLock { state in
            defer { live.withLock { $0 = state.continuations.count } }
            return ids.compactMap { state.continuations.removeValue(forKey: $0) }
        }
    }

    /// Finishes every live stream.
    package func finishAll() {
        let ending = state.withLock { state -> [AsyncStream<Element>.Continuation] in
            defer {
                state.continuations.removeAll()
                live.withLock { $0 = 0 }
            }
            return Self.inOrder(state.continuations)
        }
        for continuation in ending { continuation.finish() }
    }

    /// The number of live streams.
    package var count: Int {
        state.withLock { $0.continuations.count }
    }
}
