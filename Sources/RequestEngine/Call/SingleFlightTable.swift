@_spi(ResilienceCore) import ResilienceCore
import Retry

/// The shared calls in flight, by request identity (deduplicated methods only).
///
/// Every deduplicated send looks its identity up here once and every call removes itself once, so
/// this sits on the request path. Two choices keep it cheap under concurrency:
/// - the identity's hash (URL, headers, body) is computed once per send and kept in the key; the
///   table's own hashing then combines one integer, and the removal at the end hashes nothing new;
/// - the table is split into stripes, each behind its own lock, chosen by that hash, so concurrent
///   sends of different requests rarely wait for one another (one lock for the whole table was
///   the most contended lock in a 64-concurrent profile).
///
/// Lock order: a stripe's lock, then a call's own lock (`SharedCall.join`); nothing takes them the
/// other way round. On a miss the new call is made under the stripe's lock: that builds its
/// `URLRequest` and takes no other lock (the engine reads the clock and the priority before).
final class SingleFlightTable: Sendable {
    /// A request identity and its body limit, with the hash computed once.
    struct Key: Hashable, Sendable {
        let identity: RequestIdentity
        /// The call's effective body limit: calls with different limits are never shared.
        let maximumBodySize: Int?
        /// The request's own total deadline: calls with different deadlines are never shared.
        let deadline: Duration?
        /// The request's operation and its `retryable`: calls of different operations (different
        /// breakers) or different retry rules are never shared.
        let operationID: String?
        let retryable: Bool?
        let hash: Int

        init(
            _ identity: RequestIdentity, maximumBodySize: Int? = nil, deadline: Duration? = nil, operationID: String? = nil,
            retryable: Bool? = nil
        ) {
            self.identity = identity
            self.maximumBodySize = maximumBodySize
            self.deadline = deadline
            self.operationID = operationID
            self.retryable = retryable
            var hasher = Hasher()
            hasher.combine(identity)
            hasher.combine(maximumBodySize)
            hasher.combine(deadline)
            hasher.combine(operationID)
            hasher.combine(retryable)
            hash = hasher.finalize()
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(hash)
        }

        static func == (lhs: Key, rhs: Key) -> Bool {
            lhs.hash == rhs.hash && lhs.maximumBodySize == rhs.maximumBodySize && lhs.deadline == rhs.deadline
                && lhs.operationID == rhs.operationID && lhs.retryable == rhs.retryable && lhs.identity == rhs.identity
        }
    }

    /// A power of two, so a stripe is picked with a mask.
    private static let stripeCount = 16
    private let stripes: [Locked<[Key: SharedCall]>]

    init() {
        stripes = (0..<Self.stripeCount).map { _ in Locked([:]) }
    }

    /// Joins the call in flight for `key` as a new waiter, or registers the call `makeCall` returns
    /// (made under the stripe's lock, so two concurrent sends never both start one). A call that has
    /// completed or been abandoned refuses the join and is replaced.
    func joinOrStart(
        _ key: Key,
        makeCall: () -> SharedCall
    ) -> (call: SharedCall, waiter: SharedCall.Ticket, joined: Bool) {
        stripe(for: key).withLock { calls in
            if let existing = calls[key], let waiter = existing.join() {
                return (existing, waiter, true)
            }
            let call = makeCall()
            calls[key] = call
            return (call, call.firstTicket, false)
        }
    }

    /// Unregisters `call` if it was registered, unless a newer call has replaced it under its key
    /// (after it was abandoned).
    func remove(_ call: SharedCall) {
        guard let key = call.execution.key else { return }
        stripe(for: key).withLock { calls in
            if let index = calls.index(forKey: key), calls[index].value === call {
                calls.remove(at: index)
            }
        }
    }

    /// The number of calls registered, summed stripe by stripe (exact when nothing is in flight,
    /// approximate while sends run concurrently).
    var count: Int {
        stripes.reduce(0) { total, stripe in total + stripe.withLock { $0.count } }
    }

    private func stripe(for key: Key) -> Locked<[Key: SharedCall]> {
        stripes[key.hash & (Self.stripeCount - 1)]
    }
}
