import Foundation
import Logging
import PostgresEnvironment
import PostgresNIO

/// The PostgreSQL the replicas share: the one the ResiliencePostgres tests use
/// (`PostgresEnvironment`, read from `RESILIENCE_POSTGRES_URL` and the like).
enum ReplicaDatabase {
    static var configuration: PostgresClient.Configuration { PostgresEnvironment.configuration }

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
