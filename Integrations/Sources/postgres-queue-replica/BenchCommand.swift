import Foundation
import Logging
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResilienceAsyncHTTPClient
import ResiliencePostgres

/// `bench`: deliveries per second of 1, 2, 4… `drain` replicas on one table, beside the disk
/// queue's replay, against one origin in this process (`BenchOrigin`), in interleaved rounds.
///
/// - A replica run starts the replicas on an empty table and waits until each is ready, then adds
///   `--entries` entries in one transaction through the outbox (one `NOTIFY` at its commit); the
///   clock runs from that commit until the origin has an effect for every entry (and, reported
///   beside it, until the table is empty: the last completion has committed).
/// - The disk run stores the same entries in a `DiskQueueStore` folder first, then opens it with a
///   new engine and times one `flush()`, through the same `AsyncRequestEngine` over
///   AsyncHTTPClient.
///
/// With `--keys N` the entries have N ordering keys (`ReplicaEntry`); 0 (the default) gives none.
/// `--deliveries 1,16,64` runs every configuration at each `maxConcurrentDeliveries`;
/// `--latency-ms M` makes the origin answer M ms after each request. Where PostgreSQL has
/// `pg_stat_statements` loaded (Scripts/postgres.sh loads it), the statements the replicas ran on
/// the run's table are counted from the outbox commit to the empty table (each statement is one
/// round trip: postgres-nio sends a statement's parse, bind and execute in one flight).
enum BenchCommand {
    static func run(_ arguments: ReplicaArguments) async throws {
        let replicaCounts = try arguments.integers("replicas", default: [1, 2, 4])
        let deliveryCounts = try arguments.integers("deliveries", default: [1])
        let entries = try arguments.integer("entries", default: 5_000, minimum: 1)
        let keys = try arguments.integer("keys", default: 0)
        let rounds = try arguments.integer("rounds", default: 3, minimum: 1)
        let lease = try arguments.integer("lease-ms", default: 2_000, minimum: 3)
        let poll = try arguments.integer("poll-ms", default: 500, minimum: 1)
        let latency = try arguments.integer("latency-ms", default: 0)
        let origin = try BenchOrigin(latency: .milliseconds(latency))
        // nil replicas: the disk queue; each at every `--deliveries` value.
        let configurations: [Configuration] = deliveryCounts.flatMap { deliveries in
            ([nil] + replicaCounts.map { $0 }).map { Configuration(replicas: $0, deliveries: deliveries) }
        }
        log(
            "bench: \(entries) entries, \(keys == 0 ? "no ordering keys" : "\(keys) ordering keys"), origin latency \(latency) ms, "
                + "\(rounds) rounds, lease \(lease) ms")

        let results = try await ReplicaDatabase.withClient { client in
            let statistics = await StatementStatistics.available(on: client)
            if !statistics { log("pg_stat_statements is not loaded: statements per delivery are not counted") }
            var results: [Configuration: [Run]] = [:]
            for round in 0..<rounds {
                // Rotated each round, so no configuration always runs first or last.
                let shift = round % configurations.count
                for configuration in configurations[shift...] + configurations[..<shift] {
                    let run = "r\(round)-\(configuration.replicas.map(String.init) ?? "disk")-\(UUID().uuidString.prefix(8))"
                    let requests = (0..<entries).map { ReplicaEntry(number: $0, keys: keys, run: run).request(origin: origin.baseURL) }
                    origin.reset()
                    let result: Run
                    if let replicas = configuration.replicas {
                        result = try await replicaRun(
                            replicas, deliveries: configuration.deliveries, requests: requests, client: client, origin: origin, lease: lease, poll: poll,
                            statistics: statistics)
                    } else {
                        result = try await diskRun(requests: requests, origin: origin, deliveries: configuration.deliveries)
                    }
                    results[configuration, default: []].append(result)
                    let rate = Double(entries) / result.effects.seconds
                    log(
                        "round \(round + 1): \(configuration.name): \(format(rate)) deliveries/s (\(format(result.effects.seconds, 2)) s to the last effect, "
                            + "\(format(result.drained.seconds, 2)) s to an empty queue; \(origin.duplicates) duplicates"
                            + "\(result.statements.map { ", \(format(Double($0) / Double(entries), 2)) statements a delivery" } ?? ""))")
                }
            }
            return results
        }

        emit("Origin latency \(latency) ms, \(entries) entries, \(keys == 0 ? "no ordering keys" : "\(keys) ordering keys"), \(rounds) rounds:")
        emit("")
        emit("| Configuration | N | Deliveries/s, median (range) | Little's-law bound (N × replicas ÷ latency) | Statements (round trips) a delivery | Median time to an empty queue |")
        emit("| --- | --- | --- | --- | --- | --- |")
        for configuration in configurations {
            let runs = results[configuration, default: []]
            let rates = runs.map { Double(entries) / $0.effects.seconds }.sorted()
            guard let slowest = rates.first, let fastest = rates.last else { continue }
            let inFlight = configuration.deliveries * (configuration.replicas ?? 1)
            let bound =
                latency == 0 ? "— (instant origin)" : "\(format(Double(inFlight) * 1_000 / Double(latency)))/s (\(format(median(rates) / (Double(inFlight) * 1_000 / Double(latency)) * 100)) %)"
            let statements = runs.compactMap(\.statements).map { Double($0) / Double(entries) }.sorted()
            emit(
                "| \(configuration.name) | \(configuration.deliveries) | \(format(median(rates))) (\(format(slowest))–\(format(fastest))) | \(bound) "
                    + "| \(statements.isEmpty ? "—" : format(median(statements), 2)) | \(format(median(runs.map(\.drained.seconds).sorted()), 2)) s |")
        }
    }

