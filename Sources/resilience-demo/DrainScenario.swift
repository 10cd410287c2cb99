import Foundation
import Resilience
import ResilienceTestSupport
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension Demo {
    /// A slow server and a tight budget: each cycle delivers what fits, the entry in flight when
    /// the budget runs out stays queued and is resent with the same key by a later cycle, until
    /// the queue is empty. Then the same service in a child process is stopped with SIGTERM.
    static func drainServiceCycles(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/outbox", LoopbackResponse.status(201).delayed(by: .milliseconds(40)))
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-demo-drain-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let queue = OfflineQueueEngine(
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: folder)
        )
        let entries = 24
        var keys: Set<String> = []
        for index in 0..<entries {
            var request = QueuedRequest(method: .post, url: server.url("/outbox"), body: Data("{\"n\":\(index)}".utf8))
            request.idempotencyKey = "outbox-\(index)"
            keys.insert(request.idempotencyKey)
            _ = try await queue.enqueue(request, sending: .onNextDrain)
        }
        print("    \(entries) entries queued; the server takes 40 ms per request; budget 300 ms per cycle, interval 200 ms ±10 %")

        let service = DrainService(queue: queue, interval: .milliseconds(200), cycleBudget: .milliseconds(300))
        let reports = await service.reports
        await service.start()
        // The cycles until the queue is empty, or nil after 20 s.
        let collected = await within(.seconds(20)) { () -> [DrainCycleReport]? in
            var cycles: [DrainCycleReport] = []
            for await report in reports {
                print("      \(report)")
                cycles.append(report)
                if report.remaining == 0 { return cycles }
            }
            return nil
        }
        let finished = collected != nil
        let cycles = collected ?? []
        await service.stop()

        let outbox = server.requestLog.filter { $0.path == "/outbox" }
        let sentKeys = outbox.compactMap { $0.header("idempotency-key") }
        let resent = sentKeys.count - Set(sentKeys).count
        let cut = cycles.filter(\.budgetExhausted).count
        let delivered = cycles.map(\.delivered).reduce(0, +)
        print("    \(cycles.count) cycles, \(cut) ended by the budget; \(resent) request(s) cut mid-flight were resent with the same key")

        let signalled = await stopChildOnSIGTERM()
        let pending = await queue.pendingCount()
        let ok = finished && delivered == entries && cut >= 2 && Set(sentKeys) == keys && pending == 0 && signalled.passed
        return Outcome(
            passed: ok,
            detail: "\(delivered)/\(entries) delivered over \(cycles.count) budgeted cycles, none lost or duplicated under a new key; \(signalled.detail)"
        )
    }

    /// Runs `resilience-demo drain` as a child process, waits until its first cycle ran, sends
    /// SIGTERM and expects a clean exit 0 with its closing line.
    static func stopChildOnSIGTERM() async -> Outcome {
        let executable = Demo.ownExecutable
        do {
            let child = try SpawnedProcess.spawn(executable, ["drain", "--interval", "0.2", "--budget", "1", "--entries", "3"])
            var lines: [String] = []
            while let line = child.readLine() {
                lines.append(line)
                if line.hasPrefix("ready") { break }
            }
            guard lines.last?.hasPrefix("ready") == true else {
                _ = child.wait()
                return Outcome(passed: false, detail: "the child never became ready: \(lines)")
            }
            child.send(SIGTERM)
            let rest = String(decoding: child.readToEnd(), as: UTF8.self)
            let termination = child.wait()
            let closing = rest.split(separator: "\n").last.map(String.init) ?? ""
            print("    child process: SIGTERM → \"\(closing)\" (\(termination))")
            let clean = termination == .exited(0) && closing.hasPrefix("stopped cleanly")
            return Outcome(passed: clean, detail: clean ? "a service process stopped cleanly on SIGTERM" : "the child did not stop cleanly: \(termination) \(rest)")
        } catch {
            return Outcome(passed: false, detail: "could not run the child process: \(error)")
        }
    }
}

/// `resilience-demo drain [--interval S] [--budget S] [--entries N]`: a drain service as a
/// long-running process would run it — its own loopback server and queue folder, cycles every
/// interval, reports on stdout — until SIGTERM or SIGINT, then a clean stop that lets the cycle
/// in flight end.
enum DrainCommand {
    static let usage = "usage: resilience-demo drain [--interval S] [--budget S] [--entries N]"

    static func run(_ arguments: [String]) async -> Int32 {
        var interval = 1.0, budget = 5.0, entries = 10
        var remaining = arguments[...]
        while let flag = remaining.popFirst() {
            guard let value = remaining.popFirst() else { return fail("\(flag) needs a value") }
            switch flag {
            case "--interval", "--budget":
                guard let seconds = Double(value), seconds.isFinite, seconds > 0, seconds <= 86_400 else {
                    return fail("invalid value '\(value)' for \(flag)")
                }
                if flag == "--interval" { interval = seconds } else { budget = seconds }
            case "--entries":
                guard let count = Int(value), (0...100_000).contains(count) else { return fail("invalid value '\(value)' for \(flag)") }
                entries = count
            default:
                return fail("unknown argument '\(flag)'")
            }
        }
        do {
            let server = try LoopbackHTTPServer()
            defer { server.shutdown() }
            server.route("/outbox", .status(201))
            let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-drain-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: folder) }
            let queue = OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor(isConnected: true), store: try DiskQueueStore(directory: folder))
            for index in 0..<entries {
                _ = try await queue.enqueue(QueuedRequest(method: .post, url: server.url("/outbox"), body: Data("{\"n\":\(index)}".utf8)), sending: .onNextDrain)
            }
            let service = DrainService(queue: queue, interval: .milliseconds(Int64(interval * 1000)), cycleBudget: .milliseconds(Int64(budget * 1000)))
            let reports = await service.reports
            let printer = Task {
                var first = true
                for await report in reports {
                    emit("\(report)")
                    if first {
                        emit("ready: pid \(getpid()); send SIGTERM or press Ctrl-C to stop")
                        first = false
                    }
                }
            }
            let signal = await service.runUntilSignalled()
            let cycles = await service.cyclesRun
            let left = await queue.pendingCount()
            printer.cancel()
            emit("stopped cleanly on \(signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "signal \(signal ?? 0)") after \(cycles) cycle\(cycles == 1 ? "" : "s"); \(left) entries left")
            return 0
        } catch {
            return fail("\(error)")
        }
    }

    /// One line straight to stdout, unbuffered: a parent reading the pipe sees it at once.
    private static func emit(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    private static func fail(_ message: String) -> Int32 {
        FileHandle.standardError.write(Data("resilience-demo drain: \(message)\n\(usage)\n".utf8))
        return 64
    }
}
