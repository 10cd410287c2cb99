import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres

/// `enqueue`: the service's front door. It adds `--count` entries (`ReplicaEntry`) to the table,
/// alternately through an `OfflineQueueEngine`'s `enqueue(_:sending: .onNextDrain)` and through the
/// outbox (`PostgresQueueStore.enqueue(_:on:)` in a transaction of its own), from `--workers` tasks
/// that each own a share of the ordering keys (so each key's entries are added one after another,
/// in order). It prints `ACK …` for each entry once its write has committed, and exits 0 when all
/// are in; any failure ends it with a non-zero status.
enum EnqueueCommand {
    static func run(_ arguments: ReplicaArguments) async throws {
        let tableName = try arguments.tableName()
        let origin = try arguments.url("origin")
        let count = try arguments.integer("count", default: 10_000, minimum: 1)
        let keys = try arguments.integer("keys", default: 200)
        let workers = try arguments.integer("workers", default: 4, minimum: 1)
        let run = arguments.string("run", default: String(UUID().uuidString.prefix(8)).lowercased())
        let via = arguments.string("via", default: "mixed")
        guard ["mixed", "engine", "outbox"].contains(via) else { throw UsageError("--via takes mixed, engine or outbox, found \(via)") }
        try await ReplicaDatabase.withClient { client in
            let store = try PostgresQueueStore(client: client, tableName: tableName)
            try await DrainCommand.migrate(store)
            // Never started and never sending: it only stores (the replicas deliver).
            let engine = OfflineQueueEngine(
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: store, maxQueueSize: .max)
            let logger = Logger(label: "postgres-queue-replica")
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<workers {
                    group.addTask {
                        for number in 0..<count where ((keys > 0 ? number % keys : number) % workers) == worker {
                            let entry = ReplicaEntry(number: number, keys: keys, run: run)
                            let request = entry.request(origin: origin)
                            if via == "engine" || (via == "mixed" && number.isMultiple(of: 2)) {
                                _ = try await engine.enqueue(request, sending: .onNextDrain)
                            } else {
                                _ = try await client.withTransaction(logger: logger) { connection in
                                    try await store.enqueue(request, on: connection)
                                }
                            }
                            emit(entry.acknowledgement)
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
    }
}
