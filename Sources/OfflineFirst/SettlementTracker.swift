import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore
import ResponseCache

/// The delivered writes a stored read does not hold yet, kept with it in the response cache
/// (the stored response's note): a relaunch, offline, shows them on top of it, as the process
/// that stored the read did. JSON: `{"settling": [QueueEntry…]}`, oldest delivery first.
enum SettlingNote {
    /// The most delivered writes one stored read keeps; past it the oldest goes (a read not
    /// refetched through that many deliveries shows the oldest of them only once refetched).
    static let limit = 256

    private struct Contents: Codable {
        var settling: [QueueEntry]
    }

    /// The writes a note holds; none for an empty or unreadable note.
    static func entries(_ note: Data) -> [QueueEntry] {
        guard !note.isEmpty, let contents = try? QueueEntry.makeDecoder().decode(Contents.self, from: note) else { return [] }
        return contents.settling
    }

    /// `note` with `entry` added (once), the oldest dropped past `limit`.
    static func adding(_ entry: QueueEntry, to note: Data) -> Data {
        var settling = entries(note).filter { $0.id != entry.id }
        settling.append(entry)
        if settling.count > limit { settling.removeFirst(settling.count - limit) }
        return (try? QueueEntry.makeEncoder().encode(Contents(settling: settling))) ?? note
    }
}

/// Keeps the response cache and the queue's files telling one story across a relaunch, for the
/// reads an `OptimisticUpdate` changes. Three rules:
///
/// 1. **A read and a write of it take turns.** A replay of a write waits while a fetch of a read
///    it changes is in flight, and such a fetch waits while the write is sent and its outcome
///    recorded (first come, first served). So a stored body was fetched either wholly before a
///    write was sent or wholly after its outcome was recorded, and never holds it by chance.
///    (An enqueue's first attempt does not wait: a fetch already in flight then is not stored.)
/// 2. **A read is stored only when its body cannot hold a write whose fate is unknown**: a write
///    whose send ended without telling whether the server took it (a timeout, a lost connection,
///    a cancellation mid-send, a 5xx other than 503), one that was on the wire when the process
///    before this one ended (the queue's `sendingAtOpen`), or one attempted before that. While such
///    a write of a read is still queued, what a fetch of the read brings is answered but not
///    stored: after a relaunch the queue would overlay the write on a body that may hold it.
/// 3. **A delivered write is recorded with the stored reads it changes before its file goes.**
///    Each such read's note gains the write (`SettlingNote`) and the read is marked stale; only
///    once those files are written does the queue forget the write and delete its file, at once.
///    A relaunch then finds the write either still queued (its file not yet deleted: overlaid
///    once, and sent again with its `Idempotency-Key`) or in the note of the read that lacks it
///    (overlaid once), never both on a body that holds it; and a read stored after the delivery
///    holds the write and carries no note.
final class SettlementTracker: ExchangeObserver, QueueSendObserver {
    /// What waits for its turn, or holds it.
    private enum Turn: Sendable {
        case send(QueueEntry)
        case exchange(URL, FetchAdmission?)
    }

    /// Where a live read's fetch learns how many deliveries had finished when its exchange took
    /// its turn (`FetchAdmission.current`, set around the fetch): every write delivered by then
    /// is in what the fetch brings, even when the fetch was asked for before the delivery (it
    /// waited for the write's send, `A read and a write of it take turns`), so its landing settles
    /// those writes rather than overlaying them a second time on a body that holds them.
    final class FetchAdmission: Sendable {
        @TaskLocal static var current: FetchAdmission?
        private let admitted = Locked<UInt64?>(nil)

        init() {}

        /// The number of deliveries finished when the exchange took its turn; nil until it did
        /// (or when the fetch joined an exchange another reader began).
        var deliveriesBefore: UInt64? { admitted.withLock { $0 } }

        fileprivate func admit(after deliveries: UInt64) {
            admitted.withLock { $0 = $0 ?? deliveries }
        }
    }

