import AsyncHTTPClient
import Foundation
import Logging
import PostgresNIO
import Resilience
import ResilienceAsyncHTTPClient
import ResiliencePostgres
import ResilienceTesting

/// Runs the outbox recipe (Outbox.swift) against the PostgreSQL named by `RESILIENCE_POSTGRES_URL`
/// (`.ci/run` starts one with Scripts/postgres.sh): an order whose transaction commits gets its
/// webhook delivered once, with its idempotency key; one whose transaction rolls back gets none,
/// and the outbox table is empty afterwards. Without the variable it says so and returns.
func runOutboxRecipe(logger: Logger) async throws {
    guard let url = ProcessInfo.processInfo.environment["RESILIENCE_POSTGRES_URL"].flatMap(URLComponents.init(string:)) else {
        print("integrations-example: outbox recipe compiled; not run (RESILIENCE_POSTGRES_URL is not set)")
        return
    }
    let configuration = PostgresClient.Configuration(
        host: url.host ?? "127.0.0.1", port: url.port ?? 5432, username: url.user ?? "postgres", password: url.password,
        database: String(url.path.drop { $0 == "/" }), tls: .disable)
    let postgres = PostgresClient(configuration: configuration)
    let partner = try LoopbackHTTPServer()
    defer { partner.shutdown() }
    partner.route("/hooks/orders", .status(201))

    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await postgres.run() }
        defer { group.cancelAll() }
        try await postgres.query("DROP TABLE IF EXISTS orders, partner_outbox, partner_outbox_dead_letter, partner_outbox_schema CASCADE", logger: logger)
        try await postgres.query("CREATE TABLE orders (id uuid PRIMARY KEY, customer uuid NOT NULL, total int NOT NULL)", logger: logger)

        let sender = AsyncRequestEngine(session: AsyncHTTPClientSession(client: AsyncHTTPClientSession.sharedClient))
        let outbox = try await Outbox(postgres: postgres, sender: sender)
        let results = await outbox.queue.results  // subscribed before the order is placed
        let placed = UUID()
        try await outbox.placeOrder(placed, customer: UUID(), total: 42, partner: partner.url("/"), postgres: postgres, logger: logger)
        struct Refused: Error {}
        do {
            try await postgres.withTransaction(logger: logger) { connection in
                let (order, customer) = (UUID(), UUID())
                try await connection.query("INSERT INTO orders (id, customer, total) VALUES (\(order), \(customer), 7)", logger: logger)
                _ = try await outbox.store.enqueue(OrderPlaced(orderID: order, customerID: customer, partner: partner.url("/")), on: connection)
                throw Refused()  // the order fails after the enqueue: neither is kept
            }
        } catch let error as PostgresTransactionError where error.closureError is Refused {}  // rolled back

        // The started queue delivers it at once (the enqueue's NOTIFY); 30 s only bounds a failure.
        let delivered = await withTaskGroup(of: Bool.self) { race in
            race.addTask {
                for await result in results {
                    if case .delivered = result { return true }
                }
                return false
            }
            race.addTask {
                try? await Task.sleep(for: .seconds(30))
                return false
            }
            defer { race.cancelAll() }
            return await race.next() ?? false
        }
        await outbox.queue.stop()
        let keys = partner.requestLog.map { $0.headers["idempotency-key"] ?? "-" }
        let left = try await outbox.store.queuedCount()
        guard delivered, keys == ["order-placed-\(placed)"], left == 0 else {
            throw RecipeFailed(description: "expected one webhook for the committed order and an empty table; got \(keys), \(left) left")
        }
        print("integrations-example: outbox recipe delivered 1 webhook (the rolled-back order's none); table empty")
        try await postgres.query("DROP TABLE IF EXISTS orders, partner_outbox, partner_outbox_dead_letter, partner_outbox_schema CASCADE", logger: logger)
    }
}

struct RecipeFailed: Error, CustomStringConvertible {
    let description: String
}