    struct Configuration: Hashable {
        /// nil: the disk queue.
        let replicas: Int?
        let deliveries: Int

        var name: String { replicas.map { "postgres, \($0) replica\($0 == 1 ? "" : "s")" } ?? "disk replay" }
    }

    struct Run {
        var effects: Duration
        var drained: Duration
        /// Statements the replicas ran on the table, from `pg_stat_statements`.
        var statements: Int?
    }

    /// Times `replicas` replicas delivering `requests`, added in one outbox transaction.
    static func replicaRun(
        _ replicas: Int, deliveries: Int, requests: [QueuedRequest], client: PostgresClient, origin: BenchOrigin, lease: Int, poll: Int, statistics: Bool
    ) async throws -> Run {
        let table = "bench_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        let store = try PostgresQueueStore(client: client, tableName: table)
        try await store.migrate()
        var children: [ChildReplica] = []
        do {
            for _ in 0..<replicas {
                children.append(try await ChildReplica.start(table: table, leaseMilliseconds: lease, pollMilliseconds: poll, deliveries: deliveries))
            }
            let logger = Logger(label: "postgres-queue-replica")
            try await client.withTransaction(logger: logger) { connection in
                for request in requests { _ = try await store.enqueue(request, on: connection) }
                // Counted from here: the replicas' statements (the inserts above are not theirs).
                if statistics { try await StatementStatistics.reset(on: connection) }
            }
            let committed = ContinuousClock.now
            await origin.waitForEffects(requests.count)
            let effects = ContinuousClock.now - committed
            var polls = 0
            while try await store.queuedCount() > 0 {
                polls += 1
                try await Task.sleep(for: .milliseconds(2))
            }
            let drained = ContinuousClock.now - committed
            polls += 1
            for child in children { await child.kill() }
            let statements = statistics ? try await StatementStatistics.calls(mentioning: table, on: client) - polls : nil
            try await ReplicaDatabase.drop(table, on: client)
            return Run(effects: effects, drained: drained, statements: statements)
        } catch {
            for child in children { await child.kill() }
            try? await ReplicaDatabase.drop(table, on: client)
            throw error
        }
    }

    /// Times one `flush()` of a disk queue holding `requests`.
    static func diskRun(requests: [QueuedRequest], origin: BenchOrigin, deliveries: Int) async throws -> Run {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("replica-bench-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        // Filled in a scope of its own, so that its store lets go of the folder before the replay opens it.
        try await {
            let filling = OfflineQueueEngine(
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: try DiskQueueStore(directory: folder), maxQueueSize: .max)
            for request in requests { _ = try await filling.enqueue(request, sending: .onNextDrain) }
        }()
        let start = ContinuousClock.now
        let queue = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: ReplicaRequests.session(connections: deliveries)),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: folder),
            maxQueueSize: .max,
            configuration: .init(maxConcurrentDeliveries: deliveries))
        let report = await queue.flush()
        let time = ContinuousClock.now - start
        guard report.delivered.count == requests.count, report.remaining == 0, origin.effects == requests.count else {
            throw UsageError("the disk replay delivered \(report.delivered.count) of \(requests.count) (\(report.remaining) left)")
        }
        return Run(effects: time, drained: time)
    }

    static func median(_ sorted: [Double]) -> Double {
        guard !sorted.isEmpty else { return 0 }
        let middle = sorted.count / 2
        return sorted.count.isMultiple(of: 2) ? (sorted[middle - 1] + sorted[middle]) / 2 : sorted[middle]
    }

    static func format(_ value: Double, _ digits: Int = 0) -> String {
        String(format: "%.\(digits)f", value)
    }
}

extension Duration {
    var seconds: Double {
        let (whole, fraction) = components
        return Double(whole) + Double(fraction) / 1e18
    }
}

/// `pg_stat_statements`, when the server loads it.
enum StatementStatistics {
    static func available(on client: PostgresClient) async -> Bool {
        let logger = Logger(label: "postgres-queue-replica")
        do {
            try await client.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", logger: logger)
            try await client.query("SELECT pg_stat_statements_reset()", logger: logger)
            return true
        } catch {
            return false
        }
    }

    static func reset(on connection: PostgresConnection) async throws {
        try await connection.query("SELECT pg_stat_statements_reset()", logger: Logger(label: "postgres-queue-replica"))
    }

    /// Executions since the last reset of statements whose text names `table`.
    static func calls(mentioning table: String, on client: PostgresClient) async throws -> Int {
        let rows = try await client.query(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE \("%" + table + "%")",
            logger: Logger(label: "postgres-queue-replica"))
        var total: Int64 = 0
        for try await value in rows.decode(Int64.self) { total = value }
        return Int(total)
    }
}
