/// Callers suspended until something happens, kept in arrival order, with the bookkeeping that
/// makes cancellation safe at every moment: before the caller has suspended, while it waits, and
/// after it was resumed. The package's one waiting line: gates, shared calls, refresh waiters,
/// test clocks and scripted sessions all keep theirs here.
///
/// A `WaiterList` is a value kept inside its owner's locked state (`Locked`, or a `Mutex` held
/// inline): every mutating method runs under the owner's lock, and continuations it returns are
/// resumed by the caller after the lock is released. `Locked.wait(on:tag:cancelled:until:)` is
/// the usual way in; `suspendCancellably(install:onCancel:)` is the lower-level step for owners
/// that hold their lock some other way.
///
/// A waiter's life, by its ticket:
/// 1. `issue(_:)` (under the lock that decided to wait) — the ticket is *pending*: in line, in
///    arrival order, but not suspended yet.
/// 2. `claim(_:)`, then `park(_:_:)` (under the lock, inside the continuation's closure) — a value
///    handed to the ticket meanwhile (by `resumeFirst` or `cancel`) is taken at once; otherwise the
///    continuation waits.
/// 3. It leaves by being resumed (`resumeFirst`, `takeAll`), by `cancel(_:with:)`, or, if its
///    owner finds it need not wait after all, by `withdraw(_:)`.
///
/// Races this settles (each is a test in `WaiterListTests`):
/// - cancellation before the caller suspends: the cancel value is handed to the pending ticket
///   and returned by `claim`, so the caller never suspends;
/// - cancellation after the caller was resumed: the ticket is gone, `cancel` finds nothing and
///   leaves nothing behind (no tombstone grows the list);
/// - a `resumeFirst` while the earliest arrival is still pending: the value is handed to that
///   ticket, so first come is first served and no value is lost in the gap.
///
/// SPI (`@_spi(ResilienceCore) public`) and `@inlinable`, as `Locked` is and for the same reason:
/// the shared call on every request's path gets it specialised. Swift 6.3 does not specialise
/// `@inlinable` package declarations across modules, and the generic code costs the engine
/// thousands of instructions a request (metadata look-ups and value-witness copies under the lock).
///
/// Costs: `issue` appends to an array; `cancel` and `claim` find their ticket by binary search
/// (tickets are increasing); a cancelled waiter leaves a hole that is compacted once holes are
/// half the storage, so cancelling any number of waiters stays linear overall.
@_spi(ResilienceCore) public struct WaiterList<Value: Sendable, Tag: Sendable>: Sendable {
    public typealias Continuation = UnsafeContinuation<Value, Never>

    /// A waiter's place in line. Increasing in arrival order.
    public struct Ticket: Hashable, Comparable, Sendable {
        public let rawValue: UInt64
        @inlinable
        init(rawValue: UInt64) { self.rawValue = rawValue }
        @inlinable
        public static func < (lhs: Ticket, rhs: Ticket) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    /// A suspended waiter taken out of the list, to be resumed outside the lock.
    public struct Waiter: Sendable {
        public let ticket: Ticket
        public let tag: Tag
        public let continuation: Continuation

        @inlinable
        init(ticket: Ticket, tag: Tag, continuation: Continuation) {
            self.ticket = ticket
            self.tag = tag
            self.continuation = continuation
        }

        @inlinable
        public func resume(returning value: Value) { continuation.resume(returning: value) }
    }

    /// What `resumeFirst(with:)` did with the value.
    public enum Handoff: Sendable {
        /// The earliest waiter was suspended: resume it (outside the lock).
        case resume(Waiter)
        /// The earliest arrival had not suspended yet: the value is its own; it takes it as it
        /// suspends.
        case handedToPending
    }

    @usableFromInline
    enum Slot: Sendable {
        case pending
        case waiting(Continuation)
        case handed(Value)
        case left
    }

    @usableFromInline
    struct Entry: Sendable {
        @usableFromInline let ticket: UInt64
        @usableFromInline let tag: Tag
        @usableFromInline var slot: Slot

        @inlinable
        init(ticket: UInt64, tag: Tag, slot: Slot) {
            self.ticket = ticket
            self.tag = tag
            self.slot = slot
        }
    }