    private struct State: Sendable {
        /// Writes of unknown fate still queued (rule 2).
        var unknown: [UUID: QueueEntry] = [:]
        /// Writes a stored read's note says were delivered, while a file of theirs outlived the
        /// delivery (a kill between the two): of unknown fate, and never overlaid as pending.
        var knownDelivered: Set<UUID> = []
        /// Sends holding their turn: from `sendBegins` to `deliveryFinished` or `sendEnded`.
        var sending: [UUID: QueueEntry] = [:]
        /// Writes that left the queue (cancelled, superseded, dead-lettered…) while being sent:
        /// their `sendEnded` must not make them of unknown fate again.
        var leftWhileSending: Set<UUID> = []
        /// The writes that left the queue last, for `learn(from:)`, which checks the queue without
        /// this lock: a write found queued there may have left just after.
        var recentlyRemoved = RecentIDs()
        /// Exchanges holding their turn (by token): the URL, and whether a write of unknown fate
        /// may be in what they bring.
        var exchanges: [UInt64: (url: URL, tainted: Bool)] = [:]
        /// Sends and exchanges waiting for their turn, in arrival order (by token).
        var line: [(token: UInt64, turn: Turn)] = []
        /// Their continuations: true once admitted, false when cancelled.
        var waiters = WaiterList<Bool, UInt64>()
        var nextToken: UInt64 = 0
        /// Until `seed`: the queue's changes seen since observing began, applied after the seed.
        var early: [QueueChange]? = []
        /// Deliveries finished so far (`deliveryFinished`), and the number of each of the last few
        /// thousand, oldest forgotten first (`FetchAdmission`).
        var deliveries: UInt64 = 0
        var deliveryNumbers: [UUID: UInt64] = [:]
        var deliveryOrder: [UUID] = []
    }

    /// The last few thousand ids, oldest forgotten first.
    struct RecentIDs: Sendable {
        private var ids: Set<UUID> = []
        private var order: [UUID] = []
        static let capacity = 4_096

        func contains(_ id: UUID) -> Bool { ids.contains(id) }

        mutating func insert(_ id: UUID) {
            guard ids.insert(id).inserted else { return }
            order.append(id)
            if order.count > Self.capacity { ids.remove(order.removeFirst()) }
        }
    }

    private let state = Locked(State())
    private let rules: [OptimisticUpdate]
    /// Adds a delivered write to the notes of the stored reads it changes (the client's cache).
    private let record: @Sendable (QueueEntry, [OptimisticUpdate]) async -> Void
    /// Whether an entry is still queued (the client's queue).
    private let isQueued: @Sendable (UUID) -> Bool
    /// The queue's timer, and how long a replay waits for fetches ahead of it before it goes anyway.
    private let deadlines: DeadlineTimer?
    private let replayPatience: Duration

    /// How long a replay waits for fetches of reads it changes, begun before it, by default.
    static let defaultReplayPatience = Duration.seconds(2)

    init(
        rules: [OptimisticUpdate], deadlines: DeadlineTimer? = nil, replayPatience: Duration = defaultReplayPatience,
        isQueued: @escaping @Sendable (UUID) -> Bool = { _ in true },
        record: @escaping @Sendable (QueueEntry, [OptimisticUpdate]) async -> Void
    ) {
        self.rules = rules
        self.deadlines = deadlines
        self.replayPatience = replayPatience
        self.isQueued = isQueued
        self.record = record
    }

    /// The queue's entries when observing its changes began (`queueChanged` may already have been
    /// called with later ones: they are applied after these), and those a replay was sending, or
    /// had sent without learning the outcome, when the process before this one ended. Those, and
    /// every entry attempted before (its attempt count says so), may be in the server's state:
    /// their fate is unknown.
    func seed(_ queued: [QueueEntry], sendingAtOpen: Set<UUID>) {
        state.withLock { state in
            for entry in queued where changesAnyRead(entry) && (entry.attempts > 0 || sendingAtOpen.contains(entry.id)) {
                state.unknown[entry.id] = entry
            }
            let early = state.early ?? []
            state.early = nil
            for change in early { Self.apply(change, to: &state) }
        }
    }

    private func changesAnyRead(_ entry: QueueEntry) -> Bool {
        rules.contains { $0.mutations(entry) }
    }

    private func changes(_ entry: QueueEntry, _ url: URL) -> Bool {
        rules.contains { $0.mutations(entry) && $0.reads(url) }
    }

    private func conflict(_ a: Turn, _ b: Turn) -> Bool {
        switch (a, b) {
        case (.send(let entry), .exchange(let url, _)), (.exchange(let url, _), .send(let entry)): changes(entry, url)
        case (.send, .send), (.exchange, .exchange): false
        }
    }

    /// Whether a turn holding now stands in `turn`'s way.
    private func blockedByHolders(_ turn: Turn, _ state: State) -> Bool {
        switch turn {
        case .send(let entry): state.exchanges.values.contains { changes(entry, $0.url) }
        case .exchange(let url, _): state.sending.values.contains { changes($0, url) }
        }
    }

