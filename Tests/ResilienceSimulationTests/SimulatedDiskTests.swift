import Foundation
import OfflineQueue
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceSimulation
import ResilienceTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The simulation's disk: what a crash keeps, what a fault does, and the queue bugs it found.
/// Each test runs its simulations in an exit-test child (a simulation owns the process's task
/// scheduling while it runs); a child reports a failure by printing it and exiting non-zero.
@Suite("Simulated disk: crashes, faults, and the queue on them")
struct SimulatedDiskTests {
    @Test("A crash keeps what was fsynced under a synced folder; it may lose a rename the folder's fsync did not cover, and cut an unsynced file")
    func crashKeepsWhatWasDurable() async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let outcomes = Locked(Set<String>())
                for seed: UInt64 in 1...60 {
                    let run = Simulation.run(seed: seed) { simulation in
                        do {
                            try FileSystem.makeDirectoryTree("/d")
                            try FileSystem.writeFile(Data("a".utf8), to: "/d/a", via: "/d/.a.tmp", sync: true)
                            try FileSystem.writeFile(Data("cccc".utf8), to: "/d/c", via: "/d/.c.tmp", sync: false)
                            try FileSystem.syncDirectory("/d")
                            try FileSystem.writeFile(Data("bb".utf8), to: "/d/b", via: "/d/.b.tmp", sync: true)
                        } catch {
                            simulation.record("FAIL setup: \(error)")
                            return
                        }
                        simulation.disk.crash()
                        // Down: nothing the crashed process does reaches the disk.
                        let whileDown = (try? FileSystem.writeFile(Data("x".utf8), to: "/d/x", via: "/d/.x.tmp", sync: true)) == nil
                        simulation.disk.restart()
                        let names = (try? FileSystem.listDirectory("/d")) ?? []
                        if !whileDown || names.contains("x") { simulation.record("FAIL a write reached the disk while it was down") }
                        if content("a", in: "/d") != "a" { simulation.record("FAIL a: \(content("a", in: "/d") ?? "gone")") }
                        let c = content("c", in: "/d")
                        guard let c, "cccc".hasPrefix(c) else { return simulation.record("FAIL c: \(c ?? "gone")") }
                        let b = content("b", in: "/d")
                        if let b, b != "bb" { simulation.record("FAIL b: \(b)") }
                        let outcome = "b \(b == nil ? (names.contains(".b.tmp") ? "temp only" : "lost") : "kept"), c \(c.count == 4 ? "whole" : "cut")"
                        outcomes.withLock { _ = $0.insert(outcome) }
                    }
                    if let failure = run.trace.first(where: { $0.contains("FAIL") }) {
                        print("seed \(seed): \(failure)")
                        exit(1)
                    }
                }
                // Over 60 seeds the crash takes every path: the unsynced rename kept, lost, or
                // left half done; the unsynced content whole or cut.
                let seen = outcomes.withLock { $0 }
                for expected in ["b kept", "b lost", "b temp only", "c whole", "c cut"] where !seen.contains(where: { $0.contains(expected) }) {
                    print("never seen: \(expected) (seen \(seen.sorted()))")
                    exit(2)
                }
                exit(0)
            }
        }
    }

    @Test("A fault fails the operation it names with ENOSPC, EIO or EACCES and leaves the folder as it was")
    func faultsFailTheOperationAndChangeNothing() async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let run = Simulation.run(seed: 5) { simulation in
                    try? FileSystem.makeDirectoryTree("/d")
                    try? FileSystem.writeFile(Data("old".utf8), to: "/d/a", via: "/d/.a.tmp", sync: true)
                    for faults in [SimulatedDisk.Faults(write: 1), .init(fsync: 1), .init(rename: 1)] {
                        simulation.disk.faults = faults
                        do {
                            try FileSystem.writeFile(Data("new".utf8), to: "/d/a", via: "/d/.a.tmp", sync: true)
                            simulation.record("FAIL \(faults): the write succeeded")
                        } catch let error as FileSystemError {
                            if ![ENOSPC, EIO, EACCES].contains(error.errno) { simulation.record("FAIL errno \(error.errno)") }
                        } catch {
                            simulation.record("FAIL \(error)")
                        }
                        simulation.disk.faults = .none
                        let names = (try? FileSystem.listDirectory("/d")) ?? []
                        if names != ["a"] || content("a", in: "/d") != "old" { simulation.record("FAIL after \(faults): \(names) \(content("a", in: "/d") ?? "-")") }
                    }
                    simulation.disk.faults = .init(unlink: 1, directorySync: 1)
                    if (try? FileSystem.removeFile("/d/a")) != nil { simulation.record("FAIL the unlink succeeded") }
                    if (try? FileSystem.syncDirectory("/d")) != nil { simulation.record("FAIL the folder's fsync succeeded") }
                    simulation.disk.faults = .none
                    if content("a", in: "/d") != "old" { simulation.record("FAIL a failed unlink removed the file") }
                    if simulation.disk.failures != 5 { simulation.record("FAIL \(simulation.disk.failures) failures counted, 5 made") }
                }
                exitReportingFailures(of: run)
            }
        }
    }

    @Test("A queued entry saved again keeps its file when the folder's fsync fails (it was deleted, and lost at the next open)")
    func aResaveWhoseFolderSyncFailsKeepsTheEntry() async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let run = Simulation.run(seed: 1) { simulation in
                    let folder = URL(fileURLWithPath: "/sim/queue", isDirectory: true)
                    let id = UUID()
                    var request = QueuedRequest(method: .put, url: URL(string: "https://api.sim/docs/a")!)
                    do {
                        let store = try DiskQueueStore(directory: folder)
                        try await store.save(QueueEntry(request, id: id, enqueuedAt: Date()))
                        simulation.disk.faults = .init(directorySync: 1)
                        request.priority = .high
                        if (try? await store.save(QueueEntry(request, id: id, enqueuedAt: Date()))) != nil {
                            simulation.record("FAIL the save succeeded without a folder fsync")
                        }
                        simulation.disk.faults = .none
                    } catch {
                        return simulation.record("FAIL setup: \(error)")
                    }
                    // The store is gone (its lock with it): the app restarts.
                    guard let reopened = try? DiskQueueStore(directory: folder) else { return simulation.record("FAIL reopening") }
                    let ids = await reopened.load().map(\.id)
                    if ids != [id] { simulation.record("FAIL after reopening: \(ids.count) entries") }
                }
                exitReportingFailures(of: run)
            }
        }
    }

    @Test("An edit is not sent while its older edit's file cannot be deleted, and goes once it can; the older edit never lands")
    func anEditWaitsForItsOlderEditsDeletion() async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let run = Simulation.run(seed: 2) { simulation in
                    simulation.network.setHost("api.sim", .init(latency: .milliseconds(5)...(.milliseconds(5))))
                    let folder = URL(fileURLWithPath: "/sim/queue", isDirectory: true)
                    guard let store = try? DiskQueueStore(directory: folder) else { return simulation.record("FAIL opening") }
                    let engine = queue(on: store, in: simulation)
                    await simulation.setOnline(false)
                    var edit = QueuedRequest(method: .put, url: URL(string: "https://api.sim/docs/k")!)
                    edit.coalescingKey = "k"
                    for version in 1...2 {
                        edit.body = Data("\(version)".utf8)
                        edit.headers["X-Sim-Mutation"] = "v\(version)"
                        if version == 2 { simulation.disk.faults = .init(unlink: 1) }  // v1's file stays
                        guard (try? await engine.enqueue(edit))?.queuedID != nil else { return simulation.record("FAIL v\(version) not queued") }
                    }
                    await simulation.setOnline(true)
                    let blocked = await engine.flush(.ignoringReachability)
                    if !blocked.delivered.isEmpty || simulation.origin.requestCount != 0 {
                        simulation.record("FAIL sent while the older edit's file could not be deleted")
                    }
                    simulation.disk.faults = .none
                    try? await simulation.clock.sleep(for: .seconds(3_600))  // past the backoff
                    let sent = await engine.flush(.ignoringReachability)
                    await engine.stop()
                    if sent.delivered.count != 1 || simulation.origin.version(of: "k") != 2 || simulation.origin.effects(of: "v1") != 0 {
                        simulation.record("FAIL delivered \(sent.delivered.count), origin at \(simulation.origin.version(of: "k"))")
                    }
                    let left = (try? FileSystem.listDirectory(folder.path))?.filter { $0.hasSuffix(".json") } ?? []
                    if !left.isEmpty { simulation.record("FAIL files left: \(left)") }
                }
                exitReportingFailures(of: run)
            }
        }
    }

    /// The simulation's queue seed 725: an edit refused because the folder's fsync failed, whose
    /// file could not be deleted either, stayed on disk unnoticed; the newer edit went out, and
    /// the next open sent the refused one after it. Its deletion is now retried like any other,
    /// and the newer edit waits for it.
    @Test("A refused edit whose file cannot be deleted never lands after the newer edit, across a restart")
    func aRefusedEditsLeftoverFileNeverLandsAfterTheNewerEdit() async throws {
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let run = Simulation.run(seed: 3) { simulation in
                    simulation.network.setHost("api.sim", .init(latency: .milliseconds(5)...(.milliseconds(5))))
                    let folder = URL(fileURLWithPath: "/sim/queue", isDirectory: true)
                    await simulation.setOnline(false)
                    var edit = QueuedRequest(method: .put, url: URL(string: "https://api.sim/docs/k")!)
                    edit.coalescingKey = "k"
                    do {
                        let engine = queue(on: try DiskQueueStore(directory: folder), in: simulation)
                        edit.body = Data("1".utf8)
                        edit.headers["X-Sim-Mutation"] = "v1"
                        edit.idempotencyKey = "v1"
                        simulation.disk.faults = .init(unlink: 1, directorySync: 1)
                        if (try? await engine.enqueue(edit)) != nil { simulation.record("FAIL v1 accepted without a folder fsync") }
                        simulation.disk.faults = .none
                        edit.body = Data("2".utf8)
                        edit.headers["X-Sim-Mutation"] = "v2"
                        edit.idempotencyKey = "v2"
                        guard (try? await engine.enqueue(edit))?.queuedID != nil else { return simulation.record("FAIL v2 not queued") }
                        await simulation.setOnline(true)
                        let report = await engine.flush(.ignoringReachability)
                        if report.delivered.count != 1 { simulation.record("FAIL delivered \(report.delivered.count) before the restart") }
                        await engine.stop()
                    } catch {
                        return simulation.record("FAIL setup: \(error)")
                    }
                    // The store is gone (its lock with it): the app restarts and drains what it finds.
                    guard let reopened = try? DiskQueueStore(directory: folder) else { return simulation.record("FAIL reopening") }
                    let engine = queue(on: reopened, in: simulation)
                    _ = await engine.flush(.ignoringReachability)
                    await engine.stop()
                    if simulation.origin.version(of: "k") != 2 || simulation.origin.effects(of: "v1") != 0 {
                        simulation.record("FAIL the origin ends at \(simulation.origin.version(of: "k")), v1 landed \(simulation.origin.effects(of: "v1")) times")
                    }
                }
                exitReportingFailures(of: run)
            }
        }
    }
}

