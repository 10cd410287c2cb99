import Foundation
import PostgresNIO

extension PostgresQueueStore {
    /// Creates the store's tables, or brings them to this library's `schemaVersion`.
    ///
    /// Call it at every replica's start: it runs in one transaction under an advisory lock on the
    /// table's name, so replicas starting together migrate once, one after the other, and each
    /// finds the schema ready. The version is kept in `<table>_schema`.
    ///
    /// - Throws: `PostgresQueueStoreError.schemaTooNew(found:supported:)`, changing nothing, when
    ///   a newer library has migrated the table; `.database` when the database cannot be reached
    ///   or refuses (nothing is changed then either).
    public func migrate() async throws {
        let names = self.names
        let logger = self.logger
        try await transaction("migrate") { connection in
            try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\(names.plain + ":migrate"), 0))", logger: logger)
            try await connection.query(
                """
                CREATE TABLE IF NOT EXISTS \(unescaped: names.schema) (
                    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                    version integer NOT NULL
                )
                """, logger: logger)
            var found = 0
            for try await version in try await connection.query("SELECT version FROM \(unescaped: names.schema)", logger: logger).decode(Int32.self) {
                found = Int(version)
            }
            guard found <= Self.schemaVersion else {
                throw PostgresQueueStoreError.schemaTooNew(found: found, supported: Self.schemaVersion)
            }
            guard found < Self.schemaVersion else { return }
            for version in (found + 1)...Self.schemaVersion {
                for statement in Self.migration(to: version, names) {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
            }
            try await connection.query(
                """
                INSERT INTO \(unescaped: names.schema) (singleton, version) VALUES (true, \(Int32(Self.schemaVersion)))
                ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version
                """, logger: logger)
        }
    }

    /// The statements that take the schema from `version - 1` to `version`.
    static func migration(to version: Int, _ names: TableNames) -> [String] {
        switch version {
        case 1:
            return [
                "CREATE SEQUENCE IF NOT EXISTS \(names.sequence) AS bigint",
                // `entry` is the QueueEntry's JSON; the other columns are what claims search on, kept
                // in step with it by every write.
                """
                CREATE TABLE IF NOT EXISTS \(names.queue) (
                    id uuid PRIMARY KEY,
                    seq bigint NOT NULL UNIQUE,
                    priority integer NOT NULL,
                    ordering_key text,
                    coalescing_key text,
                    next_attempt_at timestamptz,
                    expires_at timestamptz NOT NULL,
                    lease_token uuid,
                    lease_until timestamptz,
                    entry jsonb NOT NULL
                )
                """,
                // Dropping the queue table drops its sequence.
                "ALTER SEQUENCE \(names.sequence) OWNED BY \(names.queue).seq",
                "CREATE INDEX IF NOT EXISTS \(names.index("claim_order")) ON \(names.queue) (priority DESC, seq)",
                "CREATE INDEX IF NOT EXISTS \(names.index("ordering")) ON \(names.queue) (ordering_key, seq) WHERE ordering_key IS NOT NULL",
                "CREATE INDEX IF NOT EXISTS \(names.index("coalescing")) ON \(names.queue) (coalescing_key, seq) WHERE coalescing_key IS NOT NULL",
                "CREATE INDEX IF NOT EXISTS \(names.index("next_attempt")) ON \(names.queue) (next_attempt_at) WHERE next_attempt_at IS NOT NULL",
                "CREATE INDEX IF NOT EXISTS \(names.index("expires")) ON \(names.queue) (expires_at)",
                """
                CREATE TABLE IF NOT EXISTS \(names.deadLetter) (
                    id uuid PRIMARY KEY,
                    seq bigint NOT NULL,
                    dead_lettered_at timestamptz NOT NULL DEFAULT now(),
                    entry jsonb NOT NULL
                )
                """,
            ]
        default:
            return []
        }
    }
}
