import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import Testing

/// The hot statements (claim, completion, renewal) run as prepared statements: prepared once on a
/// connection, then only bound and executed. Each test uses a client with one connection, so what
/// `pg_prepared_statements` (a per-session view) shows is what the store prepared.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresPreparedStatementTests {
    static func withOneConnection<Result: Sendable>(_ body: (PostgresClient) async throws -> Result) async throws -> Result {
        var configuration = PostgresTestDatabase.configuration
        configuration.options.maximumConnections = 1
        return try await PostgresTestDatabase.withClient(configuration, body)
    }

    /// The store's prepared statements on the client's one connection, with how often each ran.
    static func prepared(on client: PostgresClient) async throws -> [String: String] {
        var statements: [String: String] = [:]
        let rows = try await client.query("SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'rq\\_%'")
        for try await (name, statement) in rows.decode((String, String).self) { statements[name] = statement }
        return statements
    }

    @Test func claimsCompletionsAndRenewalsArePreparedOnceAndReused() async throws {
        try await Self.withOneConnection { client in
            try await PostgresTestDatabase.withStore(on: client, label: "prep") { store in
                for index in 0..<5 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
                for round in 0..<5 {
                    let claim = try #require(try await store.claim(upTo: 1, now: at(Double(round)), lease: .seconds(30)).first)
                    let renewed = try await store.renew(claim, now: at(Double(round)), lease: .seconds(60))
                    try await store.complete(renewed, reason: .delivered(statusCode: 201))
                }
                #expect(try await store.queuedCount() == 0)
                let statements = try await Self.prepared(on: client)
                // One each: the claim, the renewal and the lone completion, whatever the rounds.
                #expect(statements.count == 3)
                #expect(statements.values.allSatisfy { $0.contains("\"\(store.tableName)\"") })
                #expect(statements.values.contains { $0.contains("FOR UPDATE OF q SKIP LOCKED") })
            }
        }
    }

    @Test func twoTablesOnOneConnectionEachGetTheirOwnStatements() async throws {
        try await Self.withOneConnection { client in
            try await PostgresTestDatabase.withStore(on: client, label: "prep") { first in
                try await PostgresTestDatabase.withStore(on: client, label: "prep") { second in
                    for store in [first, second] {
                        _ = try await store.add(entry(request("/a")), limit: nil)
                        let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
                        try await store.complete(claim, reason: .delivered(statusCode: 201))
                    }
                    #expect(try await first.queuedCount() == 0)
                    #expect(try await second.queuedCount() == 0)
                    let statements = try await Self.prepared(on: client)
                    #expect(statements.values.filter { $0.contains("\"\(first.tableName)\"") }.count == 2)
                    #expect(statements.values.filter { $0.contains("\"\(second.tableName)\"") }.count == 2)
                }
            }
        }
    }

    /// postgres-nio keeps a failed preparation's error for the connection's lifetime: the store
    /// names its statements anew after a failure, so the table created later is claimed from.
    @Test func aStatementThatFailedBeforeTheTableExistedWorksOnceItDoes() async throws {
        try await Self.withOneConnection { client in
            try await PostgresTestDatabase.withStore(on: client, label: "prep", migrated: false) { store in
                await #expect(throws: PostgresQueueStoreError.self) {
                    _ = try await store.claim(upTo: 1, now: at(1), lease: .seconds(30))
                }
                try await store.migrate()
                _ = try await store.add(entry(request("/late")), limit: nil)
                let claim = try #require(try await store.claim(upTo: 1, now: at(1), lease: .seconds(30)).first)
                #expect(claim.entry.url.path == "/late")
                try await store.complete(claim, reason: .delivered(statusCode: 201))
                #expect(try await store.queuedCount() == 0)
            }
        }
    }

    @Test func withPreparedStatementsOffNothingIsPrepared() async throws {
        try await Self.withOneConnection { client in
            try await PostgresTestDatabase.withStore(on: client, label: "prep", configuration: .init(preparesStatements: false)) { store in
                for index in 0..<3 { _ = try await store.add(entry(request("/n\(index)")), limit: nil) }
                let claims = try await store.claim(upTo: 3, now: at(1), lease: .seconds(30))
                #expect(claims.count == 3)
                for claim in claims { try await store.complete(claim, reason: .delivered(statusCode: 201)) }
                #expect(try await store.queuedCount() == 0)
                #expect(try await Self.prepared(on: client).isEmpty)
            }
        }
    }
}
