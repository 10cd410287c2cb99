import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import Synchronization

/// How `PostgresQueueStore.changeFeed` learns what every replica changes.
///
/// Each statement that changes the table sends a `NOTIFY` on the table's channel when it commits,
/// one per row it changed, saying what happened: `<origin>|s|<id>|<replaced id>` (stored, in place
/// of the replaced entry when it names one), `<origin>|u|<id>|` (updated: a release kept it with a
/// new attempt count or backoff) and `<origin>|r|<id>|<reason>` (removed, and why: `d201`
/// delivered, `j422` or `j` rejected, `e` expired, `l5` dead-lettered after 5 attempts, `c`
/// cancelled). `<origin>` names the store instance that made the change: a store publishes its own
/// changes on its feed as it makes them, and skips its own notices. An outbox `enqueue` names no
/// origin (its caller's transaction may still roll back), so every store, its own included, learns
/// of it from the notice.
///
/// The feed follows the channel only once someone follows the feed: it then listens on one of the
/// client's connections, reads the table (so nothing added before it listened is missed), and
/// applies each notice in commit order — a stored or updated entry read from its row (gone by then:
/// skipped, its removal follows), a removal by id with its reason. When the connection is lost it
/// listens again after `reconnectDelay` and reads the table again: an entry that left meanwhile is
/// published as removed, `cancelled` (its fate is not known here).
final class ChangeFeedFollower: Sendable {
    /// Names this store instance in its notices.
    let origin = UUID().uuidString
    private let task = Mutex<Task<Void, Never>?>(nil)
    private let stopped = Mutex(false)

    /// Starts following for `feed` (once).
    func start(feed: QueueChangeFeed, client: PostgresClient, names: TableNames, logger: Logger, reconnectDelay: Duration) {
        let origin = self.origin
        let follow = Task { [weak feed] in
            while !Task.isCancelled {
                do {
                    try await client.withConnection { connection in
                        try await connection.listen(on: names.plain) { notifications in
                            guard let current = feed else { return }
                            try await Self.resync(current, client: client, names: names, logger: logger)
                            for try await notification in notifications {
                                guard let current = feed else { return }
                                try await Self.apply(notification.payload, origin: origin, to: current, client: client, names: names, logger: logger)
                            }
                        }
                    }
                } catch is CancellationError {
                    break
                } catch {
                    guard !Task.isCancelled else { break }
                    let failure = PostgresQueueStoreError.wrapping(error, operation: "changeFeed")
                    logger.debug("change feed: LISTEN connection lost; listening again", metadata: ["error": "\(failure)"])
                }
                guard feed != nil else { break }
                try? await Task.sleep(for: reconnectDelay)
            }
        }
        let cancelled = stopped.withLock { stopped in
            task.withLock { $0 = follow }
            return stopped
        }
        if cancelled { follow.cancel() }
    }

    /// Stops following (the store is closed or gone).
    func stop() {
        let follow = stopped.withLock { stopped -> Task<Void, Never>? in
            stopped = true
            return task.withLock { $0 }
        }
        follow?.cancel()
    }

    deinit { stop() }

    /// Reads the table and brings the feed in line: entries it lacks are published as stored,
    /// entries it held before the read that are gone as removed (`cancelled`: their fate is not
    /// known here).
    private static func resync(_ feed: QueueChangeFeed, client: PostgresClient, names: TableNames, logger: Logger) async throws {
        let heldBefore = feed.entries().filter { $0.sequence != 0 }
        let rows = try await client.query("SELECT seq, entry::text FROM \(unescaped: names.queue) ORDER BY priority DESC, seq", logger: logger)
        let queued = try await PostgresQueueStore.entries(from: rows)
        let ids = Set(queued.map(\.id))
        for entry in queued where !feed.contains(id: entry.id) {
            feed.publishFromElsewhere(.stored(entry, replacing: nil))
        }
        for entry in heldBefore where !ids.contains(entry.id) {
            feed.publishFromElsewhere(.removed(entry, reason: .cancelled))
        }
    }

    /// Applies one notice (see the type's comment); a notice of this instance's is skipped, one
    /// this version cannot read makes the feed read the table.
    private static func apply(
        _ payload: String, origin: String, to feed: QueueChangeFeed, client: PostgresClient, names: TableNames, logger: Logger
    ) async throws {
        let parts = payload.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 4, let id = UUID(uuidString: parts[2]) else {
            return try await resync(feed, client: client, names: names, logger: logger)
        }
        guard parts[0] != origin else { return }
        switch parts[1] {
        case "s", "u":
            let rows = try await client.query("SELECT seq, entry::text FROM \(unescaped: names.queue) WHERE id = \(id)", logger: logger)
            let replaced = UUID(uuidString: parts[3])
            guard let entry = try await PostgresQueueStore.entries(from: rows).first else {
                // Gone already: its removal follows (and is skipped, never held here); the entry it
                // replaced went with the replacement.
                if let replaced, let old = feed.entry(id: replaced) { feed.publishFromElsewhere(.removed(old, reason: .superseded)) }
                return
            }
            feed.publishFromElsewhere(parts[1] == "s" ? .stored(entry, replacing: replaced) : .updated(entry))
        case "r":
            guard let entry = feed.entry(id: id), let reason = QueueRemovalReason(notice: parts[3]) else { return }
            feed.publishFromElsewhere(.removed(entry, reason: reason))
        default:
            try await resync(feed, client: client, names: names, logger: logger)
        }
    }
}

extension QueueRemovalReason {
    /// The reason as a notice spells it.
    var notice: String {
        switch self {
        case .delivered(let status): "d\(status)"
        case .rejected(let status): "j\(status.map(String.init) ?? "")"
        case .expired: "e"
        case .deadLettered(let attempts): "l\(attempts)"
        case .cancelled: "c"
        case .superseded: "x"
        case .notStored: "n"
        case .conflict(let status): "k\(status)"
        }
    }

    init?(notice: String) {
        guard let kind = notice.first else { return nil }
        let number = Int(notice.dropFirst())
        switch kind {
        case "d": self = .delivered(statusCode: number ?? 200)
        case "j": self = .rejected(statusCode: number)
        case "e": self = .expired
        case "l": self = .deadLettered(attempts: number ?? 0)
        case "c": self = .cancelled
        case "x": self = .superseded
        case "n": self = .notStored
        case "k": self = .conflict(statusCode: number ?? 412)
        default: return nil
        }
    }
}

extension PostgresQueueStore {
    /// The notice of a change this store makes (`origin` empty for the outbox's, which the store
    /// does not publish itself).
    func notice(_ kind: Character, _ id: UUID, _ detail: String = "", fromHere: Bool = true) -> String {
        "\(fromHere ? follower.origin : "")|\(kind)|\(id.uuidString)|\(detail)"
    }

    /// The start of a per-row notice built in SQL (`prefix || id::text || '|' || detail`).
    func noticePrefix(_ kind: Character) -> String { "\(follower.origin)|\(kind)|" }
}
