import Foundation
import OfflineQueue
import PostgresNIO
import ResiliencePostgres
import ResilienceTesting
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Issue 29's replica test (and issue 49's, at 32 deliveries in flight per replica): four
/// `postgres-queue-replica drain` processes deliver one table to a loopback origin while a fifth
/// process enqueues 10 000 entries over 200 ordering keys, and
/// replicas are SIGKILLed 20 times at random moments and restarted. Every acknowledged entry must
/// reach the origin, each idempotency key must have exactly one effect there, no ordering key may
/// see an entry's first effect before an earlier entry's, and the table must end empty.
@Suite(.postgresReachable, .serialized, .timeLimit(.minutes(5)))
struct PostgresReplicaKillTests {
    static let entries = 10_000
    static let orderingKeys = 200
    static let replicas = 4
    static let kills = 20
    /// The lease the replicas claim under: a killed replica's entry is claimed again this long
    /// after its last renewal.
    static let leaseMilliseconds = 2_000
    /// How long the origin takes to answer each request: a replica spends most of its time in this
    /// window, between an effect and its answer, where a kill makes a duplicate.
    static let responseDelay: Duration = .milliseconds(10)
    /// The longest the whole run may take before the test fails (it takes 70–120 s in a debug build
    /// on 2 cores, most of it the enqueue process's).
    static let deadline: Duration = .seconds(240)