    private func hold(_ turn: Turn, token: UInt64, _ state: inout State) {
        switch turn {
        case .send(let entry):
            state.sending[entry.id] = entry
            // A send that did not wait (a first attempt, or a replay out of patience) may be in
            // what a fetch already in flight brings.
            for (other, exchange) in state.exchanges where !exchange.tainted && changes(entry, exchange.url) {
                state.exchanges[other]?.tainted = true
            }
        case .exchange(let url, let admission):
            state.exchanges[token] = (url, state.unknown.values.contains { changes($0, url) })
            admission?.admit(after: state.deliveries)
        }
    }

    /// Admits, in arrival order, every waiting turn that neither a holder nor an earlier waiter
    /// stands in the way of; returns their continuations to resume (outside the lock).
    private func admitReady(_ state: inout State) -> [WaiterList<Bool, UInt64>.Waiter] {
        guard !state.line.isEmpty else { return [] }
        var admitted: Set<UInt64> = []
        var waiting: [(token: UInt64, turn: Turn)] = []
        for item in state.line {
            if blockedByHolders(item.turn, state) || waiting.contains(where: { conflict($0.turn, item.turn) }) {
                waiting.append(item)
            } else {
                hold(item.turn, token: item.token, &state)
                admitted.insert(item.token)
            }
        }
        state.line = waiting
        guard !admitted.isEmpty else { return [] }
        return state.waiters.resumeAll(where: { admitted.contains($0) }, with: true)
    }

    private enum Start {
        case go(UInt64)
        case wait(UInt64, WaiterList<Bool, UInt64>.Ticket)
    }

    /// Takes `turn`'s turn, waiting in line for it (at most `patience`, when given: then it holds
    /// its turn anyway, as a send that did not wait); nil when the calling task is cancelled first.
    private func take(_ turn: Turn, patience: Duration? = nil) async -> UInt64? {
        let start = state.withLock { state -> Start in
            defer { state.nextToken += 1 }
            let token = state.nextToken
            if state.line.contains(where: { conflict($0.turn, turn) }) || blockedByHolders(turn, state) {
                // In line in the step that decided to wait: a turn handed over before the caller
                // suspends is kept for its ticket, never lost.
                state.line.append((token, turn))
                return .wait(token, state.waiters.issue(token))
            }
            hold(turn, token: token, &state)
            return .go(token)
        }
        guard case .wait(let token, let ticket) = start else {
            guard case .go(let token) = start else { return nil }
            return token
        }
        let timer = patience.flatMap { patience in deadlines?.schedule(after: patience) { [weak self] in self?.goAnyway(token) } }
        let admitted = await state.wait(for: ticket, on: \.waiters, cancelled: false)
        if let timer { deadlines?.cancel(timer) }
        if admitted { return token }
        // Cancelled: leave the line, and give back a turn handed over meanwhile.
        release { state in
            state.line.removeAll { $0.token == token }
            if case .send(let entry) = turn { state.sending[entry.id] = nil }
            state.exchanges[token] = nil
        }
        return nil
    }

    /// A waiting turn out of patience takes its turn without waiting further.
    private func goAnyway(_ token: UInt64) {
        let woken = state.withLock { state -> [WaiterList<Bool, UInt64>.Waiter] in
            guard let position = state.line.firstIndex(where: { $0.token == token }) else { return [] }
            let item = state.line.remove(at: position)
            hold(item.turn, token: token, &state)
            return state.waiters.resumeAll(where: { $0 == token }, with: true) + admitReady(&state)
        }
        for waiter in woken { waiter.continuation.resume(returning: true) }
    }

    /// Changes the state (a turn given up), then admits whoever can go.
    private func release(_ change: (inout State) -> Void) {
        let woken = state.withLock { state -> [WaiterList<Bool, UInt64>.Waiter] in
            change(&state)
            return admitReady(&state)
        }
        for waiter in woken { waiter.continuation.resume(returning: true) }
    }

    // MARK: ExchangeObserver

    func exchangeBegins(url: URL, storedNote: Data) async -> UInt64? {
        learn(from: storedNote)
        return await take(.exchange(url, FetchAdmission.current))
    }

    func mayStore(_ token: UInt64) -> Bool {
        state.withLock { $0.exchanges[token].map { !$0.tainted } ?? false }
    }

