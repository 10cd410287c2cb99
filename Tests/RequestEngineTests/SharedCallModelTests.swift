import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Keeps Models/SharedCall.pml and `SharedCallStateMachine` from drifting apart: spin runs random
/// simulations of the model (one per seed), and every step of each trace — a caller joining,
/// suspending, leaving; the first task's handle; an attempt opened, claimed or timed out; the
/// successor task; the outcome — is fed to the Swift machine, which must decide the same, and
/// each caller, suspended on a real continuation, must get the answer the model gave it.
/// Scripts/spin.sh checks the model itself exhaustively.
@Suite("SharedCall model: spin's traces replayed through SharedCallStateMachine", .timeLimit(.minutes(2)))
struct SharedCallModelTests {
    typealias Machine = SharedCallStateMachine

    typealias Step = SpinTrace.Step

    /// The model's outcome numbers.
    static func code(of outcome: Machine.Outcome) -> Int {
        switch outcome {
        case .success: 1
        case .failure(.cancelled): 2
        case .failure(.timedOut): 3
        case .failure: 99
        }
    }

    static func outcome(_ code: Int) -> Machine.Outcome {
        switch code {
        case 1: .success((Data(), ResponseHead(HTTPURLResponse(url: URL(fileURLWithPath: "/"), statusCode: 200, httpVersion: nil, headerFields: nil)!)))
        case 2: .failure(.cancelled)
        default: .failure(.timedOut)
        }
    }

    @Test(.enabled(if: SpinTrace.spin != nil, "spin is not installed (Debian package `spin`): the model's traces cannot be made"))
    func everyDecisionOfTheModelIsTheSwiftMachines() async throws {
        var kinds = Set<String>()
        var steps = 0
        for seed in 1...150 {
            let trace = try SpinTrace.simulate("SharedCall", seed: seed)
            #expect(trace.contains { $0.event == "install" }, "seed \(seed) made no trace")
            steps += trace.count
            try await replay(trace, seed: seed, kinds: &kinds)
        }
        // The seeds reach every kind of step, or the replay proves less than it says.
        let expected: Set<String> = [
            "join", "join refused", "install parked", "install answered", "leave", "leave answers", "leave cancels the task",
            "firstTask", "firstTask cancelled", "open", "claim", "claim lost", "timeout", "successor", "complete",
        ]
        #expect(kinds.isSuperset(of: expected), "missing: \(expected.subtracting(kinds))")
        #expect(steps > 1_500)
    }

    private func replay(_ trace: [Step], seed: Int, kinds: inout Set<String>) async throws {
        let machine = Locked(Machine())
        var tickets: [Int: Machine.Ticket] = [0: machine.withLock { $0.firstTicket }]
        var callers: [Int: Task<Machine.Outcome, Never>] = [:]
        var expectedAnswer: [Int: Int] = [:]
        let tasks: [Int: Task<Void, Never>] = [1: Task {}, 2: Task {}]
        func caller(of ticket: Machine.Ticket) -> Int? { tickets.first { $0.value == ticket }?.key }

        for step in trace {
            let context = "seed \(seed): \(step)"
            switch step.event {
            case "join":
                let ticket = machine.withLock { $0.join() }
                #expect((ticket != nil) == (step["ok"] == 1), "\(context)")
                if let ticket { tickets[step["c"]] = ticket }
                kinds.insert(ticket == nil ? "join refused" : "join")
            case "install":
                let c = step["c"]
                let ticket = try #require(tickets[c], "\(context)")
                // The caller suspends on a real continuation, as `SharedCall.wait` does.
                let (installed, report) = AsyncStream.makeStream(of: Machine.Outcome?.self)
                callers[c] = Task {
                    await withUnsafeContinuation { continuation in
                        let immediate = machine.withLock { $0.install(ticket, continuation) }
                        report.yield(immediate)
                        if let immediate { continuation.resume(returning: immediate) }
                    }
                }
                var reports = installed.makeAsyncIterator()
                let immediate = await reports.next() ?? nil
                #expect((immediate.map(Self.code) ?? 0) == step["immediate"], "\(context)")
                if step["immediate"] != 0 { expectedAnswer[c] = step["immediate"] }
                kinds.insert(immediate == nil ? "install parked" : "install answered")
            case "leave":
                let c = step["c"]
                let ticket = try #require(tickets[c], "\(context)")
                let departure = machine.withLock { $0.leave(ticket) }
                #expect((departure.waiter != nil) == (step["answered"] == 1), "\(context)")
                #expect(departure.taskToCancel == tasks[step["cancel"]], "\(context)")
                if let waiter = departure.waiter {
                    expectedAnswer[c] = 2
                    waiter.continuation.resume(returning: .failure(.cancelled))
                    kinds.insert("leave answers")
                }
                if departure.taskToCancel != nil { kinds.insert("leave cancels the task") }
                kinds.insert("leave")
            case "firstTask":
                let cancel = machine.withLock { $0.firstTaskStarted(tasks[1]!) }
                #expect(cancel == (step["cancel"] == 1), "\(context)")
                kinds.insert(cancel ? "firstTask cancelled" : "firstTask")
            case "successor":
                let cancel = machine.withLock { $0.taskStarted(tasks[2]!) }
                #expect(cancel == (step["cancel"] == 1), "\(context)")
                kinds.insert("successor")
            case "open":
                machine.withLock { $0.open(attempt: step["a"], permit: nil) }
                kinds.insert("open")
            case "claim":
                let claimed = machine.withLock { $0.claim(attempt: step["a"]) }
                #expect(claimed == (step["ok"] == 1), "\(context)")
                kinds.insert(claimed ? "claim" : "claim lost")
            case "timeout":
                let expired = machine.withLock { $0.timeOut(attempt: step["a"]) }
                #expect((expired != nil) == (step["ok"] == 1), "\(context)")
                if let expired {
                    #expect(expired.superseded == tasks[step["superseded"]], "\(context)")
                    #expect(expired.expired.abandoned == (step["abandoned"] == 1), "\(context)")
                    kinds.insert("timeout")
                }
            case "complete":
                let waiters = machine.withLock { $0.complete(Self.outcome(step["outcome"])) }
                if step["delivered"] == -1 {  // the model never completes twice; kept for a model that does
                    #expect(waiters == nil, "\(context)")
                } else {
                    let answered = (waiters ?? []).reduce(0) { bits, waiter in bits | (1 << (caller(of: waiter.ticket) ?? 30)) }
                    #expect(waiters != nil && answered == step["delivered"], "\(context)")
                    for waiter in waiters ?? [] {
                        if let c = caller(of: waiter.ticket) { expectedAnswer[c] = step["outcome"] }
                        waiter.continuation.resume(returning: Self.outcome(step["outcome"]))
                    }
                    kinds.insert("complete")
                }
            default:
                Issue.record("seed \(seed): a step the replay does not know: \(step)")
            }
        }
        // Every caller that suspended got exactly the answer the model gave it.
        for (c, task) in callers {
            let answer = await task.value
            #expect(Self.code(of: answer) == expectedAnswer[c], "seed \(seed): caller \(c)")
        }
    }
}
