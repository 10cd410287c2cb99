extension LiveReadState {
    /// Where a live read's fetching is, as one value: whether a fetch is due, which one is in
    /// flight and whether another follows it, and whether the next must reach the origin because
    /// a delivered write is still applied. (Before, four flags spelled this, and nothing said
    /// which of their sixteen combinations could happen; these are the five that can.)
    ///
    /// | phase | what it means | how it moves on |
    /// | --- | --- | --- |
    /// | `idle` | nothing to fetch | a delivery or staleness makes a fetch `due` |
    /// | `due` | a fetch starts once the read is connected | `start` |
    /// | `fetching(n, .nothing)` | fetch `n` in flight | it ends: `idle`, or `due` when it landed with delivered writes it did not account for |
    /// | `fetching(n, .due)` | another fetch is asked for once `n` ends | it ends: `due` |
    enum FetchPhase: Equatable, Sendable {
        /// No fetch in flight and none due. With `nextFollowsDelivery`, delivered writes are still
        /// applied (a fetch failed), so the next fetch, once something asks for one, must reach
        /// the origin.
        case idle(nextFollowsDelivery: Bool)
        /// A fetch is due: it starts as soon as the read is connected.
        case due(followsDelivery: Bool)
        /// Fetch `number` is in flight; `next` says whether another is due once it ends.
        case fetching(number: Int, next: Next)

        enum Next: Equatable, Sendable {
            case nothing
            case due(followsDelivery: Bool)
        }

        /// The phase of a read that starts with a fetch to make or not.
        init(fetchDue: Bool) {
            self = fetchDue ? .due(followsDelivery: false) : .idle(nextFollowsDelivery: false)
        }

        /// Whether a fetch is due: now, or once the one in flight ends.
        var isDue: Bool {
            switch self {
            case .due, .fetching(_, .due): true
            case .idle, .fetching(_, .nothing): false
            }
        }

        /// The number of the fetch in flight.
        var fetchingNumber: Int? {
            if case .fetching(let number, _) = self { number } else { nil }
        }

        /// A delivered write made the read stale: a fetch is due (after the one in flight, which
        /// may carry the state from before the write), and it must reach the origin.
        mutating func deliveryInvalidated() {
            switch self {
            case .idle, .due: self = .due(followsDelivery: true)
            case .fetching(let number, _): self = .fetching(number: number, next: .due(followsDelivery: true))
            }
        }

        /// Something other than a delivery asks for a fetch (the read reconnected with a stale
        /// body): one is due; whether it must reach the origin is unchanged.
        mutating func fetchAskedFor() {
            switch self {
            case .idle(let follows): self = .due(followsDelivery: follows)
            case .due, .fetching(_, .due): break
            case .fetching(let number, .nothing): self = .fetching(number: number, next: .due(followsDelivery: false))
            }
        }

        /// Fetch `number` starts; returns whether it must reach the origin (it follows a delivery).
        mutating func start(_ number: Int) -> Bool {
            let follows =
                switch self {
                case .idle(let follows), .due(let follows), .fetching(_, .due(let follows)): follows
                case .fetching(_, .nothing): false
                }
            self = .fetching(number: number, next: .nothing)
            return follows
        }

        /// The fetch in flight ended: landed (its body is the read's base now) or failed. With
        /// `stillSettling`, delivered writes it does not account for are still applied: the next
        /// fetch must reach the origin, and, after a landing, it is due at once.
        mutating func ended(landed: Bool, stillSettling: Bool) {
            guard case .fetching(_, let next) = self else { return }
            switch (next, stillSettling) {
            case (.nothing, false): self = .idle(nextFollowsDelivery: false)
            case (.nothing, true): self = landed ? .due(followsDelivery: true) : .idle(nextFollowsDelivery: true)
            case (.due, true): self = .due(followsDelivery: true)
            case (.due(let follows), false): self = .due(followsDelivery: follows)
            }
        }
    }
}
