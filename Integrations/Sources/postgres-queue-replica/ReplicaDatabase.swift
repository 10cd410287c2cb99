import Foundation
import Logging
import PostgresNIO

/// The PostgreSQL the replicas share, read from the environment the ResiliencePostgres tests read:
/// `RESILIENCE_POSTGRES_URL` (`postgres://user[:password]@host:port/database`), else
/// `RESILIENCE_POSTGRES_HOST`, `_PORT`, `_USER`, `_PASSWORD`, `_DATABASE`, each defaulting to what
/// `Scripts/postgres.sh start` runs (127.0.0.1:55432, database `resilience_test`, user `postgres` as
/// root, else the caller).
enum ReplicaDatabase {
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

    /// Runs `body` with a client whose `run()` runs meanwhile.
    static func withClient<Result: Sendable>(_ body: @Sendable (PostgresClient) async throws -> Result) async throws -> Result {
        let client = PostgresClient(configuration: configuration)
        return try await withThrowingTaskGroup(of: Result?.self) { group in
            group.addTask {
                await client.run()
                return nil
            }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    /// Drops the queue's tables (the sequence goes with the queue table).
    static func drop(_ tableName: String, on client: PostgresClient) async throws {
        let names = ["\"\(tableName)\"", "\"\(tableName)_dead_letter\"", "\"\(tableName)_schema\""].joined(separator: ", ")
        try await client.query(PostgresQuery(unsafeSQL: "DROP TABLE IF EXISTS \(names)"))
    }
}
