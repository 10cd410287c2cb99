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
enum BenchCommand {
    static func run(_ arguments: ReplicaArguments) async throws {
        let replicaCounts = try arguments.integers("replicas", default: [1, 2, 4])
        let entries = try arguments.integer("entries", default: 5_000, minimum: 1)
        let keys = try arguments.integer("keys", default: 0)
        let rounds = try arguments.integer("rounds", default: 3, minimum: 1)
        let lease = try arguments.integer("lease-ms", default: 2_000, minimum: 3)
        let poll = try arguments.integer("poll-ms", default: 500, minimum: 1)
        let origin = try BenchOrigin()
        let configurations: [Int?] = [nil] + replicaCounts.map { $0 }  // nil: the disk queue
        log("bench: \(entries) entries, \(keys == 0 ? "no ordering keys" : "\(keys) ordering keys"), \(rounds) rounds, lease \(lease) ms")

        let (seconds, drained) = try await ReplicaDatabase.withClient { client in
            var seconds: [String: [Double]] = [:]
            var drained: [String: [Double]] = [:]
            for round in 0..<rounds {
                // Rotated each round, so no configuration always runs first or last.
                let shift = round % configurations.count
                for replicas in configurations[shift...] + configurations[..<shift] {
                    let run = "r\(round)-\(replicas.map(String.init) ?? "disk")-\(UUID().uuidString.prefix(8))"
                    let requests = (0..<entries).map { ReplicaEntry(number: $0, keys: keys, run: run).request(origin: origin.baseURL) }
                    origin.reset()
                    let name = replicas.map { "postgres, \($0) replica\($0 == 1 ? "" : "s")" } ?? "disk replay"
                    let time: (effects: Duration, drained: Duration)
                    if let replicas {
                        time = try await replicaRun(replicas, requests: requests, client: client, origin: origin, lease: lease, poll: poll)
                    } else {
                        time = try await diskRun(requests: requests, origin: origin)
                    }
                    let rate = Double(entries) / time.effects.seconds
                    seconds[name, default: []].append(time.effects.seconds)
                    drained[name, default: []].append(time.drained.seconds)
                    log(
                        "round \(round + 1): \(name): \(format(rate)) deliveries/s (\(format(time.effects.seconds, 2)) s to the last effect, "
                            + "\(format(time.drained.seconds, 2)) s to an empty queue; \(origin.duplicates) duplicates)")
                }
            }
            return (seconds, drained)
        }

        emit("| Configuration | Deliveries/s, median (range) | Median time to the last effect | Median time to an empty queue |")
        emit("| --- | --- | --- | --- |")
        for replicas in configurations {
            let name = replicas.map { "postgres, \($0) replica\($0 == 1 ? "" : "s")" } ?? "disk replay"
            let times = seconds[name, default: []].sorted()
            let rates = times.map { Double(entries) / $0 }.sorted()
            guard let slowest = rates.first, let fastest = rates.last else { continue }
            emit(
                "| \(name) | \(format(median(rates))) (\(format(slowest))–\(format(fastest))) | \(format(median(times), 2)) s "
                    + "| \(format(median(drained[name, default: []].sorted()), 2)) s |")
        }
    }

    /// Times `replicas` replicas delivering `requests`, added in one outbox transaction.
    static func replicaRun(
        _ replicas: Int, requests: [QueuedRequest], client: PostgresClient, origin: BenchOrigin, lease: Int, poll: Int
    ) async throws -> (effects: Duration, drained: Duration) {
        let table = "bench_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        let store = try PostgresQueueStore(client: client, tableName: table)
        try await store.migrate()
        var children: [ChildReplica] = []
        do {
            for _ in 0..<replicas {
                children.append(try await ChildReplica.start(table: table, leaseMilliseconds: lease, pollMilliseconds: poll))
            }
            let logger = Logger(label: "postgres-queue-replica")
            try await client.withTransaction(logger: logger) { connection in
                for request in requests { _ = try await store.enqueue(request, on: connection) }
            }
            let committed = ContinuousClock.now
            await origin.waitForEffects(requests.count)
            let effects = ContinuousClock.now - committed
            while try await store.queuedCount() > 0 { try await Task.sleep(for: .milliseconds(2)) }
            let drained = ContinuousClock.now - committed
            for child in children { await child.kill() }
            try await ReplicaDatabase.drop(table, on: client)
            return (effects, drained)
        } catch {
            for child in children { await child.kill() }
            try? await ReplicaDatabase.drop(table, on: client)
            throw error
        }
    }

    /// Times one `flush()` of a disk queue holding `requests`.
    static func diskRun(requests: [QueuedRequest], origin: BenchOrigin) async throws -> (effects: Duration, drained: Duration) {
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
            requestEngine: AsyncRequestEngine(session: AsyncHTTPClientSession()),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: folder),
            maxQueueSize: .max)
        let report = await queue.flush()
        let time = ContinuousClock.now - start
        guard report.delivered.count == requests.count, report.remaining == 0, origin.effects == requests.count else {
            throw UsageError("the disk replay delivered \(report.delivered.count) of \(requests.count) (\(report.remaining) left)")
        }
        return (time, time)
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