    /// At `maxConcurrentDeliveries` 1 (each replica sends one entry at a time) and 32 (issue 49:
    /// each replica has up to 32 entries in flight, one per ordering key).
    @Test(arguments: [1, 32])
    func testEveryAcknowledgedEntryIsDeliveredOnceAndInOrderThroughTwentySIGKILLs(deliveries: Int) async throws {
        let binary = try #require(
            ReplicaProcess.binary, "postgres-queue-replica is not beside the test bundle: build with `swift build --build-tests --package-path Integrations`")
        let seed = ProcessInfo.processInfo.environment["RESILIENCE_REPLICA_SEED"].flatMap(UInt64.init) ?? 29
        let origin = try DeduplicatingOrigin(responseDelay: Self.responseDelay)
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("replica-kill-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let table = PostgresTestDatabase.uniqueTableName("replica_kill")
        let started = ContinuousClock.now

        try await PostgresTestDatabase.withClient { client in
            let store = try PostgresQueueStore(client: client, tableName: table)
            try await store.migrate()
            let fleet = ReplicaFleet(binary: binary, table: table, folder: folder, leaseMilliseconds: Self.leaseMilliseconds, deliveries: deliveries)
            let enqueuer: ReplicaProcess
            do {
                for slot in 0..<Self.replicas { try await fleet.start(slot) }
                enqueuer = try ReplicaProcess(
                    binary: binary,
                    arguments: [
                        "enqueue", "--table", table, "--origin", origin.baseURL.absoluteString, "--count", "\(Self.entries)",
                        "--keys", "\(Self.orderingKeys)",
                    ],
                    outputURL: folder.appendingPathComponent("enqueue.log"))
            } catch {
                await fleet.killAll()
                try? await PostgresTestDatabase.drop(table, on: client)
                throw error
            }

            // The kills: at seeded random moments of the delivery (each when the origin has seen a
            // random share of the entries, then a random few milliseconds more), a random replica
            // is SIGKILLed and another started in its place at once.
            let killer = Task {
                await fleet.killAtRandomMoments(count: Self.kills, seed: seed, replicas: Self.replicas, entries: Self.entries) { count in
                    await origin.waitForEffects(atLeast: count)
                }
            }

            var outcome = RunOutcome()
            do {
                // Done when the enqueue process has ended, the kills are over, the origin has an
                // effect for every acknowledged entry and the table is empty; failed when the
                // deadline passes first. The state read here is other processes' (their exits,
                // their deletions in PostgreSQL, which send no event), so it is read again every
                // 100 ms; the kills above wait on the origin's own events.
                while true {
                    if enqueuer.hasExited, outcome.acknowledged.isEmpty {
                        outcome.acknowledged = Self.acknowledgements(in: enqueuer.output)
                        outcome.enqueueDuration = ContinuousClock.now - started
                        outcome.effectsWhenEnqueued = origin.effectCount
                    }
                    if enqueuer.hasExited, await enqueuer.exited() != .status(0) { break }  // failed: reported below
                    if enqueuer.hasExited, await fleet.killsAreOver, origin.effectCount >= outcome.acknowledged.count, try await store.queuedCount() == 0 {
                        break
                    }
                    if ContinuousClock.now - started > Self.deadline {
                        outcome.timedOut = true
                        break
                    }
                    try await Task.sleep(for: .milliseconds(100))
                }
                killer.cancel()
                await killer.value
                outcome.kills = await fleet.kills
                outcome.duration = ContinuousClock.now - started
                outcome.remainingRows = try await store.queuedEntries()
                outcome.deadLetters = try await store.deadLetters().count
                let enqueueExit = await enqueuer.kill()  // its exit status; killed only if the deadline passed
                #expect(enqueueExit == .status(0), "the enqueue process ended with \(enqueueExit):\n\(enqueuer.tail())")
                #expect(outcome.acknowledged.count == Self.entries)
            } catch {
                killer.cancel()
                await fleet.killAll()
                await enqueuer.kill()
                try? await PostgresTestDatabase.drop(table, on: client)
                throw error
            }
            let logs = await fleet.killAll()
            try await PostgresTestDatabase.drop(table, on: client)

            let effects = origin.effects
            let missing = outcome.acknowledged.filter { effects[$0.key] == nil }
            let mismatched = outcome.acknowledged.filter { acknowledged in effects[acknowledged.key].map { $0 != acknowledged.value } ?? false }
            let unacknowledged = effects.keys.filter { outcome.acknowledged[$0] == nil }
            print(
                """
                replica test: \(outcome.acknowledged.count) acknowledged entries over \(Self.orderingKeys) ordering keys, \
                \(Self.replicas) replicas at \(deliveries) in flight each, \(outcome.kills) SIGKILLs (seed \(seed)), lease \(Self.leaseMilliseconds) ms: \
                \(effects.count) effects, \(origin.duplicates) duplicate deliveries absorbed by the origin, \
                \(origin.violations.count) order violations, \(missing.count) missing, \(outcome.remainingRows.count) rows left, \
                in \(Self.seconds(outcome.duration)) (the enqueue process done after \(Self.seconds(outcome.enqueueDuration)), \
                with \(outcome.effectsWhenEnqueued) effects by then); the replicas' own reports: \(Self.replicaReports(in: folder))
                """)
            let failed = outcome.timedOut || !missing.isEmpty || !outcome.remainingRows.isEmpty || !origin.violations.isEmpty
            if failed {
                print("replica test: the last lines of each replica's output (all of it in \(folder.path)):\n\(logs)")
            }
            #expect(!outcome.timedOut, "not done within \(Self.deadline): \(effects.count) of \(outcome.acknowledged.count) effects")
            #expect(missing.isEmpty, "\(missing.count) acknowledged entries never reached the origin, e.g. \(missing.prefix(5).map(\.key))")
            #expect(mismatched.isEmpty, "\(mismatched.count) effects differ from what was acknowledged")
            #expect(unacknowledged.isEmpty, "\(unacknowledged.count) effects of entries never acknowledged")
            #expect(effects.count == outcome.acknowledged.count)
            #expect(origin.violations.isEmpty, "out of order: \(origin.violations.prefix(10))")
            #expect(outcome.remainingRows.isEmpty, "rows left in the table: \(outcome.remainingRows.prefix(5).map { "\($0.orderingKey ?? "-") attempts \($0.attempts)" })")
            #expect(outcome.deadLetters == 0)
            #expect(outcome.kills == Self.kills)
            if !failed { try? FileManager.default.removeItem(at: folder) }
        }
    }

    /// What the run found, for the checks after it.
    struct RunOutcome {
        var acknowledged: [String: DeduplicatingOrigin.Effect] = [:]
        var kills = 0
        var timedOut = false
        var duration: Duration = .zero
        var enqueueDuration: Duration = .zero
        var effectsWhenEnqueued = 0
        var remainingRows: [QueueEntry] = []
        var deadLetters = 0
    }

