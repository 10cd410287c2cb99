import Foundation
import Logging
import OfflineQueue
import PostgresEnvironment
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import Testing

/// The PostgreSQL these tests run against (`PostgresEnvironment`: `RESILIENCE_POSTGRES_URL`, else
/// `RESILIENCE_POSTGRES_HOST` and the like, defaulting to what `Scripts/postgres.sh start` runs).
enum PostgresTestDatabase {
    static var configuration: PostgresClient.Configuration { PostgresEnvironment.configuration }

    /// The environment variable that says a server must answer (`CI` or `RESILIENCE_POSTGRES_URL`),
    /// if one is set: the suites then fail, rather than skip, when none does.
    static var requiredBy: String? {
        let environment = ProcessInfo.processInfo.environment
        return ["RESILIENCE_POSTGRES_URL", "CI"].first { environment[$0] != nil }
    }

    /// Thrown by `.postgresReachable` when a server must answer and does not: Swift Testing records
    /// it as the test's failure.
    struct Unreachable: Error, CustomStringConvertible {
        let requiredBy: String
        var description: String {
            "PostgreSQL at \(configuration.host ?? "?"):\(configuration.port ?? 5432) does not answer, and \(requiredBy) is set: "
                + "the tests must run against it (start it with `bash Scripts/postgres.sh start`)"
        }
    }

    /// Whether the database answers a connection (when not, the suites are skipped, saying so, or
    /// fail when `requiredBy` says a server must answer).
    static func isReachable() async -> Bool {
        do {
            let connection = try await PostgresConnection.connect(
                configuration: PostgresConnection.Configuration(
                    host: configuration.host ?? "127.0.0.1", port: configuration.port ?? 5432, username: configuration.username,
                    password: configuration.password, database: configuration.database, tls: .disable),
                id: 0, logger: testLogger)
            try await connection.close()
            return true
        } catch {
            return false
        }
    }

    /// A client whose `run()` runs for the length of `body`.
    @discardableResult
    static func withClient<Result: Sendable>(
        _ configuration: PostgresClient.Configuration = configuration, _ body: (PostgresClient) async throws -> Result
    ) async throws -> Result {
        let client = PostgresClient(configuration: configuration)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    /// A table name no other test uses.
    static func uniqueTableName(_ label: String = "rq") -> String {
        "\(label)_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
    }

    /// Drops the store's tables (the sequence goes with the queue table).
    static func drop(_ tableName: String, on client: PostgresClient) async throws {
        let names = ["\"\(tableName)\"", "\"\(tableName)_dead_letter\"", "\"\(tableName)_schema\""].joined(separator: ", ")
        try await client.query(PostgresQuery(unsafeSQL: "DROP TABLE IF EXISTS \(names)"))
    }

    /// A migrated store on a table of its own, dropped after `body`.
    @discardableResult
    static func withStore<Result: Sendable>(_ body: (PostgresQueueStore, PostgresClient) async throws -> Result) async throws -> Result {
        try await withClient { client in
            try await withStore(on: client) { store in try await body(store, client) }
        }
    }

    /// A store on `client`, on a table of its own named after `label` (migrated unless `migrated`
    /// is false), dropped after `body`.
    @discardableResult
    static func withStore<Result: Sendable>(
        on client: PostgresClient, label: String = "rq", configuration: PostgresQueueStore.Configuration = .init(), migrated: Bool = true,
        _ body: (PostgresQueueStore) async throws -> Result
    ) async throws -> Result {
        let tableName = uniqueTableName(label)
        let store = try PostgresQueueStore(client: client, tableName: tableName, configuration: configuration)
        if migrated { try await store.migrate() }
        do {
            let result = try await body(store)
            try await drop(tableName, on: client)
            return result
        } catch {
            try? await drop(tableName, on: client)
            throw error
        }
    }
}

// MARK: - Entries and time

/// The tests' clock: every time is given explicitly, counted from here.
let t0 = Date(timeIntervalSince1970: 1_900_000_000)

func at(_ seconds: TimeInterval) -> Date { t0.addingTimeInterval(seconds) }

func request(
    _ path: String = "/items",
    priority: QueuePriority = .normal,
    orderingKey: String? = nil,
    coalescingKey: String? = nil,
    ttl: TimeInterval = 86_400,
    headers: [String: String] = [:],
    body: String? = nil,
    idempotencyKey: String = UUID().uuidString
) -> QueuedRequest {
    QueuedRequest(
        method: .post, url: URL(string: "https://api.example.com\(path)")!, headers: headers, body: body.map { Data($0.utf8) },
        ttl: ttl, priority: priority, idempotencyKey: idempotencyKey, orderingKey: orderingKey, coalescingKey: coalescingKey)
}

func entry(_ request: QueuedRequest, enqueuedAt: Date = t0) -> QueueEntry {
    QueueEntry(request, enqueuedAt: enqueuedAt)
}

extension QueueEntry {
    /// This entry after a failed attempt: one more attempt, not due before `nextAttemptAt`. (The
    /// fields are the engine's to set: the test edits the entry's JSON, as a consumer's engine
    /// would have written it.)
    func afterFailedAttempt(nextAttemptAt: Date?, lastError: String = "HTTP 503") throws -> QueueEntry {
        try editingJSON { object in
            object["attempts"] = (object["attempts"] as? Int ?? 0) + 1
            object["nextAttemptAt"] = nextAttemptAt.map { $0.timeIntervalSinceReferenceDate }
            object["lastError"] = lastError
        }
    }