    func exchangeEnded(_ token: UInt64) {
        release { _ = $0.exchanges.removeValue(forKey: token) }
    }

    /// A stored read's note names writes delivered since it was stored; one still queued had its
    /// file outlive its delivery (a kill between the two). It is known delivered: never overlaid
    /// as pending, and of unknown fate until it leaves the queue (a read stored meanwhile, holding
    /// it with no note, would show it twice after the next relaunch).
    func learn(from note: Data) {
        guard !note.isEmpty else { return }
        let queued = SettlingNote.entries(note).filter { changesAnyRead($0) && isQueued($0.id) }
        guard !queued.isEmpty else { return }
        state.withLock { state in
            for entry in queued where !state.recentlyRemoved.contains(entry.id) {
                state.knownDelivered.insert(entry.id)
                state.unknown[entry.id] = entry
            }
        }
    }

    /// The queued writes known delivered (`learn(from:)`): never overlaid as pending.
    var knownDeliveredIDs: Set<UUID> { state.withLock { $0.knownDelivered } }

    // MARK: QueueSendObserver

    func observes(_ entry: QueueEntry) -> Bool { changesAnyRead(entry) }

    func sendBegins(_ entry: QueueEntry, waits: Bool) async -> Bool {
        guard changesAnyRead(entry) else { return true }
        if waits { return await take(.send(entry), patience: replayPatience) != nil }
        // An enqueue's first attempt goes at once: a fetch in flight may bring it, so is not stored.
        state.withLock { state in hold(.send(entry), token: 0, &state) }
        return true
    }

    func delivered(_ entry: QueueEntry) async {
        let matching = rules.filter { $0.mutations(entry) }
        guard !matching.isEmpty else { return }
        await record(entry, matching)
    }

    func deliveryFinished(_ entry: QueueEntry) {
        guard changesAnyRead(entry) else { return }
        release { state in
            state.sending[entry.id] = nil
            state.unknown[entry.id] = nil
            state.knownDelivered.remove(entry.id)
            state.leftWhileSending.remove(entry.id)
            state.deliveries += 1
            if state.deliveryNumbers.updateValue(state.deliveries, forKey: entry.id) == nil { state.deliveryOrder.append(entry.id) }
            if state.deliveryOrder.count > RecentIDs.capacity { state.deliveryNumbers[state.deliveryOrder.removeFirst()] = nil }
        }
    }

    /// Whether `id` was delivered (its delivery finished) before an exchange admitted after
    /// `deliveries` deliveries: then what that exchange brought holds it.
    func wasDelivered(_ id: UUID, within deliveries: UInt64) -> Bool {
        state.withLock { state in state.deliveryNumbers[id].map { $0 <= deliveries } ?? false }
    }

    func sendEnded(_ entry: QueueEntry, mayHaveReachedServer: Bool) {
        guard changesAnyRead(entry) else { return }
        release { state in
            state.sending[entry.id] = nil
            let left = state.leftWhileSending.remove(entry.id) != nil
            if mayHaveReachedServer, !left { state.unknown[entry.id] = entry }
        }
    }

    // MARK: The queue's other changes

    /// A change on the queue's feed, as it is published: a write that leaves the queue other than
    /// by delivery is no longer of unknown fate (its overlay goes; what the server has, the server
    /// shows); a coalesced edit that replaces one of unknown fate is of unknown fate too (the older
    /// edit may be in the server's state).
    func queueChanged(_ change: QueueChange) {
        state.withLock { state in
            if state.early != nil {
                state.early?.append(change)
            } else {
                Self.apply(change, to: &state)
            }
        }
    }

    private static func apply(_ change: QueueChange, to state: inout State) {
        switch change {
        case .removed(let entry, let reason):
            state.recentlyRemoved.insert(entry.id)
            guard !reason.isDelivered else { return }  // `deliveryFinished` ends those
            state.unknown[entry.id] = nil
            state.knownDelivered.remove(entry.id)
            if state.sending[entry.id] != nil { state.leftWhileSending.insert(entry.id) }
        case .stored(let entry, let replacing?):
            if state.unknown.removeValue(forKey: replacing) != nil { state.unknown[entry.id] = entry }
        default:
            break
        }
    }

    /// Writes of unknown fate still queued (for tests).
    var unknownCount: Int { state.withLock { $0.unknown.count } }

    /// Sends and fetches waiting for their turn (for tests).
    var waitingCount: Int { state.withLock { $0.line.count } }
}
