import Foundation
import Logging
import OfflineQueue
import PostgresNIO

/// The offline queue's storage in a PostgreSQL table, for a service whose replicas share one queue:
/// each replica's `OfflineQueueEngine` claims entries with `FOR UPDATE SKIP LOCKED` under a lease,
/// and an entry whose replica died is claimed again by another once the lease runs out.
///
/// ```swift
/// let store = try PostgresQueueStore(client: client)  // client.run() runs in the service group
/// try await store.migrate()  // at every replica's start: safe concurrently
/// ```
///
/// Needs PostgreSQL 13 or later (`gen_random_uuid()` is built in from 13 on).
///
/// Every rule of `QueueStorage` holds across replicas:
/// - claims go by priority (highest first), then FIFO by `sequence` (the row's `seq`, taken from a
///   sequence when the entry is added; a coalescing replacement keeps the holder's);
/// - an entry with an ordering or coalescing key is claimable only when no row of its key with a
///   smaller `seq` exists, claimed or not, so a key's entries go one at a time and in the order their
///   transactions committed: adding an entry of a key takes a transaction-scoped advisory lock on
///   the key before it takes its `seq`;
/// - `add` of an entry with a coalescing key replaces, in its place, the key's newest row when that
///   row has no lease (no claim, live or expired) and the same ordering key (or neither has one);
///   otherwise the edit is added behind it;
/// - a claim is a lease (`lease_token`, `lease_until`): settling it (`complete`, `release`,
///   `deadLetter`) and `renew` match the row's id and token, and when the row is gone or another
///   consumer holds it they change nothing and throw `OfflineQueueError.claimLost(id:)` (the
///   settlements, and the renewals, of claims in flight at once share a statement: `Configuration`);
/// - the times that decide what is due, expired or leased are the `now` each call is given (the
///   engine's clock), never the database's clock; a claim's lease runs to `now + lease`.
///
/// **The replicas' clocks must agree.** Whether a lease ran out is judged by the clock of the
/// replica that looks, against the end its holder's clock set. The engine renews a lease every
/// third of `OfflineQueueEngine.Configuration.claimLease`, so a lease whose renewals succeed has
/// at least `claimLease - claimLease / 3` left (20 s with the default 30 s): keep every two
/// replicas' clocks (NTP) within well under that of each other. A replica whose clock runs
/// further ahead of another's sees that one's live leases as run out and claims its entries while
/// they are being sent: a request is then in flight twice at once (with one `Idempotency-Key`),
/// until the first holder's next renewal finds its claim lost and cancels its send.
///
/// A delivered (or cancelled, expired, dead-lettered) entry's row is deleted: the table holds only
/// queued entries. Dead letters are moved to `<table>_dead_letter` (`deadLetters()`). The table is
/// shared: `removeAll()` (the engine's `clear()`) deletes every replica's entries, and an `add`
/// `limit` (the engine's `maxQueueSize`) counts them all.
///
/// Entries are stored as their JSON encoding (`entry jsonb`) beside the columns claims search on.
/// `Authorization`, `Proxy-Authorization`, `Cookie` and `Idempotency-Key` headers are never written
/// (the key travels in the entry's `idempotencyKey`), whoever built the entry.
///
/// Errors are `OfflineQueueError` for the queue's own outcomes and `PostgresQueueStoreError`
/// otherwise (the database unreachable or failing, an unreadable row, a schema too new). A
/// `.database` error keeps PostgreSQL's SQLSTATE and primary message only, and the store logs no
/// more: its statements bind ids, times, numbers, the entry's ordering and coalescing keys and its
/// JSON, and the JSON (the request's URL, headers and body) never appears in a primary message;
/// PostgreSQL's DETAIL and CONTEXT, which can quote a row, are dropped.
public final class PostgresQueueStore: Sendable {
    /// The newest schema version this library writes and reads (`migrate()`).
    public static let schemaVersion = 1

    /// The longest table name: PostgreSQL keeps 63 bytes of an identifier, and the store adds
    /// `_dead_letter` for its second table.
    public static let maximumTableNameLength = 51

    /// The client the store runs its statements on (its `run()` must be running).
    public let client: PostgresClient
    /// The queue table's name; its companions are `<tableName>_dead_letter`, `<tableName>_schema`
    /// and the sequence `<tableName>_seq`. `NOTIFY` goes to the channel of the same name.
    public let tableName: String

    /// What `enqueue(_:on:)` strips from a request or refuses, as
    /// `OfflineQueueEngine.Configuration.secretPolicy` does for the engine's own enqueue: give both
    /// the same policy.
    public let secretPolicy: QueueSecretPolicy

    /// Every replica's changes to the table: this store publishes its own as it makes them, and
    /// learns of the others' (outbox enqueues included) from the `NOTIFY` each change sends —
    /// once someone follows the feed (until then it keeps nothing, and listens on nothing). See
    /// `ChangeFeedFollower` for the notices and what a lost connection does.
    public let changeFeed: QueueChangeFeed
    /// Follows the channel for `changeFeed`, and names this store in its notices.
    let follower = ChangeFeedFollower()

