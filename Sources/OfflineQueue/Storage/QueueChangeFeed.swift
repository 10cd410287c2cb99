import Foundation
@_spi(ResilienceCore) import ResilienceCore

/// What a queue's storage holds, change by change: every `QueueStorage` has one
/// (`QueueStorage.changeFeed`), and whatever shows pending writes follows it — a "3 pending"
/// badge (`counts`), a list of outgoing messages (`changes`), or `OfflineFirstClient`, which
/// overlays pending writes on what it reads.
///
/// The storage publishes the changes it makes (`stored`, `updated`, `removed` and why), in the
/// order it makes them; the engine adds its own (`offered`, `attemptStarted`, `attemptEnded`).
/// The feed keeps what those changes add up to (the pending entries, `count`), so a subscriber
/// gets the entries and the changes from then on in one step, never a change twice or one
/// missed between the two.
///
/// Storage that several processes share (`PostgresQueueStore`) publishes the changes made
/// elsewhere too, as they reach it, with `publishFromElsewhere(_:)`: the feed then drops a
/// `stored` or `updated` of an entry it has seen removed, which a late notice must not bring
/// back. Such storage may make its feed with `init(whenFirstObserved:)`: the feed ignores what is
/// published until someone first observes it, then calls the closure, in which the storage
/// publishes what is queued (and starts following the other processes, if it can), so a process
/// nobody observes keeps no copy of the queue in memory.
public final class QueueChangeFeed: Sendable {
    private struct State: Sendable {
        var active: Bool
        var entries: [UUID: QueueEntry] = [:]
        /// Requests `enqueue` is offering at once (announced `offered`, not yet stored or removed).
        var offered: [UUID: QueueEntry] = [:]
        var sequence: UInt64 = 0
        var publishedCount = 0
        var observers: [UInt64: @Sendable (UInt64, QueueChange) -> Void] = [:]
        var nextObserver: UInt64 = 0
        /// Ids removed lately, oldest first (`publishFromElsewhere`); at most `rememberedRemovals`.
        var removedOrder: [UUID] = []
        var removedHead = 0
        var removed: Set<UUID> = []
        var whenFirstObserved: (@Sendable (QueueChangeFeed) -> Void)?
    }

    /// How many removed ids a feed remembers, so a late notice of one of them is dropped.
    static let rememberedRemovals = 4096

    private let state: Locked<State>
    private let changeSubscribers = StreamSubscribers<(sequence: UInt64, change: QueueChange)>()
    private let countSubscribers = StreamSubscribers<Int>()
    /// Of the last process on this storage: the entries that may have been on the wire when it
    /// ended (`DiskQueueStore`'s note; empty for other storage).
    package let sendingAtOpen: Set<UUID>

    /// A feed that starts from `entries` (what the storage holds when it opens).
    public convenience init(entries: [QueueEntry] = []) {
        self.init(entries: entries, sendingAtOpen: [])
    }

    package init(entries: [QueueEntry], sendingAtOpen: Set<UUID>) {
        var state = State(active: true)
        for entry in entries { state.entries[entry.id] = entry }
        state.publishedCount = state.entries.count
        self.state = Locked(state)
        self.sendingAtOpen = sendingAtOpen
    }

    /// A feed that ignores what is published until it is first observed (a stream, a count, the
    /// entries read), and then calls `whenFirstObserved` once, with the feed: the storage then
    /// publishes every queued entry (`publishFromElsewhere(.stored(entry, replacing: nil))`) and,
    /// if it can, follows what other processes change.
    public init(whenFirstObserved: @escaping @Sendable (QueueChangeFeed) -> Void) {
        self.state = Locked(State(active: false, whenFirstObserved: whenFirstObserved))
        self.sendingAtOpen = []
    }

    // MARK: - Publishing

    /// Publishes a change this process made, in the order it made them: call it in the same step
    /// that makes the change visible to readers of the storage (under the storage's lock), so
    /// that the feed and the storage never disagree in between.
    public func publish(_ change: QueueChange) {
        state.withLock { state in
            guard state.active else { return }
            apply(change, fromElsewhere: false, &state)
        }
    }

    /// Publishes a change another process made, as it came to be known here (a notification, or
    /// a re-read of the storage). A `stored` or `updated` of an entry this feed has seen removed
    /// is dropped (the notice came late); a `removed` of an entry it does not hold is dropped too
    /// (nobody here saw it stored). Returns whether the change was published.
    @discardableResult
    public func publishFromElsewhere(_ change: QueueChange) -> Bool {
        state.withLock { state in
            guard state.active else { return false }
            switch change {
            case .stored(let entry, _), .updated(let entry):
                guard !state.removed.contains(entry.id) else { return false }
            case .removed(let entry, _):
                guard state.entries[entry.id] != nil || state.offered[entry.id] != nil else { return false }
            case .offered, .attemptStarted, .attemptEnded:
                break
            }
            apply(change, fromElsewhere: true, &state)
            return true
        }
    }

