import Drainer
import Foundation
import OfflineQueue
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// The queue scenario: writers enqueue through `OfflineQueueEngine` on a `DiskQueueStore` (its
/// files on the simulation's disk), drained by the queue's own passes or by a `DrainService`
/// whose cycles a budget cuts short, while the device goes on and off line, the host fails, the
/// disk fails writes, fsyncs, renames and unlinks, and the app restarts between bursts of work
/// (engine and store dropped, the folder opened again) — or the power goes in the middle of one
/// (`SimulatedDisk.crash()`: what was not durable is lost). At the end the device is online for
/// good, the disk healthy, and the queue is flushed until it is empty.
///
/// Invariants: every acknowledged write reaches the origin, across crashes (for a coalescing
/// key, the origin ends with the newest acknowledged edit, or a newer one whose enqueue failed
/// after its file was written), none takes effect twice (one `Idempotency-Key` across attempts,
/// replays, restarts and crashes), acknowledged writes of one ordering key take effect in the
/// order they were enqueued, no entry file is found damaged on reopening, and the queue ends empty.
///
/// The concurrent-deliveries scenario runs the same workload on a queue with
/// `maxConcurrentDeliveries` drawn from 2...16 and four ordering keys, so that a pass has many
/// entries in flight at once; besides the invariants above, no two requests of one ordering key are
/// ever on the network at once (in either scenario; a request counts until it returns or its caller
/// cancels it: `SimulatedNetwork.mostInFlightByOrderingKey`).
struct QueueWorkload {
    let simulation: Simulation
    /// `maxConcurrentDeliveries` 1, or drawn from 2...16 (the concurrent-deliveries scenario).
    var concurrentDeliveries = false

    static let host = "api.sim"
    static let writers = 4
    static let bursts = 6
    static let writesPerBurst = 5
    static let coalescingKeys = 3
    var orderingKeys: Int { concurrentDeliveries ? 4 : 2 }

    private struct Written {
        var acknowledged: [String] = []
        var edits: Set<String> = []
        var newestEdit: [String: Int] = [:]
        var orderSequence: [String: Int] = [:]
        var acknowledgedSequences: [String: Set<Int>] = [:]
        var editVersion: [String: Int] = [:]
    }

    static let diskFaults = SimulatedDisk.Faults(write: 0.02, fsync: 0.02, rename: 0.02, unlink: 0.03, directorySync: 0.02)

    func run() async -> [String] {
        let simulation = simulation
        let folder = URL(fileURLWithPath: "/simulation/queue", isDirectory: true)
        simulation.network.setHost(
            Self.host,
            .init(
                latency: .milliseconds(5)...(.milliseconds(150)),
                faults: .init(refused: 0.05, resetBefore: 0.04, resetAfter: 0.05, timeout: 0.04, serverError: 0.06, throttled: 0.04)
            )
        )
        let written = Locked(Written())
        var violations: [String] = []
        let deliveries = concurrentDeliveries ? simulation.random(in: 2...16) : 1
        if concurrentDeliveries { simulation.record("maxConcurrentDeliveries \(deliveries)") }
        var engine: OfflineQueueEngine!
        do {
            engine = try makeEngine(folder, deliveries: deliveries)
        } catch {
            return ["the queue folder could not be opened: \(error)"]
        }
        // Half the runs drain the queue as a service does (`DrainService`: cycles on a timer and
        // on reconnect, each cut at a budget that cancels the request in flight), the other half
        // with the queue's own passes.
        let drains = simulation.chance(0.5)
        var drainer = await start(engine, drains: drains)
        for burst in 0..<Self.bursts {
            simulation.disk.faults = simulation.chance(0.5) ? Self.diskFaults : .none
            let crashes = simulation.chance(0.25)
            await burstOfWork(burst, engine: engine, written: written, crashing: crashes)
            if crashes || simulation.chance(0.5) {
                // The app restarts: everything in memory goes, the folder is opened again (after
                // a crash, from what the disk kept). In one process, the folder's lock goes with
                // the last reference to its store: a stopped queue holds nothing, so the store is
                // gone at once. (A pass its backoff timer had started ran on after `stop()` and
                // kept it for a minute or more; waiting up to 10 minutes of virtual time keeps the
                // run going to report it.)
                await drainer?.stop()
                drainer = nil
                await engine.stop()
                weak let oldStore = engine.disk
                engine = nil
                var waited = Duration.zero
                while oldStore != nil, waited < .seconds(600) {
                    try? await simulation.clock.sleep(for: .seconds(1))
                    waited += .seconds(1)
                }
                if waited > .seconds(1) {
                    violations.append("the stopped queue's store lived on for \(waited) after stop()\(oldStore != nil ? ", and still does" : "")")
                }
                if crashes { simulation.disk.restart() }
                guard let reopened = try? makeEngine(folder, deliveries: deliveries, reopening: true, violations: &violations) else { return violations }
                engine = reopened
                drainer = await start(reopened, drains: drains)
                simulation.record("restart: \(reopened.disk?.entryCount ?? 0) entries on disk, old store gone after \(waited)")
            }
        }
        // Online for good, a healthy host and disk: everything acknowledged must now reach the origin.
        simulation.disk.faults = .none
        simulation.network.setHost(Self.host, .init(latency: .milliseconds(5)...(.milliseconds(50))))
        if simulation.isOffline { await simulation.setOnline(true) }
        var rounds = 0
        while await engine.pendingCount() > 0, rounds < 30 {
            let report = await engine.flush(.ignoringReachability)
            simulation.record("final flush: \(report.delivered.count) delivered, \(report.remaining) remaining")
            rounds += 1
            if report.remaining > 0 { try? await simulation.clock.sleep(for: .seconds(300)) }
        }
        await drainer?.stop()
        await engine.stop()
        return violations + check(written.withLock { $0 }, pending: await engine.pendingCount())
    }

