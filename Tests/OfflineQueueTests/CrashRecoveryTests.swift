import Foundation
import Testing
import RequestEngine
import ResilienceTesting
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
        var acknowledged = Set<UUID>()
        for round in 0..<20 {
            let delayMicroseconds = UInt32.random(in: 5_000...80_000)
            let result = await #expect(processExitsWith: .signal(SIGKILL), observing: [\.standardOutputContent]) { [path = path as String, delayMicroseconds = delayMicroseconds as UInt32] in
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
                    if let id = try await engine.enqueue(request, attemptFirst: false).queuedID {
                        // Unbuffered: the line is in the pipe before the next enqueue starts.
                        let line = Array("ACK \(id.uuidString)\n".utf8)
                        _ = line.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
                    }
                    index += 1
                }
            }
            let output = String(decoding: try #require(result).standardOutputContent, as: UTF8.self)
            let acks = output.split(separator: "\n").compactMap { line in
                line.hasPrefix("ACK ") ? UUID(uuidString: String(line.dropFirst(4))) : nil
            }
            acknowledged.formUnion(acks)

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
}