    @usableFromInline var entries: [Entry] = []
    /// Entries before `head` have left; compacted lazily.
    @usableFromInline var head = 0
    /// Entries at or after `head` that have left (holes).
    @usableFromInline var holes = 0
    /// Entries holding a value handed to them before they suspended (`.handed`): decided, so no
    /// longer in line, though their tickets have not claimed the value yet.
    @usableFromInline var handedCount = 0
    @usableFromInline var nextTicket: UInt64 = 0

    @inlinable
    public init() {}

    /// Waiters in line, still to be served: suspended, or issued and on their way to suspend
    /// with nothing handed to them yet. A ticket already handed a value (a place, or its
    /// cancellation) is not counted: an owner that counted it would see a line where nobody waits
    /// — a newcomer would queue behind a departing waiter, and nobody would wake it.
    @inlinable
    public var count: Int { entries.count - head - holes - handedCount }

    @inlinable
    public var isEmpty: Bool { count == 0 }

    /// Places a new waiter at the end of the line. Call under the lock that decided to wait, then
    /// suspend (`claim`, then `park`).
    @inlinable
    public mutating func issue(_ tag: Tag) -> Ticket {
        nextTicket &+= 1
        entries.append(Entry(ticket: nextTicket, tag: tag, slot: .pending))
        return Ticket(rawValue: nextTicket)
    }

    /// As the waiter suspends: the value handed to its ticket while it was on its way (by
    /// `resumeFirst` or `cancel`), which it returns at once; `nil` when there is none and it should
    /// `park` (or `withdraw`).
    @inlinable
    public mutating func claim(_ ticket: Ticket) -> Value? {
        guard let index = index(of: ticket), case .handed(let value) = entries[index].slot else { return nil }
        handedCount -= 1
        markLeft(index)
        return value
    }

    /// Suspends a pending waiter on `continuation`. Call after `claim` returned `nil`.
    @inlinable
    public mutating func park(_ ticket: Ticket, _ continuation: Continuation) {
        guard let index = index(of: ticket), case .pending = entries[index].slot else {
            preconditionFailure("WaiterList.park: the ticket is not pending")
        }
        entries[index].slot = .waiting(continuation)
    }

    /// Takes a pending waiter out of line without suspending it (its owner found it need not
    /// wait). A value handed to it meanwhile is returned, and must be dealt with by the caller.
    @discardableResult
    @inlinable
    public mutating func withdraw(_ ticket: Ticket) -> Value? {
        guard let index = index(of: ticket) else { return nil }
        let handed: Value?
        if case .handed(let value) = entries[index].slot {
            handed = value
            handedCount -= 1
        } else {
            handed = nil
        }
        markLeft(index)
        return handed
    }

    /// The waiter's task was cancelled. A suspended waiter is taken out and returned, to be
    /// resumed with `value` outside the lock; a pending one is handed `value` (it returns it as
    /// it suspends); a waiter already resumed, or already handed a value, is left alone and `nil`
    /// is returned.
    @inlinable
    public mutating func cancel(_ ticket: Ticket, with value: Value) -> Waiter? {
        guard let index = index(of: ticket) else { return nil }
        let entry = entries[index]
        switch entry.slot {
        case .pending:
            entries[index].slot = .handed(value)
            handedCount += 1
            return nil
        case .waiting(let continuation):
            markLeft(index)
            return Waiter(ticket: ticket, tag: entry.tag, continuation: continuation)
        case .handed, .left:
            return nil
        }
    }

    /// Serves the earliest arrival with `value`: a suspended one is taken out and returned, a
    /// pending one is handed the value. `nil` when nobody is in line (or everyone in line already
    /// holds a value).
    @inlinable
    public mutating func resumeFirst(with value: Value) -> Handoff? {
        var index = head
        while index < entries.count {
            let entry = entries[index]
            switch entry.slot {
            case .waiting(let continuation):
                markLeft(index)
                return .resume(Waiter(ticket: Ticket(rawValue: entry.ticket), tag: entry.tag, continuation: continuation))
            case .pending:
                entries[index].slot = .handed(value)
                handedCount += 1
                return .handedToPending
            case .handed, .left:
                index += 1
            }
        }
        return nil
    }

