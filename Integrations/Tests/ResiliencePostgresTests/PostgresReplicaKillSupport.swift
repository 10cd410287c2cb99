import Foundation
import ResilienceTesting
import Synchronization

#if canImport(Glibc)
import Glibc
private let sendSignal = Glibc.kill
#elseif canImport(Darwin)
import Darwin
private let sendSignal = Darwin.kill
#endif

/// The origin the replicas deliver to: a `LoopbackHTTPServer` that applies each `Idempotency-Key`
/// once (the first request carrying it is the effect; later ones are duplicates, answered the same)
/// and answers 201. Each request's body is `<ordering key> <index>` (`postgres-queue-replica`'s
/// entries); the origin checks, as each effect lands, that a key's effects come in index order.
/// Each answer is written `responseDelay` after the request arrived (the effect is recorded at once),
/// so that a replica killed at a random moment is often killed between an effect and its answer.
final class DeduplicatingOrigin: Sendable {
    struct Effect: Equatable, Sendable {
        let orderingKey: String
        let index: Int
    }

    private struct State {
        var effects: [String: Effect] = [:]
        var nextIndex: [String: Int] = [:]
        var duplicates = 0
        var violations: [String] = []
        /// Who waits for the effects to reach a count (`waitForEffects(atLeast:)`), by ticket.
        var waiters: [Int: (count: Int, continuation: CheckedContinuation<Void, Never>)] = [:]
        var nextTicket = 0

        /// The waiters whose count has been reached, taken out.
        mutating func reached() -> [CheckedContinuation<Void, Never>] {
            let done = waiters.filter { $0.value.count <= effects.count }
            for ticket in done.keys { waiters[ticket] = nil }
            return done.values.map(\.continuation)
        }
    }

    let server: LoopbackHTTPServer
    private let state = Mutex(State())

    init(responseDelay: Duration = .zero) throws {
        server = try LoopbackHTTPServer()
        let answer = LoopbackResponse.status(201).delayed(by: responseDelay)
        server.route("/effects/*") { [weak self] request in
            guard let self else { return .status(503) }
            let (response, reached) = self.state.withLock { state in
                let response = Self.record(request, answer: answer, in: &state)
                return (response, state.reached())
            }
            for waiter in reached { waiter.resume() }
            return response
        }
    }

    /// Records `request`'s effect (the first of its key) and checks its ordering key's order.
    private static func record(_ request: LoopbackRequest, answer: LoopbackResponse, in state: inout State) -> LoopbackResponse {
        guard let key = request.header("Idempotency-Key") else {
            state.violations.append("a request without an Idempotency-Key")
            return .status(400)
        }
        let fields = String(decoding: request.body, as: UTF8.self).split(separator: " ")
        guard fields.count == 2, let index = Int(fields[1]) else {
            state.violations.append("\(key): unreadable body")
            return .status(400)
        }
        guard state.effects[key] == nil else {
            state.duplicates += 1
            return answer
        }
        let orderingKey = String(fields[0])
        state.effects[key] = Effect(orderingKey: orderingKey, index: index)
        let expected = state.nextIndex[orderingKey, default: 0]
        if index != expected {
            state.violations.append("\(orderingKey): the first effect of entry \(index) came when entry \(expected) was next")
        }
        state.nextIndex[orderingKey] = max(expected, index + 1)
        return answer
    }

    /// Returns once the origin has recorded `count` effects, or when the calling task is cancelled.
    func waitForEffects(atLeast count: Int) async {
        let ticket = state.withLock { state in
            defer { state.nextTicket += 1 }
            return state.nextTicket
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    guard state.effects.count < count, !Task.isCancelled else { return true }
                    state.waiters[ticket] = (count, continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: ticket) }?.continuation.resume()
        }
    }

    deinit { server.shutdown() }

    var baseURL: URL { server.baseURL }
    var effectCount: Int { state.withLock { $0.effects.count } }
    var effects: [String: Effect] { state.withLock { $0.effects } }
    var duplicates: Int { state.withLock { $0.duplicates } }
    var violations: [String] { state.withLock { $0.violations } }
}

/// A child process of `postgres-queue-replica`, its standard output and error in a file.
final class ReplicaProcess: Sendable {
    /// How a child ended.
    enum Exit: Equatable, Sendable {
        case status(Int32)
        case signal(Int32)
    }

    let pid: Int32
    let outputURL: URL
    private let exit = ExitState()

    /// The exit, once known, and who waits for it (a class, so the termination handler shares it).
    private final class ExitState: Sendable {
        let state = Mutex<(value: Exit?, waiters: [CheckedContinuation<Exit, Never>])>((nil, []))
    }

    /// Starts `binary` with `arguments`, writing its output (standard output and error) to `outputURL`.
    init(binary: URL, arguments: [String], outputURL: URL) throws {
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
    func exited() async -> Exit {
        await withCheckedContinuation { continuation in
            let ended = exit.state.withLock { state -> Exit? in
                if let value = state.value { return value }
                state.waiters.append(continuation)
                return nil
            }
            if let ended { continuation.resume(returning: ended) }
        }
    }

    var hasExited: Bool { exit.state.withLock { $0.value != nil } }

    /// Sends SIGKILL (nothing when it has ended already) and waits for the child to end.
    @discardableResult
    func kill() async -> Exit {
        if !hasExited { _ = sendSignal(pid, SIGKILL) }
        return await exited()
    }

    /// The output so far.
    var output: String { (try? String(contentsOf: outputURL, encoding: .utf8)) ?? "" }

    /// The last `count` lines of the output.
    func tail(_ count: Int = 20) -> String {
        output.split(separator: "\n", omittingEmptySubsequences: false).suffix(count).joined(separator: "\n")
    }

    /// `postgres-queue-replica` as the build put it, beside this test bundle (SwiftPM builds the
    /// package's executables with its tests); `POSTGRES_QUEUE_REPLICA` names another.
    static let binary: URL? = {
        let fileManager = FileManager.default
        if let path = ProcessInfo.processInfo.environment["POSTGRES_QUEUE_REPLICA"] {
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
            let candidate = folder.appendingPathComponent("postgres-queue-replica")
            if fileManager.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        return nil
    }()
}
