import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import Testing

/// The PostgreSQL these tests run against: `RESILIENCE_POSTGRES_URL`
/// (`postgres://user[:password]@host:port/database`), else `RESILIENCE_POSTGRES_HOST`,
/// `_PORT`, `_USER`, `_PASSWORD`, `_DATABASE`, each defaulting to what `Scripts/postgres.sh start`
/// runs (127.0.0.1:55432, database `resilience_test`, user `postgres` as root, else the caller).
enum PostgresTestDatabase {
    static let configuration: PostgresClient.Configuration = {
        let environment = ProcessInfo.processInfo.environment
        var host = environment["RESILIENCE_POSTGRES_HOST"] ?? "127.0.0.1"
        var port = environment["RESILIENCE_POSTGRES_PORT"].flatMap(Int.init) ?? 55432
        var user = environment["RESILIENCE_POSTGRES_USER"] ?? (getuid() == 0 ? "postgres" : ProcessInfo.processInfo.userName)
        var password = environment["RESILIENCE_POSTGRES_PASSWORD"]
        var database = environment["RESILIENCE_POSTGRES_DATABASE"] ?? "resilience_test"
        if let url = environment["RESILIENCE_POSTGRES_URL"].flatMap(URLComponents.init(string:)) {
            host = url.host ?? host
            port = url.port ?? port
            user = url.user ?? user
            password = url.password ?? password
            let path = url.path.drop { $0 == "/" }
            if !path.isEmpty { database = String(path) }
        }
        var configuration = PostgresClient.Configuration(host: host, port: port, username: user, password: password, database: database, tls: .disable)
        configuration.options.connectTimeout = .seconds(5)
        return configuration
    }()

    /// Whether the database answers a connection (the suite is skipped, saying so, when not).
    static func isReachable() async -> Bool {
        do {
            let connection = try await PostgresConnection.connect(
                configuration: PostgresConnection.Configuration(
                    host: configuration.host ?? "127.0.0.1", port: configuration.port ?? 5432, username: configuration.username,
                    password: configuration.password, database: configuration.database, tls: .disable),
                id: 0, logger: Logger(label: "ResiliencePostgresTests"))
            try await connection.close()
            return true
        } catch {
            return false
        }
    }

    /// A client whose `run()` runs for the length of `body`.
    @discardableResult
    static func withClient<Result: Sendable>(_ body: (PostgresClient) async throws -> Result) async throws -> Result {
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
            let tableName = uniqueTableName()
            let store = try PostgresQueueStore(client: client, tableName: tableName)
            try await store.migrate()
            do {
                let result = try await body(store, client)
                try await drop(tableName, on: client)
                return result
            } catch {
                try? await drop(tableName, on: client)
                throw error
            }
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
