import Foundation
import OfflineFirst
import OfflineQueue
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResponseCache

/// The conflicts scenario (issue 46): three devices — each its own `OfflineFirstClient`, queue
/// and response cache on folders of its own, its own connectivity — add edits to two shared notes
/// while they go on and off line, against an origin that versions every note (`ETag`), refuses a
/// write on an old version with `412` (and, on one note, a write without a version with `428`),
/// and otherwise lets the last write win. A device writes the whole note (what it shows, with its
/// new edit) as an edit of its read (`mutate(_:editing:)`, or the base the snapshot it built the
/// body from shows), coalescing its edits of one note; most devices resolve a conflict by a union
/// of both sides (`rebase`), some by `discard`. The host fails now and then.
///
/// Invariant: every acknowledged edit (its `mutate` returned) is in its note on the origin at the
/// end, or was reported to its device as discarded (`removed` with reason `conflict`); none is
/// silently overwritten. And every queue ends empty.
struct ConflictsWorkload {
    let simulation: Simulation

    static let host = "api.sim"
    static let devices = 3
    static let notes = ["n0", "n1"]
    static let editsPerDevice = 8

    /// A union of the server's edits and the write's: the write's own edits re-sent on the
    /// server's version, nothing of either side lost.
    struct UnionMerge: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
            let server = ConflictsWorkload.edits(in: conflict.serverBody)
            let mine = ConflictsWorkload.edits(in: conflict.entry.body)
            return .rebase(body: ConflictsWorkload.body(server + mine.filter { !server.contains($0) }))
        }
    }

    struct Discard: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution { .discard }
    }

    struct NoteRead: NetworkRequest {
        let url: URL
        var method: HTTPMethod { .get }
    }

    /// One device and what it was told.
    final class Device: Sendable {
        let name: String
        let monitor: ManualReachabilityMonitor
        let client: OfflineFirstClient
        let acknowledged = Locked<[String]>([])
        let discarded = Locked<Set<String>>([])
        let watching: Task<Void, Never>

        init(name: String, monitor: ManualReachabilityMonitor, client: OfflineFirstClient) {
            self.name = name
            self.monitor = monitor
            self.client = client
            let discarded = self.discarded
            let changes = client.queue.changes
            watching = Task {
                for await change in changes {
                    if case .removed(let entry, .conflict) = change {
                        discarded.withLock { $0.formUnion(ConflictsWorkload.edits(in: entry.body)) }
                    }
                }
            }
        }
    }

    static func edits(in body: Data?) -> [String] {
        String(decoding: body ?? Data(), as: UTF8.self).split(separator: ",").map(String.init)
    }

    static func body(_ edits: [String]) -> Data { Data(edits.joined(separator: ",").utf8) }

    static func url(_ note: String) -> URL { URL(string: "https://\(host)/notes/\(note)")! }

    func run() async -> [String] {
        let simulation = simulation
        simulation.network.setHost(
            Self.host,
            .init(latency: .milliseconds(5)...(.milliseconds(150)), faults: .init(refused: 0.03, resetBefore: 0.03, resetAfter: 0.03, timeout: 0.02, serverError: 0.04))
        )
        simulation.origin.requirePrecondition(for: "n1")
        var devices: [Device] = []
        for index in 0..<Self.devices {
            do {
                devices.append(try await makeDevice(index, discards: simulation.chance(0.3)))
            } catch {
                return ["device \(index)'s folders could not be opened: \(error)"]
            }
        }
        await withTaskGroup(of: Void.self) { group in
            for device in devices {
                group.addTask {
                    for _ in 0..<simulation.random(in: 0...4) {
                        try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(100)...(.seconds(5))))
                        let connected = await device.monitor.isConnected
                        simulation.record("\(device.name) \(connected ? "offline" : "online")")
                        await device.monitor.setConnected(!connected)
                    }
                    // A read of a note it has never seen waits for connectivity: it comes back.
                    if await !device.monitor.isConnected {
                        try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(100)...(.seconds(5))))
                        simulation.record("\(device.name) online")
                        await device.monitor.setConnected(true)
                    }
                }
                group.addTask {
                    for index in 0..<Self.editsPerDevice {
                        try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.seconds(2))))
                        await edit(index, on: device)
                    }
                }
            }
        }
        // Online for good, a healthy host: every queue empties.
        simulation.network.setHost(Self.host, .init(latency: .milliseconds(5)...(.milliseconds(50))))
        var violations: [String] = []
        for device in devices {
            await device.monitor.setConnected(true)
            var rounds = 0
            while await device.client.queue.pendingCount() > 0, rounds < 10 {
                simulation.record("\(device.name) final flush begins")
                let report = await device.client.queue.flush(.ignoringReachability)
                simulation.record("\(device.name) final flush ended; resolutions settling")
                await device.client.queue.resolutionsSettled()
                simulation.record("\(device.name) final flush: \(report.delivered.count) delivered, \(report.remaining) remaining")
                rounds += 1
                if report.remaining > 0 { try? await simulation.clock.sleep(for: .seconds(60)) }
            }
            let pending = await device.client.queue.pendingCount()
            if pending > 0 { violations.append("\(device.name): \(pending) writes still queued after the final flushes") }
        }
        // The devices' change feeds have told them everything by now.
        try? await simulation.clock.sleep(for: .seconds(1))
        let final = Dictionary(uniqueKeysWithValues: Self.notes.map { ($0, Set(simulation.origin.edits(of: $0))) })
        for device in devices {
            let discarded = device.discarded.withLock { $0 }
            for edit in device.acknowledged.withLock({ $0 }) {
                let note = String(edit.prefix { $0 != ":" })
                guard final[note]?.contains(edit) != true, !discarded.contains(edit) else { continue }
                violations.append("\(device.name)'s acknowledged edit \(edit) is neither on the server (\(note): \(final[note]?.count ?? 0) edits) nor reported discarded")
            }
            device.watching.cancel()
            await device.client.close()
        }
        simulation.record("origin: \(simulation.origin.preconditionFailures) writes refused with 412/428; n0 \(final["n0"]?.count ?? 0), n1 \(final["n1"]?.count ?? 0) edits")
        return violations
    }

    private func makeDevice(_ index: Int, discards: Bool) async throws -> Device {
        let folder = "/simulation/conflicts/device-\(index)"
        let monitor = ManualReachabilityMonitor(isConnected: true)
        let store = try DiskQueueStore(directory: URL(fileURLWithPath: folder + "/queue", isDirectory: true))
        let cache = try DiskResponseCache(directory: URL(fileURLWithPath: folder + "/cache", isDirectory: true), maxBytes: 1 << 20)
        let requestEngine = simulation.makeRequestEngine()
        let resolver: any ConflictResolver = discards ? Discard() : UnionMerge()
        let queue = OfflineQueueEngine(
            requestEngine: requestEngine,
            reachabilityMonitor: monitor,
            store: store,
            maxQueueSize: 10_000,
            configuration: .init(retryPolicy: SeededRetryPolicy(simulation: simulation, maxRetries: .max, base: .milliseconds(500)), conflictResolver: resolver),
            clock: simulation.clock
        )
        let reads = CachedRequestEngine(requestEngine: requestEngine, cache: cache, reachabilityMonitor: monitor, clock: simulation.clock)
        let client = OfflineFirstClient(
            reads: reads,
            queue: queue,
            optimisticUpdates: Self.notes.map { note in
                OptimisticUpdate(
                    mutations: { $0.url.path == "/notes/\(note)" },
                    reads: { $0.path == "/notes/\(note)" },
                    apply: { current, pending in
                        let shown = Self.edits(in: current)
                        return Self.body(shown + Self.edits(in: pending.body).filter { !shown.contains($0) })
                    }
                )
            }
        )
        simulation.record("device \(index): resolves by \(discards ? "discard" : "union")")
        return Device(name: "device \(index)", monitor: monitor, client: client)
    }

    /// One edit of a note picked at random: the note as the device shows it, with a new edit,
    /// written as an edit of that read.
    private func edit(_ index: Int, on device: Device) async {
        let note = Self.notes[simulation.random(in: 0...(Self.notes.count - 1))]
        let read = NoteRead(url: Self.url(note))
        // What the user sees: a note the server sent (an error page is no version of it).
        let snapshot = (try? await device.client.snapshot(for: read, mode: .offlineFirst, staleTime: .http)).flatMap { snapshot in
            snapshot.response.map { (200..<300).contains($0.statusCode) } == false ? nil : snapshot
        }
        let edit = "\(note):\(device.name.replacingOccurrences(of: "device ", with: "d")).\(index)"
        // A user edits what they see: with no read of a note, only `n1` is edited (its write has
        // no version, and the origin answers 428); a write without a version elsewhere would be
        // the app's own choice of last-write-wins.
        guard snapshot?.response != nil || note == "n1" else {
            return simulation.record("\(device.name) has no read of \(note): no edit")
        }
        let shown = Self.edits(in: snapshot?.data)
        var request = QueuedRequest(method: .put, url: Self.url(note), body: Self.body(shown + [edit]), coalescingKey: "\(device.name)/\(note)")
        do {
            if simulation.chance(0.5) {
                // The version the body was built from, as the snapshot shows it.
                request.editBase = snapshot?.response.flatMap { response in
                    response.value(forHTTPHeaderField: "ETag").map { EditBase(etag: $0) }
                }
                _ = try await device.client.mutate(request)
            } else {
                _ = try await device.client.mutate(request, editing: read)
            }
            device.acknowledged.withLock { $0.append(edit) }
            simulation.record("\(device.name) acknowledged \(edit)")
        } catch {
            simulation.record("\(device.name) edit \(edit) failed: \(error)")
        }
    }
}