    let names: TableNames
    let logger: Logger
    /// How long `arrivals()` waits before listening again after its connection failed.
    let reconnectDelay: Duration
    /// The store's tunables.
    public let configuration: Configuration
    /// Gathers the settlements, and the renewals, of claims in flight at once into one statement
    /// each.
    let batcher: ClaimBatcher
    /// The generation in the names of the store's prepared statements.
    let statementGeneration = StatementGeneration()

    /// Tunables; the defaults are what the benchmarks measured (Benchmarks/README.md).
    public struct Configuration: Sendable {
        /// The longest a settlement (a completion, release or dead letter) waits for those of
        /// this store's other claims in flight to share its statement, and a lease renewal for
        /// theirs. Neither waits when no other claim of the store is out to join it (an engine
        /// sending one entry at a time). Default 5 ms.
        public var completionWindow: Duration
        /// The most settlements, or renewals, in one statement. Default 256.
        public var maximumCompletionBatch: Int
        /// Whether the hot statements — claims, settlements, renewals — run as prepared
        /// statements on each connection (parsed and planned once, not at every call). Default
        /// `true`; turn it off behind a pooler that hands one session's statements to several
        /// server connections (PgBouncer in transaction mode before 1.21).
        public var preparesStatements: Bool

        public init(completionWindow: Duration = .milliseconds(5), maximumCompletionBatch: Int = 256, preparesStatements: Bool = true) {
            self.completionWindow = max(.zero, completionWindow)
            self.maximumCompletionBatch = max(1, maximumCompletionBatch)
            self.preparesStatements = preparesStatements
        }
    }

    /// A store on `tableName` (created by `migrate()`).
    ///
    /// - Throws: `PostgresQueueStoreError.invalidTableName` unless `tableName` is a plain SQL
    ///   identifier: a letter or `_`, then letters, digits or `_`, at most
    ///   `maximumTableNameLength` characters. It is quoted as written, so letter case counts.
    ///
    /// - Parameters:
    ///   - client: the client the statements run on; its `run()` must be running.
    ///   - tableName: the queue table's name.
    ///   - secretPolicy: what the outbox enqueue strips or refuses (the engine's default).
    ///   - logger: where the store logs: failures' SQLSTATEs and primary messages (at `debug`), and
    ///     unreadable rows by id; never an entry's JSON.
    ///   - reconnectDelay: how long `arrivals()` waits before listening again after its connection
    ///     failed.
    ///   - configuration: the tunables (batching of settlements and renewals, prepared statements); the defaults need
    ///     no change.
    public init(
        client: PostgresClient,
        tableName: String = "resilience_queue",
        secretPolicy: QueueSecretPolicy = .standard,
        logger: Logger = Logger(label: "ResiliencePostgres"),
        reconnectDelay: Duration = .seconds(1),
        configuration: Configuration = Configuration()
    ) throws(PostgresQueueStoreError) {
        guard Self.isPlainIdentifier(tableName) else { throw .invalidTableName(tableName) }
        self.client = client
        self.tableName = tableName
        self.secretPolicy = secretPolicy
        self.names = TableNames(tableName)
        self.logger = logger
        self.reconnectDelay = reconnectDelay
        self.configuration = configuration
        self.batcher = ClaimBatcher(window: configuration.completionWindow, maximumBatch: configuration.maximumCompletionBatch)
        let (names, follower) = (self.names, self.follower)
        changeFeed = QueueChangeFeed { feed in
            follower.start(feed: feed, client: client, names: names, logger: logger, reconnectDelay: reconnectDelay)
        }
    }

    /// Stops following the table's changes for `changeFeed` (and gives its connection back). The
    /// table itself stays usable: the store holds nothing else to let go of.
    nonisolated(nonsending) public func close() async {
        follower.stop()
    }

    /// Whether `name` may name the queue table.
    public static func isPlainIdentifier(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, name.unicodeScalars.count <= maximumTableNameLength else { return false }
        func isLetter(_ scalar: Unicode.Scalar) -> Bool { ("a"..."z").contains(scalar) || ("A"..."Z").contains(scalar) || scalar == "_" }
        return isLetter(first) && name.unicodeScalars.allSatisfy { isLetter($0) || ("0"..."9").contains($0) }
    }

    /// The entries moved to the dead letters, oldest first.
    public func deadLetters() async throws -> [QueueEntry] {
        try await perform("deadLetters") {
            let rows = try await client.query("SELECT seq, entry::text FROM \(unescaped: names.deadLetter) ORDER BY dead_lettered_at, seq", logger: logger)
            return try await Self.entries(from: rows)
        }
    }
}

// MARK: - Names

/// The quoted names of the store's objects, all derived from the table name.
struct TableNames: Sendable {
    /// The table name as given (also the NOTIFY channel and the advisory locks' prefix).
    let plain: String
    let queue: String
    let deadLetter: String
    let schema: String
    /// The sequence, as `nextval` takes it (a string literal holding the quoted name).
    let sequenceLiteral: String
    let sequence: String