/// A queue over `store` on the simulation's network, connectivity and clock.
private func queue(on store: DiskQueueStore, in simulation: Simulation) -> OfflineQueueEngine {
    OfflineQueueEngine(
        requestEngine: AsyncRequestEngine(session: simulation.network, clock: simulation.clock),
        reachabilityMonitor: simulation.connectivity,
        store: store,
        clock: simulation.clock
    )
}

/// The content of `name` in `folder` on the simulation's disk, or nil when it is not there.
private func content(_ name: String, in folder: String) -> String? {
    guard let descriptor = try? FileSystem.openDirectory(folder) else { return nil }
    defer { FileSystem.closeDescriptor(descriptor) }
    var buffer: [UInt8] = []
    var info = stat()
    guard case .bytes(let count) = FileSystem.readRegularFile(named: name, in: descriptor, maximumSize: 1 << 20, into: &buffer, info: &info) else { return nil }
    return String(decoding: buffer[0..<count], as: UTF8.self)
}

/// Ends an exit-test child: 1 with the first line of `run`'s trace that says FAIL, else 0.
private func exitReportingFailures(of run: Simulation.Run) -> Never {
    if let failure = run.trace.first(where: { $0.contains("FAIL") }) {
        print(failure)
        exit(1)
    }
    exit(0)
}
