// The outbox recipe of Docs/Integrations.md, verbatim between the markers; `.ci/run` checks that
// the document shows exactly these lines, compiles them, and runs them against the PostgreSQL it
// starts (main.swift, `runOutboxRecipe`).
// Left as the document shows it (its comments aligned), so swift-format does not touch it:
// swift-format-ignore-file

// outbox:begin
import Logging
import PostgresNIO
import Resilience          // OfflineQueueEngine, QueueableRequest, AsyncRequestEngine
import ResiliencePostgres  // PostgresQueueStore

/// The call a service owes a partner once an order is saved.
struct OrderPlaced: QueueableRequest {
    let orderID: UUID
    let customerID: UUID
    let partner: URL
    var url: URL { partner.appendingPathComponent("hooks/orders") }
    var method: HTTPMethod { .post }
    var body: Data? { Data(#"{"order":"\#(orderID)","customer":"\#(customerID)"}"#.utf8) }
    var idempotencyKey: String { "order-placed-\(orderID)" }  // the partner's effect happens once
    var orderingKey: String? { "customer-\(customerID)" }     // per customer, in the order placed
}

/// What every replica of the service keeps: the table, and the engine that drains it.
struct Outbox: Sendable {
    let store: PostgresQueueStore
    let queue: OfflineQueueEngine

    /// At start-up, on every replica: `migrate()` is safe to run from all of them at once.
    init(postgres: PostgresClient, sender: some RequestSending) async throws {
        store = try PostgresQueueStore(client: postgres, tableName: "partner_outbox")
        try await store.migrate()
        queue = OfflineQueueEngine(
            requestEngine: sender,
            reachabilityMonitor: ManualReachabilityMonitor(),  // a server: always connected
            store: store
        )
        await queue.start()  // or run OfflineQueueLifecycleService(queue) in the ServiceGroup
    }

    /// In a request handler: the order and the call owed for it commit together, or neither does.
    func placeOrder(_ id: UUID, customer: UUID, total: Int, partner: URL, postgres: PostgresClient, logger: Logger) async throws {
        try await postgres.withTransaction(logger: logger) { connection in
            try await connection.query("INSERT INTO orders (id, customer, total) VALUES (\(id), \(customer), \(total))", logger: logger)
            _ = try await store.enqueue(OrderPlaced(orderID: id, customerID: customer, partner: partner), on: connection)
        }
    }
}
// outbox:end