    /// This entry with `headers` as stored, whatever they hold (as an entry decoded by a caller may).
    func withRawHeaders(_ headers: [String: String]) throws -> QueueEntry {
        try editingJSON { $0["headers"] = headers }
    }

    private func editingJSON(_ edit: (inout [String: Any]) -> Void) throws -> QueueEntry {
        let encoder = JSONEncoder()
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        var object = try #require(try JSONSerialization.jsonObject(with: encoder.encode(self)) as? [String: Any])
        edit(&object)
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return try decoder.decode(QueueEntry.self, from: JSONSerialization.data(withJSONObject: object))
    }
}

/// Whether `body` throws `OfflineQueueError.claimLost` for `id`.
func expectClaimLost(_ id: UUID, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void) async {
    await #expect(throws: OfflineQueueError.claimLost(id: id), sourceLocation: sourceLocation) { try await body() }
}

extension PostgresClient {
    /// The rows of one text column.
    func strings(_ query: PostgresQuery) async throws -> [String] {
        var values: [String] = []
        for try await value in try await self.query(query).decode(String.self) { values.append(value) }
        return values
    }

    /// One integer.
    func integer(_ query: PostgresQuery) async throws -> Int {
        var result = 0
        for try await value in try await self.query(query).decode(Int64.self) { result = Int(value) }
        return result
    }
}

// MARK: - Transactions held open, locks and bounds

let testLogger = Logger(label: "ResiliencePostgresTests")

/// A transaction on one of a client's connections that stays open after its body until
/// `commit()` or `rollBack()`: what a service's request handler does while it still works.
final class OpenTransaction<Value: Sendable>: Sendable {
    /// What the body returned.
    let value: Value
    private let end: AsyncStream<Bool>.Continuation
    private let task: Task<Void, any Error>

    private init(value: Value, end: AsyncStream<Bool>.Continuation, task: Task<Void, any Error>) {
        self.value = value
        self.end = end
        self.task = task
    }

    /// Begins a transaction (`begin` is the statement, for another isolation level), runs `body`
    /// in it, and returns once `body` has: the transaction is open until `commit()` or
    /// `rollBack()`. When `body` throws, the transaction is rolled back and the error thrown.
    static func begin(
        on client: PostgresClient, _ begin: String = "BEGIN", _ body: @escaping @Sendable (PostgresConnection) async throws -> Value
    ) async throws -> OpenTransaction {
        let (ends, end) = AsyncStream<Bool>.makeStream()
        let (values, started) = AsyncThrowingStream<Value, any Error>.makeStream()
        let task = Task {
            do {
                try await client.withConnection { connection in
                    try await connection.query(PostgresQuery(unsafeSQL: begin), logger: testLogger)
                    do {
                        started.yield(try await body(connection))
                    } catch {
                        _ = try? await connection.query("ROLLBACK", logger: testLogger)
                        throw error
                    }
                    var commits = false
                    for await decision in ends {
                        commits = decision
                        break
                    }
                    try await connection.query(commits ? "COMMIT" : "ROLLBACK", logger: testLogger)
                }
                started.finish()
            } catch {
                started.finish(throwing: error)
                throw error
            }
        }
        var iterator = values.makeAsyncIterator()
        guard let value = try await iterator.next() else { throw CancellationError() }
        return OpenTransaction(value: value, end: end, task: task)
    }

    func commit() async throws {
        end.yield(true)
        try await task.value
    }

    func rollBack() async throws {
        end.yield(false)
        try await task.value
    }
}

/// What `operation` returns, or `nil` when it has not returned within `bound`: a test that
/// something does not wait for a lock fails after `bound` rather than hanging. The operation runs
/// in a task of its own, left to finish on its own when the bound passes (whatever held it up must
/// then be released for it to end).
func within<Result: Sendable>(_ bound: Duration, _ operation: @escaping @Sendable () async throws -> Result) async throws -> Result? {
    // Not a task group: the group would wait for a blocked operation when the bound passes.
    let (outcomes, outcome) = AsyncStream<Swift.Result<Result, any Error>?>.makeStream()
    Task {
        do {
            outcome.yield(.success(try await operation()))
        } catch {
            outcome.yield(.failure(error))
        }
    }
    let timer = Task {
        try? await Task.sleep(for: bound)
        outcome.yield(nil)
    }
    defer { timer.cancel() }
    for await first in outcomes { return try first?.get() }
    return nil
}

extension PostgresClient {
    /// How many transactions wait for the transaction-scoped advisory lock `key` (as the store
    /// takes it: `pg_advisory_xact_lock(hashtextextended(key, 0))`).
    func waiters(forAdvisoryLock key: String) async throws -> Int {
        try await integer(
            """
            SELECT count(*) FROM pg_locks, (SELECT hashtextextended(\(key), 0) AS h) AS lock
            WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND classid = ((lock.h >> 32) & 4294967295)::oid AND objid = (lock.h & 4294967295)::oid AND objsubid = 1
            """)
    }

    /// Returns once a transaction waits for the advisory lock `key`: looks every few milliseconds
    /// (the suite's time limit bounds it).
    func untilSomeoneWaits(forAdvisoryLock key: String) async throws {
        while try await waiters(forAdvisoryLock: key) == 0 {
            try await Task.sleep(for: .milliseconds(5))
        }
    }
}