    init(_ table: String) {
        plain = table
        queue = "\"\(table)\""
        deadLetter = "\"\(table)_dead_letter\""
        schema = "\"\(table)_schema\""
        sequence = "\"\(table)_seq\""
        sequenceLiteral = "'\"\(table)_seq\"'"
    }

    /// An index's quoted name.
    func index(_ suffix: String) -> String { "\"\(plain)_\(suffix)\"" }
}

// MARK: - Running statements

extension PostgresQueueStore {
    /// Runs `body`, throwing its failure as the store's error for `operation`.
    func perform<Result: Sendable>(_ operation: String, _ body: () async throws -> Result) async throws -> Result {
        do {
            return try await body()
        } catch {
            let wrapped = PostgresQueueStoreError.wrapping(error, operation: operation)
            if case PostgresQueueStoreError.database(_, let sqlState, let message) = wrapped {
                logger.debug("PostgreSQL error", metadata: ["operation": "\(operation)", "sqlState": "\(sqlState ?? "-")", "message": "\(message)"])
            }
            throw wrapped
        }
    }

    /// Runs `body` in a READ COMMITTED transaction of its own on one of the client's connections:
    /// committed when it returns, rolled back when it throws (its error is thrown as the store's).
    func transaction<Result: Sendable>(_ operation: String, _ body: @Sendable (PostgresConnection) async throws -> Result) async throws -> Result {
        let logger = self.logger
        return try await perform(operation) {
            try await client.withConnection { connection in
                // READ COMMITTED whatever the server's default: each statement sees what committed
                // before it, which the key locks rely on (see `insert`).
                try await connection.query("BEGIN ISOLATION LEVEL READ COMMITTED", logger: logger)
                do {
                    let result = try await body(connection)
                    try await connection.query("COMMIT", logger: logger)
                    return result
                } catch {
                    // A failed rollback leaves a connection the server ends the transaction on
                    // (or one that is closed): the body's error is the one that explains.
                    _ = try? await connection.query("ROLLBACK", logger: logger)
                    throw error
                }
            }
        }
    }

    /// The entries of rows of `(seq, entry::text)`, each placed at its row's `seq`.
    static func entries(from rows: PostgresRowSequence) async throws -> [QueueEntry] {
        var entries: [QueueEntry] = []
        for try await (seq, json) in rows.decode((Int64, String).self) {
            entries.append(try decodeEntry(json, seq: seq))
        }
        return entries
    }
}

// MARK: - Entry encoding

extension PostgresQueueStore {
    /// Header names no row ever holds, whoever built the entry: the always-secret ones and
    /// `Idempotency-Key` (which travels as the entry's `idempotencyKey`).
    static let unstorableHeaderNames: Set<String> = QueueSecretPolicy.alwaysSecretHeaderNames.union(["idempotency-key"])

    /// `entry`'s JSON (infinite timeouts and TTLs as `"inf"`, like the disk queue's files), without
    /// any of `unstorableHeaderNames`.
    static func encodeEntry(_ entry: QueueEntry) throws -> String {
        let encoder = JSONEncoder()
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        var data: Data
        do {
            data = try encoder.encode(entry)
        } catch {
            throw OfflineQueueError.unstorable(reason: "the entry could not be encoded")
        }
        if entry.headers.keys.contains(where: { unstorableHeaderNames.contains($0.lowercased()) }) {
            data = try withoutUnstorableHeaders(data)
        }
        guard let json = String(data: data, encoding: .utf8) else {
            throw OfflineQueueError.unstorable(reason: "the entry's encoding is not UTF-8")
        }
        return json
    }

    /// An entry's JSON with the `headers` object filtered (an entry decoded by a caller, or made by
    /// hand, may carry headers the queue never stores; its headers cannot be set from here).
    private static func withoutUnstorableHeaders(_ data: Data) throws -> Data {
        guard var object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any],
            let headers = object["headers"] as? [String: Any]
        else { throw OfflineQueueError.unstorable(reason: "the entry's headers could not be filtered") }
        object["headers"] = headers.filter { !unstorableHeaderNames.contains($0.key.lowercased()) }
        guard let filtered = try? JSONSerialization.data(withJSONObject: object) else {
            throw OfflineQueueError.unstorable(reason: "the entry's headers could not be filtered")
        }
        return filtered
    }

    /// A row's entry, placed at the row's `seq` (the truth for its place in line).
    static func decodeEntry(_ json: String, seq: Int64) throws -> QueueEntry {
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        do {
            return try decoder.decode(QueueEntry.self, from: Data(json.utf8)).placed(at: UInt64(max(0, seq)))
        } catch {
            let id = (try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])?["id"].flatMap { $0 as? String }.flatMap(UUID.init(uuidString:))
            throw PostgresQueueStoreError.unreadableEntry(id: id, reason: "its JSON is not a queue entry (\(type(of: error)))")
        }
    }
}

extension Duration {
    /// The duration in seconds, as `Date` arithmetic takes it.
    var timeInterval: TimeInterval {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
