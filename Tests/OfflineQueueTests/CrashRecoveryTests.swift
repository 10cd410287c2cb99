import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineQueue

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@Suite("OfflineQueue crash recovery with SIGKILL")
struct CrashRecoveryTests {
    /// A child process enqueues in a loop, printing "ACK <id>" after each enqueue returns, and is
    /// killed with SIGKILL at a random moment. Twenty times on one folder: every acknowledged entry
    /// must be there afterwards, and nothing corrupt may be loaded.
    @Test(.timeLimit(.minutes(5)))
    func everyAcknowledgedEntrySurvivesSIGKILLAtRandomMoments() async throws {
        #if os(Linux) || os(macOS)
        let directory = TemporaryDirectory()
        let path = directory.url.path
        let acks = TemporaryDirectory()
        try FileManager.default.createDirectory(at: acks.url, withIntermediateDirectories: true)
        var acknowledged = Set<UUID>()
        for round in 0..<20 {
            let delayMicroseconds = UInt32.random(in: 5_000...80_000)
            let ackPath = acks.url.appendingPathComponent("round-\(round)").path
            try await ExitTests.oneAtATime {
                await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, ackPath = ackPath as String, delayMicroseconds = delayMicroseconds as UInt32] in
                    // The kill is armed before anything else, so it can also land while the folder is
                    // being opened and recovered, and the child can never outlive its test.
                    let killer = Thread {
                        usleep(delayMicroseconds)
                        kill(getpid(), SIGKILL)
                    }
                    killer.start()
                    let store = try DiskQueueStore(directory: URL(fileURLWithPath: path))
                    let engine = OfflineQueueEngine(
                        reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
                        store: store,
                        maxQueueSize: 1_000_000
                    )
                    var index = 0
                    while true {
                        let request = QueuedRequest(method: .post, url: URL(string: "https://api.example.test/items/\(index)")!, body: Data(repeating: 0x61, count: 200))
                        if let id = try await engine.enqueue(request, sending: .onNextDrain).queuedID {
                            // Unbuffered: the line is in the file before the next enqueue starts.
                            ExitTests.append("ACK \(id.uuidString)\n", toFileAt: ackPath)
                        }
                        index += 1
                    }
                }
            }
            let output = (try? String(contentsOfFile: ackPath, encoding: .utf8)) ?? ""
            let acked = output.split(separator: "\n").compactMap { line in
                line.hasPrefix("ACK ") ? UUID(uuidString: String(line.dropFirst(4))) : nil
            }
            acknowledged.formUnion(acked)

            let store = try DiskQueueStore(directory: directory.url)
            #expect(store.openReport.quarantined.isEmpty, "round \(round): \(store.openReport.quarantined)")
            let present = Set(await store.load().map(\.id))
            let missing = acknowledged.subtracting(present)
            #expect(missing.isEmpty, "round \(round): \(missing.count) acknowledged entries lost")
        }
        #expect(acknowledged.count > 0)
        print("crash test: \(acknowledged.count) acknowledged entries over 20 SIGKILLs, none lost")
        #endif
    }

    /// The same with coalescing keys: seven keys edited concurrently (each key in order, with
    /// bursts of concurrent edits between), killed at random moments. After each kill the folder
    /// must hold exactly one entry per key, and it must be the newest acknowledged edit of that
    /// key or a newer one (written, not yet acknowledged when the kill came).
    @Test(.timeLimit(.minutes(5)))
    func theNewestAcknowledgedEditOfEveryKeySurvivesSIGKILL() async throws {
        #if os(Linux) || os(macOS)
        let directory = TemporaryDirectory()
        let path = directory.url.path
        let keys = (0..<7).map { "key-\($0)" }
        var newest: [String: (round: Int, n: Int)] = [:]
        var acknowledgedEdits = 0
        let acks = TemporaryDirectory()
        try FileManager.default.createDirectory(at: acks.url, withIntermediateDirectories: true)
        for round in 0..<20 {
            let delayMicroseconds = UInt32.random(in: 10_000...120_000)
            let ackPath = acks.url.appendingPathComponent("round-\(round)").path
            try await ExitTests.oneAtATime {
                await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, ackPath = ackPath as String, delayMicroseconds = delayMicroseconds as UInt32, round = round as Int] in
                    let killer = Thread {
                        usleep(delayMicroseconds)
                        kill(getpid(), SIGKILL)
                    }
                    killer.start()
                    let store = try DiskQueueStore(directory: URL(fileURLWithPath: path))
                    let engine = OfflineQueueEngine(
                        reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
                        store: store,
                        maxQueueSize: 1_000_000
                    )
                    let edit: @Sendable (String, Int) -> QueuedRequest = { key, n in
                        QueuedRequest(method: .put, url: URL(string: "https://api.example.test/\(key)")!, body: Data("\(round):\(n)".utf8), coalescingKey: key)
                    }
                    await withTaskGroup(of: Void.self) { group in
                        for key in (0..<7).map({ "key-\($0)" }) {
                            group.addTask {
                                var n = 0
                                while true {
                                    if n % 10 == 9 {
                                        // A burst: edits of one key racing each other.
                                        let base = n
                                        await withTaskGroup(of: Void.self) { burst in
                                            for offset in 0..<4 { burst.addTask { _ = try? await engine.enqueue(edit(key, base + offset), sending: .onNextDrain) } }
                                        }
                                        n += 4
                                    }
                                    if (try? await engine.enqueue(edit(key, n), sending: .onNextDrain)) != nil {
                                        ExitTests.append("ACK \(key) \(n)\n", toFileAt: ackPath)
                                    }
                                    n += 1
                                }
                            }
                        }
                    }
                }
            }
            let output = (try? String(contentsOfFile: ackPath, encoding: .utf8)) ?? ""
            for line in output.split(separator: "\n") where line.hasPrefix("ACK ") {
                let parts = line.split(separator: " ")
                guard parts.count == 3, let n = Int(parts[2]) else { continue }
                let key = String(parts[1])
                acknowledgedEdits += 1
                if let known = newest[key], (known.round, known.n) >= (round, n) { continue }
                newest[key] = (round, n)
            }

            let store = try DiskQueueStore(directory: directory.url)
            #expect(store.openReport.quarantined.isEmpty, "round \(round): \(store.openReport.quarantined)")
            let entries = await store.load()
            for key in keys {
                let survivors = entries.filter { $0.coalescingKey == key }
                guard let acked = newest[key] else { continue }
                #expect(survivors.count == 1, "round \(round), \(key): \(survivors.count) entries")
                guard let survivor = survivors.first else { continue }
                let value = String(decoding: survivor.body ?? Data(), as: UTF8.self).split(separator: ":").compactMap { Int($0) }
                #expect(
                    value.count == 2 && (value[0], value[1]) >= (acked.round, acked.n),
                    "round \(round), \(key): newest acknowledged edit \(acked) lost, found \(value)")
            }
        }
        #expect(acknowledgedEdits > 0)
        print("coalescing crash test: \(acknowledgedEdits) acknowledged edits of \(keys.count) keys over 20 SIGKILLs, the newest of each kept")
        #endif
    }
}