    /// Takes every suspended waiter whose tag matches, in arrival order, to be resumed outside
    /// the lock. Pending waiters stay: they look at their owner's state again as they suspend.
    @inlinable
    public mutating func takeAll(where matches: (Tag) -> Bool = { _ in true }) -> [Waiter] {
        var taken: [Waiter] = []
        for index in head..<entries.count {
            let entry = entries[index]
            guard case .waiting(let continuation) = entry.slot, matches(entry.tag) else { continue }
            taken.append(Waiter(ticket: Ticket(rawValue: entry.ticket), tag: entry.tag, continuation: continuation))
            markLeft(index, compact: false)
        }
        compactIfSparse()
        return taken
    }

    /// Serves every waiter whose tag matches with `value`: suspended ones are taken out and
    /// returned, to be resumed outside the lock; pending ones are handed the value (they return it
    /// as they suspend). Waiters already holding a value keep theirs.
    @inlinable
    public mutating func resumeAll(where matches: (Tag) -> Bool, with value: Value) -> [Waiter] {
        var taken: [Waiter] = []
        for index in head..<entries.count {
            let entry = entries[index]
            guard matches(entry.tag) else { continue }
            switch entry.slot {
            case .waiting(let continuation):
                taken.append(Waiter(ticket: Ticket(rawValue: entry.ticket), tag: entry.tag, continuation: continuation))
                markLeft(index, compact: false)
            case .pending:
                entries[index].slot = .handed(value)
                handedCount += 1
            case .handed, .left:
                break
            }
        }
        compactIfSparse()
        return taken
    }

    /// The tags of the waiters in line (suspended or pending), in arrival order.
    @inlinable
    public var tags: [Tag] {
        entries[head...].compactMap { entry in
            switch entry.slot {
            case .pending, .waiting: entry.tag
            case .handed, .left: nil
            }
        }
    }

    /// The number of suspended waiters whose tag matches.
    @inlinable
    public func waitingCount(where matches: (Tag) -> Bool = { _ in true }) -> Int {
        entries[head...].reduce(0) { count, entry in
            if case .waiting = entry.slot, matches(entry.tag) { return count + 1 }
            return count
        }
    }

    @inlinable
    func index(of ticket: Ticket) -> Int? {
        var low = head
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if entries[middle].ticket < ticket.rawValue { low = middle + 1 } else { high = middle }
        }
        guard low < entries.count, entries[low].ticket == ticket.rawValue else { return nil }
        if case .left = entries[low].slot { return nil }
        return low
    }

    @inlinable
    mutating func markLeft(_ index: Int, compact: Bool = true) {
        entries[index].slot = .left
        holes += 1
        if compact { compactIfSparse() }
    }

    /// Drops leading holes at once (moving `head`), and rebuilds the storage once holes and served
    /// entries make up more than half of it.
    @inlinable
    mutating func compactIfSparse() {
        while head < entries.count, case .left = entries[head].slot {
            head += 1
            holes -= 1
        }
        if head == entries.count {
            entries.removeAll(keepingCapacity: entries.count <= 64)
            head = 0
            holes = 0
            return
        }
        let dead = head + holes
        if dead > 32, dead * 2 > entries.count {
            entries = entries[head...].filter {
                if case .left = $0.slot { return false }
                return true
            }
            head = 0
            holes = 0
        }
    }
}

