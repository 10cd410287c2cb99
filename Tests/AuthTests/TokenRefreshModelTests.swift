import Foundation
import ResilienceTestSupport
import Testing

@testable import Auth

/// Keeps Models/TokenRefresh.pml and `TokenRefreshStateMachine` from drifting apart: spin runs
/// random simulations of the model (one per seed), and every decision in the model's trace —
/// each token read, 401, refresh result, timeout and cancelled waiter — is fed to the Swift
/// machine, which must decide the same: the same action, waiter and refresh ids, token and stamp;
/// the same waiters answered with the same outcome. Scripts/spin.sh checks the model itself
/// exhaustively.
@Suite("TokenRefresh model: spin's traces replayed through TokenRefreshStateMachine", .timeLimit(.minutes(2)))
struct TokenRefreshModelTests {
    typealias Machine = TokenRefreshStateMachine

    static let spin: String? = ["/usr/bin/spin", "/usr/local/bin/spin", "/opt/homebrew/bin/spin"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    static let model = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Models/TokenRefresh.pml").path

    struct ModelError: Error {}

    /// One `TRACE` line: its event and its `key=value` fields.
    struct Step: CustomStringConvertible {
        let event: String
        let fields: [String: UInt64]
        let line: String
        var description: String { line }

        init?(_ line: Substring) {
            let words = line.split(separator: " ")
            guard words.count >= 2, words[0] == "TRACE" else { return nil }
            event = String(words[1])
            var fields: [String: UInt64] = [:]
            for word in words.dropFirst(2) {
                let pair = word.split(separator: "=", maxSplits: 1)
                if pair.count == 2, let value = UInt64(pair[1]) { fields[String(pair[0])] = value }
            }
            self.fields = fields
            self.line = String(line)
        }

        subscript(_ key: String) -> UInt64 { fields[key] ?? .max }
    }

    static func trace(seed: Int) throws -> [Step] {
        let spin = try #require(Self.spin)
        let (termination, output) = try SpawnedProcess.run(spin, ["-T", "-n\(seed)", model])
        #expect(termination == .exited(0), "spin -n\(seed) failed: \(String(decoding: output, as: UTF8.self).suffix(500))")
        let text = String(decoding: output, as: UTF8.self)
        #expect(!text.contains("assertion violated"), "seed \(seed): \(text.suffix(800))")
        return text.split(separator: "\n").compactMap(Step.init)
    }

    @Test(.enabled(if: spin != nil, "spin is not installed (Debian package `spin`): the model's traces cannot be made"))
    func everyDecisionOfTheModelIsTheSwiftMachines() throws {
        var decisions = 0
        var kinds = Set<String>()
        for seed in 1...60 {
            let steps = try Self.trace(seed: seed)
            #expect(steps.contains { $0.event == "read" }, "seed \(seed) made no trace")
            var machine = Machine(configuration: .init(maxRefreshes: 1_000, window: .zero, proactiveRefreshLead: .zero))
            for step in steps {
                switch step.event {
                case "read":
                    let provider = step["provider"]
                    let token = provider == 0 ? nil : "t\(provider)"
                    let stamp = Machine.Stamp(generation: step["sg"], epoch: step["se"])
                    check(machine.tokenRead(token, stamp: stamp, now: .zero), step, seed: seed, kinds: &kinds)
                case "unauthorized":
                    let stamp = Machine.Stamp(generation: step["sg"], epoch: step["se"])
                    check(machine.unauthorized(stamp, now: .zero), step, seed: seed, kinds: &kinds)
                case "succeeded":
                    let completion = machine.refreshSucceeded(step["id"], token: "t\(step["result"])", expiresAt: nil, now: .zero)
                    check(completion, step, seed: seed)
                case "failed":
                    check(machine.refreshFailed(step["id"], .refreshFailed(underlying: ModelError())), step, seed: seed)
                case "timedout":
                    check(machine.refreshTimedOut(step["id"]), step, seed: seed)
                case "left":
                    let removed = machine.waiterLeft(step["w"])
                    #expect(removed, "seed \(seed): \(step)")
                case "expired":
                    continue
                default:
                    Issue.record("seed \(seed): an event the replay does not know: \(step)")
                }
                kinds.insert(step.event)
                decisions += 1
            }
        }
        // The seeds reach every kind of decision, or the replay proves less than it says.
        #expect(kinds.isSuperset(of: ["read", "unauthorized", "succeeded", "failed", "timedout", "left", "send", "sendAndReadExpiry", "wait", "startRefreshAndWait", "fail"]), "\(kinds)")
        #expect(decisions > 300)
    }

    private func check(_ action: Machine.Action, _ step: Step, seed: Int, kinds: inout Set<String>) {
        let context = "seed \(seed): \(step), Swift: \(action)"
        let issued = Machine.IssuedToken(
            token: "t\(step["tok"])", stamp: Machine.Stamp(generation: step["gen"], epoch: step["epoch"]))
        switch (step["act"], action) {
        case (1, .send(let token)):
            #expect(token == issued, "\(context)")
            kinds.insert("send")
        case (2, .sendAndReadExpiry(let token)):
            #expect(token == issued, "\(context)")
            kinds.insert("sendAndReadExpiry")
        case (4, .wait(let waiter)):
            #expect(waiter == step["w"], "\(context)")
            kinds.insert("wait")
        case (5, .startRefreshAndWait(let waiter, let refresh)):
            #expect(waiter == step["w"] && refresh == step["r"], "\(context)")
            kinds.insert("startRefreshAndWait")
        case (6, .fail(let error)):
            #expect(Self.code(of: error) == step["err"], "\(context)")
            kinds.insert("fail")
        default:
            Issue.record("the model and the machine decided differently: \(context)")
        }
    }

    private func check(_ completion: Machine.Completion, _ step: Step, seed: Int) {
        let context = "seed \(seed): \(step), Swift: \(completion)"
        let waiters = completion.waiters.reduce(UInt64(0)) { $0 | (1 << $1) }
        #expect(waiters == step["waiters"], "\(context)")
        switch (step["outcome"], completion.outcome) {
        case (1, .success(let token)):
            let issued = Machine.IssuedToken(token: "t\(step["tok"])", stamp: Machine.Stamp(generation: step["gen"], epoch: step["epoch"]))
            #expect(token == issued, "\(context)")
        case (2, .failure(let error)):
            #expect(Self.code(of: error) == step["err"], "\(context)")
        default:
            Issue.record("the model and the machine ended a refresh differently: \(context)")
        }
    }

    /// The model's error numbers.
    private static func code(of error: AuthError) -> UInt64 {
        switch error {
        case .refreshFailed: 1
        case .refreshTimedOut: 2
        default: 99
        }
    }
}
