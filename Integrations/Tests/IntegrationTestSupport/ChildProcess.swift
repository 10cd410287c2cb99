import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
private let sendSignal = Glibc.kill
#elseif canImport(Darwin)
import Darwin
private let sendSignal = Darwin.kill
#endif

/// A child process (one of this package's executables, run by a test), its standard output and
/// error in a file; killed with SIGKILL by `kill()`.
public final class ChildProcess: Sendable {
    /// How a child ended.
    public enum Exit: Equatable, Sendable {
        case status(Int32)
        case signal(Int32)
    }

    public let pid: Int32
    public let outputURL: URL
    private let exit = ExitState()

    /// The exit, once known, and who waits for it (a class, so the termination handler shares it).
    private final class ExitState: Sendable {
        let state = Mutex<(value: Exit?, waiters: [CheckedContinuation<Exit, Never>])>((nil, []))
    }

    /// Starts `binary` with `arguments`, writing its output (standard output and error) to `outputURL`.
    public init(binary: URL, arguments: [String], outputURL: URL) throws {
        guard FileManager.default.createFile(atPath: outputURL.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: outputURL.path])
        }
        let output = try FileHandle(forWritingTo: outputURL)
        let process = Process()
        process.executableURL = binary
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = output
        process.standardError = output
        let exit = self.exit
        process.terminationHandler = { process in
            let ended: Exit =
                process.terminationReason == .uncaughtSignal ? .signal(process.terminationStatus) : .status(process.terminationStatus)
            let waiters = exit.state.withLock { state in
                state.value = ended
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume(returning: ended) }
        }
        try process.run()
        try? output.close()  // the child holds its own copy
        self.pid = process.processIdentifier
        self.outputURL = outputURL
    }

    /// How the child ended, once it has.
    public func exited() async -> Exit {
        await withCheckedContinuation { continuation in
            let ended = exit.state.withLock { state -> Exit? in
                if let value = state.value { return value }
                state.waiters.append(continuation)
                return nil
            }
            if let ended { continuation.resume(returning: ended) }
        }
    }

    public var hasExited: Bool { exit.state.withLock { $0.value != nil } }

    /// Sends SIGKILL (nothing when it has ended already) and waits for the child to end.
    @discardableResult
    public func kill() async -> Exit {
        if !hasExited { _ = sendSignal(pid, SIGKILL) }
        return await exited()
    }

    /// The output so far.
    public var output: String { (try? String(contentsOf: outputURL, encoding: .utf8)) ?? "" }

    /// The last `count` lines of the output.
    public func tail(_ count: Int = 20) -> String {
        output.split(separator: "\n", omittingEmptySubsequences: false).suffix(count).joined(separator: "\n")
    }

    /// The executable `name` as the build put it, beside this test bundle (SwiftPM builds the
    /// package's executables with its tests), or the one the environment variable `variable` names.
    public static func executable(named name: String, overriddenBy variable: String) -> URL? {
        let fileManager = FileManager.default
        if let path = ProcessInfo.processInfo.environment[variable] {
            return fileManager.isExecutableFile(atPath: path) ? URL(fileURLWithPath: path) : nil
        }
        var folders: [URL] = []
        // The .xctest bundle (macOS) or executable (Linux) sits in the build's bin folder.
        for bundle in Bundle.allBundles where bundle.bundlePath.hasSuffix(".xctest") {
            folders.append(bundle.bundleURL.deletingLastPathComponent())
        }
        folders.append(Bundle.main.bundleURL)
        if let executable = Bundle.main.executableURL { folders.append(executable.deletingLastPathComponent()) }
        if let first = CommandLine.arguments.first { folders.append(URL(fileURLWithPath: first).deletingLastPathComponent()) }
        for folder in folders {
            let candidate = folder.appendingPathComponent(name)
            if fileManager.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        return nil
    }
}
