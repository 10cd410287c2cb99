import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// SpawnedProcess replaces Foundation.Process (whose run() can crash on Linux with Swift 6.3.1,
// swiftlang/swift-corelibs-foundation#5472). These tests run real children: /bin/echo, /bin/sh,
// /bin/cat and /bin/sleep exist on Linux and macOS alike.

/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("SpawnedProcess", .timeLimit(.minutes(5)))
struct SpawnedProcessTests {
    @Test func echoExitsZeroWithItsOutput() throws {
        let (termination, output) = try SpawnedProcess.run("/bin/echo", ["hello"])
        #expect(termination == .exited(0))
        #expect(String(decoding: output, as: UTF8.self) == "hello\n")
    }

    @Test func exitStatusIsReported() throws {
        #expect(try SpawnedProcess.run("/bin/sh", ["-c", "exit 3"]).termination == .exited(3))
        #expect(try SpawnedProcess.run("/bin/sh", ["-c", "exit 255"]).termination == .exited(255))
    }

    @Test func standardErrorSharesTheOutputPipe() throws {
        let (termination, output) = try SpawnedProcess.run("/bin/sh", ["-c", "echo out; echo err >&2"])
        #expect(termination == .exited(0))
        #expect(String(decoding: output, as: UTF8.self) == "out\nerr\n")
    }