    /// Starts the queue's own passes, or a `DrainService` on it (`drains`).
    private func start(_ engine: OfflineQueueEngine, drains: Bool) async -> DrainService? {
        guard drains else {
            await engine.start()
            return nil
        }
        let drainer = DrainService(
            queue: engine,
            interval: .seconds(2),
            cycleBudget: simulation.random(in: .milliseconds(200)...(.seconds(2))),
            clock: simulation.clock
        )
        let reports = await drainer.reports
        Task {
            for await report in reports {
                simulation.record(
                    "drain cycle (\(report.trigger.rawValue)): \(report.delivered) delivered, \(report.remaining) remaining\(report.budgetExhausted ? ", budget exhausted" : "")"
                )
            }
        }
        await drainer.start()
        return drainer
    }

    /// Writers, connectivity flips and maybe a flush, all at once, and the power cut when
    /// `crashing`; returns when all are done.
    private func burstOfWork(_ burst: Int, engine: OfflineQueueEngine, written: Locked<Written>, crashing: Bool) async {
        let simulation = simulation
        await withTaskGroup(of: Void.self) { group in
            if crashing {
                group.addTask {
                    try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.seconds(3))))
                    simulation.disk.crash()
                }
            }
            group.addTask {
                // Connectivity flips during the burst.
                for _ in 0..<simulation.random(in: 0...3) {
                    try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(10)...(.seconds(2))))
                    await simulation.setOnline(simulation.isOffline)
                }
            }
            for writer in 0..<Self.writers {
                group.addTask {
                    for index in 0..<Self.writesPerBurst {
                        try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.milliseconds(500))))
                        await write(burst: burst, writer: writer, index: index, engine: engine, written: written)
                    }
                }
            }
            if simulation.chance(0.5) {
                group.addTask {
                    try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.seconds(2))))
                    let report = await engine.flush()
                    simulation.record("flush: \(report.delivered.count) delivered, \(report.remaining) remaining")
                }
            }
        }
    }

    private func makeEngine(_ folder: URL, deliveries: Int) throws -> OfflineQueueEngine {
        Self.makeQueue(on: try DiskQueueStore(directory: folder), over: simulation.makeRequestEngine(), in: simulation, deliveries: deliveries)
    }

    /// The scenarios' queue: on `store`, over `requestEngine`, retrying for ever with seeded backoff.
    static func makeQueue(on store: DiskQueueStore, over requestEngine: AsyncRequestEngine, in simulation: Simulation, deliveries: Int = 1) -> OfflineQueueEngine {
        OfflineQueueEngine(
            requestEngine: requestEngine,
            reachabilityMonitor: simulation.connectivity,
            store: store,
            maxQueueSize: 10_000,
            configuration: .init(
                retryPolicy: SeededRetryPolicy(simulation: simulation, maxRetries: .max, base: .milliseconds(500)),
                maxConcurrentDeliveries: deliveries
            ),
            clock: simulation.clock
        )
    }

    private func makeEngine(_ folder: URL, deliveries: Int, reopening: Bool, violations: inout [String]) throws -> OfflineQueueEngine {
        do {
            let engine = try makeEngine(folder, deliveries: deliveries)
            if let quarantined = engine.disk?.openReport.quarantined, !quarantined.isEmpty {
                violations.append("reopening quarantined \(quarantined.count) entry files")
            }
            return engine
        } catch {
            violations.append("reopening the queue folder failed: \(error)")
            throw error
        }
    }

    private func write(burst: Int, writer: Int, index: Int, engine: OfflineQueueEngine, written: Locked<Written>) async {
        let simulation = simulation
        let name = "w\(burst).\(writer).\(index)"
        var request = QueuedRequest(method: .put, url: URL(string: "https://\(Self.host)/docs/\(name)")!, idempotencyKey: "ik-\(name)")
        request.priority = simulation.pick(QueuePriority.allCases)
        request.body = Data("1".utf8)
        if simulation.chance(0.1) {
            await reprioritize(engine: engine)
            return
        }
        var edit: (key: String, version: Int)?
        switch simulation.random(in: 0...9) {
        case 0...3:
            // An edit of a document that coalesces: only the newest must reach the server.
            let key = "e\(simulation.random(in: 0...(Self.coalescingKeys - 1)))"
            let version = written.withLock { state -> Int in
                state.editVersion[key, default: 0] += 1
                return state.editVersion[key]!
            }
            request.url = URL(string: "https://\(Self.host)/docs/\(key)")!
            request.body = Data("\(version)".utf8)
            request.coalescingKey = key
            edit = (key, version)
        case 4...6:
            let key = "o\(simulation.random(in: 0...(orderingKeys - 1)))"
            let sequence = written.withLock { state -> Int in
                state.orderSequence[key, default: 0] += 1
                return state.orderSequence[key]!
            }
            request.method = .post
            request.orderingKey = key
            request.headers["X-Sim-Order"] = "\(key):\(sequence)"
        default:
            break
        }
        request.headers["X-Sim-Mutation"] = name
        do {
            let result = try await engine.enqueue(request, sending: simulation.chance(0.5) ? .atOnce : .onNextDrain)
            written.withLock { state in
                state.acknowledged.append(name)
                if let orderingKey = request.orderingKey, let sequence = request.headers["X-Sim-Order"]?.split(separator: ":").last.flatMap({ Int($0) }) {
                    state.acknowledgedSequences[orderingKey, default: []].insert(sequence)
                }
                if let edit {
                    state.edits.insert(name)
                    state.newestEdit[edit.key] = max(state.newestEdit[edit.key] ?? 0, edit.version)
                }
            }
            simulation.record("\(name)\(edit.map { " \($0.key)=\($0.version)" } ?? "") \(request.orderingKey ?? "") -> \(result.queuedID == nil ? "sent" : "queued")")
        } catch {
            simulation.record("\(name) -> not accepted: \(error)")
        }
    }

    /// The app moves a queued write to another priority (`DiskQueueStore.save` of the entry
    /// with its id and a new priority): it keeps its place, in its new priority's line. Edits of a
    /// coalescing key are left alone (saving one is a new edit of the key, by design).
    private func reprioritize(engine: OfflineQueueEngine) async {
        let candidates = await engine.items.filter { $0.coalescingKey == nil }
        guard !candidates.isEmpty else { return }
        let entry = simulation.pick(candidates)
        let priority = simulation.pick(QueuePriority.allCases.filter { $0.rawValue != entry.priority })
        var request = QueuedRequest(
            method: entry.httpMethod ?? .put,
            url: entry.url,
            headers: entry.headers,
            body: entry.body,
            timeout: entry.timeout,
            ttl: entry.ttl,
            priority: priority,
            idempotencyKey: entry.idempotencyKey,
            orderingKey: entry.orderingKey
        )
        request.deadline = entry.deadline
        do {
            try await engine.disk?.save(QueueEntry(request, id: entry.id, enqueuedAt: entry.enqueuedAt))
            simulation.record("\(entry.headers["X-Sim-Mutation"] ?? "?") moved to priority \(priority)")
        } catch {
            simulation.record("moving \(entry.headers["X-Sim-Mutation"] ?? "?") failed: \(error)")
        }
    }

    private func check(_ written: Written, pending: Int) -> [String] {
        var violations: [String] = []
        if pending > 0 { violations.append("\(pending) entries still queued after the final flushes") }
        let origin = simulation.origin
        for name in written.acknowledged {
            let effects = origin.effects(of: name)
            if effects > 1 { violations.append("write \(name) took effect \(effects) times") }
        }
        // An edit whose enqueue failed may still land (its file was written before the failure,
        // and is not taken back): the origin may end with a newer edit than the newest
        // acknowledged one, never an older.
        for (key, newest) in written.newestEdit where origin.version(of: key) < newest {
            violations.append("coalescing key \(key): the origin ends with edit \(origin.version(of: key)), the newest acknowledged is \(newest)")
        }
        // Acknowledged writes of an ordering key take effect in enqueue order (each once).
        for key in written.orderSequence.keys.sorted() {
            let acknowledged = written.acknowledgedSequences[key] ?? []
            let order = origin.appliedOrder(of: key).filter { acknowledged.contains($0) }
            if order != order.sorted() { violations.append("ordering key \(key) applied out of order: \(order)") }
        }
        // One entry of an ordering key in flight at a time, however many the queue sends at once.
        for (key, most) in simulation.network.mostInFlightByOrderingKey.sorted(by: { $0.key < $1.key }) where most > 1 {
            violations.append("ordering key \(key) had \(most) requests on the network at once")
        }
        simulation.record("most requests on the network at once: \(simulation.network.mostInFlight)")
        // Every acknowledged write that is not a coalescing edit (which a newer one may replace)
        // took effect.
        for name in written.acknowledged where !written.edits.contains(name) && origin.effects(of: name) == 0 {
            violations.append("acknowledged write \(name) never reached the origin")
        }
        return violations
    }
}
