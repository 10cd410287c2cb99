import Foundation
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResilienceAsyncHTTPClient
import ResiliencePostgres

/// `drain`: one replica of a service that delivers the table's entries. It migrates the table
/// (as every replica does at start), starts an `OfflineQueueEngine` over a `PostgresQueueStore` and
/// sends through `AsyncRequestEngine` over AsyncHTTPClient until it is killed, with up to
/// `--deliveries` entries in flight (`maxConcurrentDeliveries`, default 1). It prints `READY`
/// once started, and a line to standard error for each entry whose attempt did not deliver it.
enum DrainCommand {
    static func run(_ arguments: ReplicaArguments) async throws {
        let tableName = try arguments.tableName()
        let lease = Duration.milliseconds(try arguments.integer("lease-ms", default: 2_000, minimum: 3))
        let poll = Duration.milliseconds(try arguments.integer("poll-ms", default: 500, minimum: 1))
        let deliveries = try arguments.integer("deliveries", default: 1, minimum: 1)
        try await ReplicaDatabase.withClient { client in
            let store = try PostgresQueueStore(client: client, tableName: tableName)
            try await migrate(store)
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: ReplicaRequests.session(connections: deliveries)),
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
                store: store,
                configuration: .init(claimLease: lease, storagePollInterval: poll, maxConcurrentDeliveries: deliveries)
            )
            let results = await engine.results
            await engine.start()
            emit("READY \(getpid())")
            for await result in results {
                switch result {
                case .delivered: continue
                case .keptForRetry(let id, let error, let attempts, _): log("kept for retry: \(id) after \(attempts) attempts: \(error)")
                case .failedPermanently(let id, let status): log("failed permanently: \(id) (\(status.map(String.init) ?? "no response"))")
                case .expired(let id): log("expired: \(id)")
                case .deadLettered(let id, let attempts): log("dead-lettered: \(id) after \(attempts) attempts")
                }
            }
        }
    }

    /// `migrate()`, tried again for a few seconds while the database refuses (a replica may start
    /// while PostgreSQL is busy with the others).
    static func migrate(_ store: PostgresQueueStore) async throws {
        var attempt = 0
        while true {
            do {
                return try await store.migrate()
            } catch {
                attempt += 1
                guard attempt < 20 else { throw error }
                log("migrate failed (\(error)); trying again")
                try await Task.sleep(for: .milliseconds(250))
            }
        }
    }
}