/// Suspends the current task on a continuation that `install` either resumes at once (by
/// returning a value) or stores, under its owner's lock, for someone to resume later; on
/// cancellation `onCancel` runs (at once, if the task is already cancelled) and must resume the
/// stored continuation, or arrange for `install` to return a value, exactly once.
///
/// With a `WaiterList`: `install` is `claim` then `park` (or a ready value and `withdraw`);
/// `onCancel` is `cancel(_:with:)` and a resume of what it returns.
@inlinable
@_spi(ResilienceCore) public func suspendCancellably<Value: Sendable>(
    install: (UnsafeContinuation<Value, Never>) -> Value?,
    onCancel: @Sendable () -> Void,
    site: StaticString = #fileID,
    line: UInt = #line,
    opensWindow: Bool = true
) async -> Value {
    await withTaskCancellationHandler {
        guard opensWindow, SimulationPoints.isActive else {
            return await withUnsafeContinuation { (continuation: UnsafeContinuation<Value, Never>) in
                if let value = install(continuation) { continuation.resume(returning: value) }
            }
        }
        // Under a simulation, the window between joining a line and suspending is opened to other
        // tasks, as other threads can act in it for real, and the simulation knows where every
        // waiter waits (see `SimulationPoints`).
        await SimulationPoints.yield()
        let waiting = SimulationPoints.suspending(at: site, line: line)
        defer { SimulationPoints.resumed(waiting) }
        return await withUnsafeContinuation { (continuation: UnsafeContinuation<Value, Never>) in
            if let value = install(continuation) { continuation.resume(returning: value) }
        }
    } onCancel: {
        onCancel()
    }
}

/// A lock around a state value: `Locked`, or an owner with a lock of its own (an `NSCondition`,
/// say) that wants `wait(on:tag:cancelled:until:)` for the waiter lists in its state.
@_spi(ResilienceCore) public protocol StateLock<State>: AnyObject, Sendable {
    associatedtype State
    func withLock<R>(_ body: (inout State) throws -> R) rethrows -> R
}

extension Locked: StateLock {}

extension StateLock {
    /// Waits in `list` until resumed, answering at once when `ready` already has a value, and with
    /// `cancelled` when the task is cancelled while it waits (or already was).
    ///
    /// `ready` runs under the lock: once before joining the line, and again as the caller
    /// suspends, so a change made in between (and the resumes it would have done) is not missed.
    @inlinable
    @_spi(ResilienceCore) public func wait<Value: Sendable, Tag: Sendable>(
        on list: WritableKeyPath<State, WaiterList<Value, Tag>> & Sendable,
        tag: Tag,
        cancelled: Value,
        until ready: (inout State) -> Value? = { _ in nil },
        site: StaticString = #fileID,
        line: UInt = #line
    ) async -> Value {
        let start = withLock { (state: inout State) -> WaitStart<Value, Tag> in
            if let value = ready(&state) { return .ready(value) }
            return .issued(state[keyPath: list].issue(tag))
        }
        switch start {
        case .ready(let value): return value
        case .issued(let ticket): return await wait(for: ticket, on: list, cancelled: cancelled, until: ready, site: site, line: line)
        }
    }

    /// Waits as the holder of `ticket`, which its owner issued in `list` under this lock (having
    /// decided there, with state of its own, that the caller must wait): returns the value handed
    /// to the ticket, or `cancelled` when the task is cancelled (or already was). `ready`, when
    /// given, is checked again as the caller suspends, as in `wait(on:tag:cancelled:until:)`.
    @inlinable
    @_spi(ResilienceCore) public func wait<Value: Sendable, Tag: Sendable>(
        for ticket: WaiterList<Value, Tag>.Ticket,
        on list: WritableKeyPath<State, WaiterList<Value, Tag>> & Sendable,
        cancelled: Value,
        until ready: (inout State) -> Value? = { _ in nil },
        site: StaticString = #fileID,
        line: UInt = #line
    ) async -> Value {
        await suspendCancellably(
            install: { continuation in
                withLock { state -> Value? in
                    if let handed = state[keyPath: list].claim(ticket) { return handed }
                    if let value = ready(&state) {
                        state[keyPath: list].withdraw(ticket)
                        return value
                    }
                    state[keyPath: list].park(ticket, continuation)
                    return nil
                }
            },
            onCancel: {
                self.withLock { $0[keyPath: list].cancel(ticket, with: cancelled) }?.resume(returning: cancelled)
            },
            site: site,
            line: line
        )
    }
}

/// How `wait(on:tag:cancelled:until:)` starts: with a value at once, or with a ticket in line.
@_spi(ResilienceCore) @usableFromInline
enum WaitStart<Value: Sendable, Tag: Sendable> {
    case ready(Value)
    case issued(WaiterList<Value, Tag>.Ticket)
}
