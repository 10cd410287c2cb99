import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A `drain` replica started by `bench`: this same executable in another process, its standard
/// error shared with this one.
final class ChildReplica: Sendable {
    private let process: Process
    private let output: Pipe

    /// Starts `drain --table tableName --deliveries N` and returns once the child says `READY`.
    static func start(table: String, leaseMilliseconds: Int, pollMilliseconds: Int, deliveries: Int) async throws -> ChildReplica {
        let child = try ChildReplica(arguments: [
            "drain", "--table", table, "--lease-ms", "\(leaseMilliseconds)", "--poll-ms", "\(pollMilliseconds)", "--deliveries", "\(deliveries)",
        ])
        try await child.waitUntilReady()
        return child
    }

    private init(arguments: [String]) throws {
        guard let executable = Bundle.main.executableURL else { throw UsageError("cannot find this executable to start replicas") }
        process = Process()
        output = Pipe()
        process.executableURL = executable
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = output
        try process.run()
    }

    /// Reads the child's standard output, on a thread of its own, until a line says `READY`.
    private func waitUntilReady() async throws {
        let reader = output.fileHandleForReading
        let ready: Bool = await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var text = ""
                while true {
                    let data = reader.availableData
                    if data.isEmpty { return continuation.resume(returning: false) }  // the child ended
                    text += String(decoding: data, as: UTF8.self)
                    if text.contains("READY") { return continuation.resume(returning: true) }
                }
            }
        }
        guard ready else { throw UsageError("a drain replica ended before it was ready") }
    }

    /// SIGKILLs the child and waits for it to end.
    func kill() async {
        guard process.isRunning else { return }
        _ = signalProcess(process.processIdentifier, SIGKILL)
        let process = self.process
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                process.waitUntilExit()
                continuation.resume()
            }
        }
    }
}

#if canImport(Glibc)
private let signalProcess = Glibc.kill
#elseif canImport(Darwin)
private let signalProcess = Darwin.kill
#endif
