import Logging
import PostgresNIO
import Synchronization

/// The store's hot statements — a claim, a batch of settlements, a batch of renewals — run as
/// prepared statements: parsed, analysed and planned once per connection, then only bound and
/// executed (PostgreSQL planned the claim in more time than it ran it).
///
/// postgres-nio names a prepared statement, and gives its SQL, through static members of the
/// statement's type, while the store's SQL names a table chosen at run time. This type therefore
/// takes both from a task-local value that `PostgresQueueStore.hotRows(_:)` binds around the one
/// call that reads them (`PostgresClient.execute`, which reads them in the caller's task before
/// anything goes to the connection). Outside that scope the name and SQL are empty, so a read
/// elsewhere would fail as a database error, never touch another statement.
struct HotStatement: PostgresPreparedStatement {
    typealias Row = PostgresRow

    /// One statement's name and SQL, for the call in progress.
    struct Text: Sendable {
        let name: String
        let sql: String
    }

    @TaskLocal static var current: Text?

    static var name: String { current?.name ?? "" }
    static var sql: String { current?.sql ?? "" }

    let bindings: PostgresBindings

    func makeBindings() throws -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
}

/// The generation in the names of a store's prepared statements. postgres-nio keeps a failed
/// preparation's error for the connection's lifetime (the table was missing then, say); any
/// failure of a prepared statement moves the store to the next generation, so the next call
/// prepares the statement afresh under a new name instead of meeting the old error.
final class StatementGeneration: Sendable {
    private let value = Atomic<Int>(0)

    var current: Int { value.load(ordering: .relaxed) }

    func advance(from seen: Int) {
        _ = value.compareExchange(expected: seen, desired: seen + 1, ordering: .relaxed)
    }
}

extension PostgresQueueStore {
    /// The rows `query` returns, run as a prepared statement when
    /// `Configuration.preparesStatements` (the default), as a plain one otherwise. The statement's
    /// name is derived from its SQL (which holds the table's name; values are bound, never in the
    /// text), so one name always means one text on a connection.
    func hotRows(_ query: PostgresQuery) async throws -> [PostgresRow] {
        guard configuration.preparesStatements else {
            var rows: [PostgresRow] = []
            for try await row in try await client.query(query, logger: logger) { rows.append(row) }
            return rows
        }
        let generation = statementGeneration.current
        let text = HotStatement.Text(name: Self.statementName(query.sql, generation: generation), sql: query.sql)
        do {
            return try await HotStatement.$current.withValue(text) {
                var rows: [PostgresRow] = []
                for try await row in try await client.execute(HotStatement(bindings: query.binds), logger: logger) { rows.append(row) }
                return rows
            }
        } catch {
            statementGeneration.advance(from: generation)
            throw error
        }
    }

    /// `rq_<64-bit FNV-1a of the SQL, hex>_<generation>`: short of PostgreSQL's 63-byte names.
    static func statementName(_ sql: String, generation: Int) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in sql.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return "rq_" + String(repeating: "0", count: 16 - hex.count) + hex + "_\(generation)"
    }
}