    private func apply(_ change: QueueChange, fromElsewhere: Bool, _ state: inout State) {
        switch change {
        case .offered(let entry):
            state.offered[entry.id] = entry
        case .stored(let entry, let replacing):
            state.offered[entry.id] = nil
            if let replacing, replacing != entry.id, state.entries.removeValue(forKey: replacing) != nil {
                remember(removal: replacing, &state)
            }
            state.entries[entry.id] = entry
        case .updated(let entry):
            state.entries[entry.id] = entry
        case .removed(let entry, _):
            state.offered[entry.id] = nil
            state.entries[entry.id] = nil
            remember(removal: entry.id, &state)
        case .attemptStarted, .attemptEnded:
            break
        }
        if state.entries.count != state.publishedCount {
            state.publishedCount = state.entries.count
            countSubscribers.yield(state.publishedCount)
        }
        state.sequence += 1
        changeSubscribers.yield((state.sequence, change))
        for observer in state.observers.values { observer(state.sequence, change) }
    }

    private func remember(removal id: UUID, _ state: inout State) {
        state.removed.insert(id)
        state.removedOrder.append(id)
        if state.removedOrder.count - state.removedHead > Self.rememberedRemovals {
            state.removed.remove(state.removedOrder[state.removedHead])
            state.removedHead += 1
            if state.removedHead > Self.rememberedRemovals {
                state.removedOrder.removeFirst(state.removedHead)
                state.removedHead = 0
            }
        }
    }

    // MARK: - Following

    /// The number of entries stored (offered requests not counted).
    public var count: Int { observing { $0.entries.count } }

    /// Whether an entry with this id is stored (not only offered).
    public func contains(id: UUID) -> Bool { observing { $0.entries[id] != nil } }

    /// The stored entry with this id, as the feed last heard of it (storage that learns of a
    /// removal by id alone publishes it with this).
    public func entry(id: UUID) -> QueueEntry? { observing { $0.entries[id] } }

    /// The stored entries in claim order (priority descending, then FIFO), then the requests being
    /// offered at once (oldest offer first).
    public func entries() -> [QueueEntry] { observing { Self.pending($0) } }

    /// A new stream for each access: the number of stored entries at once, then each new number
    /// (a slow consumer sees the latest count, never a stale one last). For a "N pending" badge.
    public var counts: AsyncStream<Int> { counts(bufferingPolicy: .bufferingNewest(1)) }

    /// `counts` with another buffering (tests keep every value).
    package func counts(bufferingPolicy: AsyncStream<Int>.Continuation.BufferingPolicy) -> AsyncStream<Int> {
        observing { state in countSubscribers.stream(bufferingPolicy: bufferingPolicy, first: state.entries.count) }
    }

    /// A new stream for each access: every change from now on, in the order they happened.
    /// Nothing is dropped: read it promptly. `entries()` gives the state the changes start from.
    public var changes: AsyncStream<QueueChange> {
        let sequenced = sequencedChangesWithStart().changes
        return AsyncStream { continuation in
            let task = Task {
                for await (_, change) in sequenced { continuation.yield(change) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// `changes` with each change's number (1, 2, …), with the pending entries and the number of
    /// the last change at the moment the stream began, taken together: applying the stream's
    /// changes to those entries follows the storage exactly.
    package func sequencedChangesWithStart() -> (entries: [QueueEntry], sequence: UInt64, changes: AsyncStream<(sequence: UInt64, change: QueueChange)>) {
        observing { state in
            (Self.pending(state), state.sequence, changeSubscribers.stream(bufferingPolicy: .unbounded))
        }
    }

    /// Calls `observer` with each change from now on, as it is published (under the feed's lock,
    /// in order: it must only hand the change on, as an `AsyncStream` continuation's `yield` does),
    /// until `stop` is called; returns the entries and the number of the last change at the moment
    /// observing began. One hop fewer than a stream for a consumer with an inbox of its own.
    package func observe(_ observer: @escaping @Sendable (UInt64, QueueChange) -> Void) -> (entries: [QueueEntry], sequence: UInt64, stop: @Sendable () -> Void) {
        observing { state in
            let id = state.nextObserver
            state.nextObserver += 1
            state.observers[id] = observer
            return (
                Self.pending(state), state.sequence,
                { [weak self] in
                    self?.state.withLock { _ = $0.observers.removeValue(forKey: id) }
                }
            )
        }
    }

    /// The number of the last change published.
    package var sequence: UInt64 { state.withLock { $0.sequence } }

    /// What the feed keeps of past removals (for tests): the ids it remembers, and the length of
    /// the log they are dropped from, oldest first (at most twice `rememberedRemovals` and one).
    var removalMemory: (ids: Int, log: Int) { state.withLock { ($0.removed.count, $0.removedOrder.count) } }

    /// Ends every stream (the storage is closed).
    package func finish() {
        changeSubscribers.finishAll()
        countSubscribers.finishAll()
    }

    /// Runs `body` on the state, activating the feed first if nobody had observed it.
    private func observing<Result>(_ body: (inout State) -> Result) -> Result {
        let (result, activate) = state.withLock { state -> (Result, (@Sendable (QueueChangeFeed) -> Void)?) in
            var activate: (@Sendable (QueueChangeFeed) -> Void)?
            if !state.active {
                state.active = true
                activate = state.whenFirstObserved
                state.whenFirstObserved = nil
            }
            return (body(&state), activate)
        }
        activate?(self)
        return result
    }

    private static func pending(_ state: State) -> [QueueEntry] {
        state.entries.values.sorted { ($0.priority, $1.sequence) > ($1.priority, $0.sequence) }
            + state.offered.values.sorted { $0.enqueuedAt < $1.enqueuedAt }
    }

    deinit {
        finish()
    }
}