    @Test func catRoundTripsInputBytes() throws {
        // 1 MiB, far more than a pipe holds, so input and output must flow at the same time.
        let input = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 8) })
        let (termination, output) = try SpawnedProcess.run("/bin/cat", [], input: input)
        #expect(termination == .exited(0))
        #expect(output == input)

        let process = try SpawnedProcess.spawn("/bin/cat", [], standardInput: true)
        process.writeInput(Data("first\n".utf8))
        #expect(process.readLine() == "first")
        process.writeInput(Data([0, 1, 2, 255]))
        process.closeInput()
        process.closeInput()  // idempotent
        #expect(process.readToEnd() == Data([0, 1, 2, 255]))
        #expect(process.wait() == .exited(0))
    }

    @Test func standardInputIsDevNullByDefault() throws {
        // Without standardInput the child must not read the test runner's own standard input.
        let (termination, output) = try SpawnedProcess.run("/bin/cat", [])
        #expect(termination == .exited(0))
        #expect(output.isEmpty)
    }

    @Test func signalEndsTheChild() throws {
        let process = try SpawnedProcess.spawn("/bin/sleep", ["30"])
        process.send(SIGTERM)
        #expect(process.wait() == .signalled(SIGTERM))
        #expect(process.wait() == .signalled(SIGTERM))  // reaped once, remembered
        process.send(SIGKILL)  // after reaping: the pid may be someone else's now, so nothing is sent
        #expect(process.readToEnd().isEmpty)
    }

    @Test func readLineReturnsLinesThenNil() throws {
        let process = try SpawnedProcess.spawn("/bin/sh", ["-c", "echo ready; echo two"])
        #expect(process.readLine() == "ready")
        #expect(process.readLine() == "two")
        #expect(process.readLine() == nil)
        #expect(process.wait() == .exited(0))

        // An unterminated last line is still a line; readToEnd returns what readLine buffered.
        let partial = try SpawnedProcess.spawn("/bin/sh", ["-c", "printf 'one\\ntwo\\nthree'"])
        #expect(partial.readLine() == "one")
        #expect(String(decoding: partial.readToEnd(), as: UTF8.self) == "two\nthree")
        #expect(partial.readLine() == nil)
        #expect(partial.wait() == .exited(0))
    }

    @Test func spawningAMissingPathThrows() {
        let path = "/nonexistent/spawned-process-\(UUID().uuidString)"
        #expect(throws: SpawnedProcess.Error.spawn(path: path, errno: ENOENT)) {
            try SpawnedProcess.spawn(path, [])
        }
        #expect(throws: SpawnedProcess.Error.self) {
            try SpawnedProcess.run(path, ["x"], input: Data("x".utf8))
        }
    }

    @Test func childGetsTheParentEnvironment() throws {
        let (termination, output) = try SpawnedProcess.run("/usr/bin/env", [])
        #expect(termination == .exited(0))
        let lines = Set(String(decoding: output, as: UTF8.self).split(separator: "\n").map(String.init))
        for key in ["PATH", "HOME"] {
            if let value = ProcessInfo.processInfo.environment[key] {
                #expect(lines.contains("\(key)=\(value)"))
            }
        }
    }

    @Test func writingToAChildThatClosedItsInputDoesNotRaiseSIGPIPE() throws {
        let process = try SpawnedProcess.spawn("/bin/sh", ["-c", "exec </dev/null; echo ready; exec /bin/sleep 30"], standardInput: true)
        #expect(process.readLine() == "ready")
        process.writeInput(Data(count: 1 << 20))  // EPIPE, quietly: no reader is left
        process.send(SIGTERM)
        #expect(process.wait() == .signalled(SIGTERM))

        // The reader leaving while a large write is blocked: the write returns a partial count,
        // and the kernel raises SIGPIPE all the same.
        for _ in 0..<20 {
            let (termination, output) = try SpawnedProcess.run("/bin/sh", ["-c", "head -c 10 >/dev/null"], input: Data(count: 1 << 20))
            #expect(termination == .exited(0))
            #expect(output.isEmpty)
        }
    }

    @Test func pipesAreNotInheritedByLaterChildren() throws {
        // If the sleeper inherited cat's input or output pipe, cat would not see end-of-file (or we
        // would not see it on cat's output) until the sleeper exits, thirty seconds later.
        let cat = try SpawnedProcess.spawn("/bin/cat", [], standardInput: true)
        try whileASleeperRuns(standardInput: true) {
            cat.writeInput(Data("x".utf8))
            cat.closeInput()
            #expect(cat.readToEnd() == Data("x".utf8))
            #expect(cat.wait() == .exited(0))
        }
    }

    @Test func descriptorsWithoutCloseOnExecAreNotInherited() throws {
        // Like a socket that its creator marks close-on-exec only after a child was spawned.
        var fds: [Int32] = [-1, -1]
        try #require(pipe(&fds) == 0)
        defer { close(fds[0]) }
        try whileASleeperRuns {
            // End-of-file at once, unless the sleeper holds a copy of the write end for thirty seconds.
            close(fds[1])
            var byte: UInt8 = 0
            #expect(read(fds[0], &byte, 1) == 0)
        }
    }

    /// Spawns `/bin/sleep 30`, checks that it holds none of this process's pipes or sockets, runs
    /// `body` (which must see an end-of-file that an inherited descriptor would hold back) and kills
    /// the sleeper. Where descriptors cannot be listed, the check is the 30 s such a descriptor
    /// would cost `body`.
    private func whileASleeperRuns(standardInput: Bool = false, _ body: () throws -> Void) throws {
        let sleeper = try SpawnedProcess.spawn("/bin/sleep", ["30"], standardInput: standardInput)
        defer {
            sleeper.send(SIGKILL)
            _ = sleeper.wait()
        }
        let shared = Self.pipesSharedWithThisProcess(by: sleeper.pid)
        #expect(shared == nil || shared == [], "the sleeper holds this process's pipes: \(shared ?? [])")
        let start = ContinuousClock.now
        try body()
        if shared == nil {  // no descriptor listing here: tell by the 30 s an inherited pipe would cost
            #expect(ContinuousClock.now - start < .seconds(20))
        }
    }

    /// The pipes and sockets this process holds that a child also holds beyond its own stdio
    /// (descriptors 3 and up), read from /proc on Linux; `nil` where descriptors cannot be listed.
    /// Only pipes and sockets count: the child's dynamic loader may briefly hold a library open.
    static func pipesSharedWithThisProcess(by pid: pid_t) -> Set<String>? {
        #if os(Linux)
        func targets(_ process: String, from first: Int) -> Set<String>? {
            let folder = "/proc/\(process)/fd"
            guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else { return nil }
            return Set(
                names.compactMap { name -> String? in
                    guard let fd = Int(name), fd >= first else { return nil }
                    return try? FileManager.default.destinationOfSymbolicLink(atPath: "\(folder)/\(name)")
                }.filter { $0.hasPrefix("pipe:") || $0.hasPrefix("socket:") })
        }
        guard let child = targets(String(pid), from: 3), let mine = targets("self", from: 0) else { return nil }
        return child.intersection(mine)
        #else
        return nil
        #endif
    }

    // MARK: Stress

    /// Open descriptors of this process.
    static func openDescriptorCount() throws -> Int {
        #if os(Linux)
        try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count
        #else
        try FileManager.default.contentsOfDirectory(atPath: "/dev/fd").count
        #endif
    }

    /// Spawns `/bin/echo` `count` times, checking every output; returns the failures.
    static func echo(_ count: Int, tag: String) -> [String] {
        var failures: [String] = []
        for index in 0..<count {
            do {
                let (termination, output) = try SpawnedProcess.run("/bin/echo", ["\(tag)-\(index)"])
                let text = String(decoding: output, as: UTF8.self)
                if termination != .exited(0) || text != "\(tag)-\(index)\n" {
                    failures.append("\(tag)-\(index): \(termination), \(text.debugDescription)")
                }
            } catch {
                failures.append("\(tag)-\(index): \(error)")
            }
        }
        return failures
    }

    @Test func manySequentialAndConcurrentSpawnsNeitherCrashNorLeakDescriptors() async throws {
        #if os(Linux) || os(macOS)
        // In a child process of its own (an exit test): there no other test opens or closes
        // descriptors meanwhile, so the counts before and after must be equal, and a crash fails
        // only this test. Blocking on Dispatch threads is fine there too.
        let report = TemporaryDirectory()
        try FileManager.default.createDirectory(at: report.url, withIntermediateDirectories: true)
        let reportPath = report.url.appendingPathComponent("report").path
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [reportPath = reportPath as String] in
                // Whatever Foundation or Dispatch open on first use stays open: not a leak.
                _ = SpawnedProcessTests.echo(2, tag: "warm-up")
                DispatchQueue.concurrentPerform(iterations: 4) { _ in _ = SpawnedProcessTests.echo(1, tag: "warm-up") }

                let before = try SpawnedProcessTests.openDescriptorCount()
                let failures = Locked(SpawnedProcessTests.echo(200, tag: "sequential"))
                DispatchQueue.concurrentPerform(iterations: 4) { worker in
                    let concurrent = SpawnedProcessTests.echo(50, tag: "worker\(worker)")
                    failures.withLock { $0 += concurrent }
                }
                let after = try SpawnedProcessTests.openDescriptorCount()
                for failure in failures.withLock({ $0 }) { ExitTests.append("FAIL \(failure)\n", toFileAt: reportPath) }
                ExitTests.append("DESCRIPTORS \(before) \(after)\n", toFileAt: reportPath)
            }
        }
        let output = try String(contentsOfFile: reportPath, encoding: .utf8)
        let lines = output.split(separator: "\n")
        let failures = lines.filter { $0.hasPrefix("FAIL ") }
        #expect(failures.isEmpty, "\(failures.count) spawns went wrong, e.g. \(failures.prefix(3))")
        let counts = lines.last { $0.hasPrefix("DESCRIPTORS ") }?.split(separator: " ").dropFirst().compactMap { Int($0) }
        #expect(counts?.count == 2 && counts?.first == counts?.last, "open descriptors before and after 400 spawns: \(counts ?? [])")
        #endif
    }
}