    /// How many attempts the replicas' logs (every incarnation's) report as not delivered, by kind.
    static func replicaReports(in folder: URL) -> String {
        let files = (try? FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)) ?? []
        var counts: [String: Int] = [:]
        for file in files where file.lastPathComponent.hasPrefix("drain-") {
            let text = (try? String(contentsOf: file, encoding: .utf8)) ?? ""
            for line in text.split(separator: "\n") where !line.hasPrefix("READY") {
                counts[String(line.prefix { $0 != ":" }), default: 0] += 1
            }
        }
        guard !counts.isEmpty else { return "every attempt delivered" }
        return counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
    }

    static func seconds(_ duration: Duration) -> String {
        duration.formatted(.units(allowed: [.seconds], fractionalPart: .show(length: 1)))
    }

    /// The enqueue process's `ACK <idempotency key> <ordering key> <index>` lines.
    static func acknowledgements(in output: String) -> [String: DeduplicatingOrigin.Effect] {
        var acknowledged: [String: DeduplicatingOrigin.Effect] = [:]
        for line in output.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count == 4, fields[0] == "ACK", let index = Int(fields[3]) else { continue }
            acknowledged[String(fields[1])] = DeduplicatingOrigin.Effect(orderingKey: String(fields[2]), index: index)
        }
        return acknowledged
    }
}

/// The drain replicas, one per slot: killed, restarted, and all killed at the end.
actor ReplicaFleet {
    let binary: URL
    let table: String
    let folder: URL
    let leaseMilliseconds: Int
    /// Each replica's `maxConcurrentDeliveries`.
    let deliveries: Int
    private var running: [Int: ReplicaProcess] = [:]
    private var incarnations: [Int: Int] = [:]
    /// How many replicas were SIGKILLed.
    private(set) var kills = 0
    /// Whether `killAtRandomMoments` has ended.
    private(set) var killsAreOver = false

    init(binary: URL, table: String, folder: URL, leaseMilliseconds: Int, deliveries: Int) {
        self.binary = binary
        self.table = table
        self.folder = folder
        self.leaseMilliseconds = leaseMilliseconds
        self.deliveries = deliveries
    }

    /// Starts a replica in `slot`.
    func start(_ slot: Int) throws {
        let incarnation = incarnations[slot, default: 0]
        incarnations[slot] = incarnation + 1
        running[slot] = try ReplicaProcess(
            binary: binary,
            arguments: ["drain", "--table", table, "--lease-ms", "\(leaseMilliseconds)", "--poll-ms", "500", "--deliveries", "\(deliveries)"],
            outputURL: folder.appendingPathComponent("drain-\(slot)-\(incarnation).log"))
    }

    /// SIGKILLs the replica in `slot`, waits for it to die, and starts another there.
    func killAndRestart(_ slot: Int) async throws {
        if let replica = running[slot] {
            let exit = await replica.kill()
            kills += 1
            if exit != .signal(SIGKILL) {
                Issue.record("replica \(slot) had ended before its kill: \(exit)\n\(replica.tail())")
            }
        }
        try start(slot)
    }

    /// SIGKILLs `count` replicas, each at a seeded random moment of the delivery — once `progress`
    /// says the origin's effects have passed a random share of `entries`, then a random few milliseconds
    /// more — and starts another in its slot at once. Ends early when cancelled or when a replica
    /// cannot be started; `killsAreOver` then, however it ends.
    func killAtRandomMoments(count: Int, seed: UInt64, replicas: Int, entries: Int, progress: @Sendable (Int) async -> Void) async {
        defer { killsAreOver = true }
        var generator = SplitMix64(seed: seed)
        let moments = (0..<count).map { _ in Double.random(in: 0.02...0.95, using: &generator) }.sorted()
        for moment in moments {
            await progress(Int(moment * Double(entries)))
            guard !Task.isCancelled else { return }
            do { try await Task.sleep(for: .milliseconds(Int.random(in: 0...50, using: &generator))) } catch { return }
            do {
                try await killAndRestart(Int.random(in: 0..<replicas, using: &generator))
            } catch {
                Issue.record("a replica could not be started again: \(error)")
                return
            }
        }
    }

    /// Kills every replica; returns the last lines of each one's output.
    @discardableResult
    func killAll() async -> String {
        var logs = ""
        for (slot, replica) in running.sorted(by: { $0.key < $1.key }) {
            await replica.kill()
            logs += "--- replica \(slot):\n\(replica.tail())\n"
        }
        running = [:]
        return logs
    }
}
