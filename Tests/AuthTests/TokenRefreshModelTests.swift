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

    typealias Step = SpinTrace.Step

    struct ModelError: Error {}

    @Test(.enabled(if: SpinTrace.spin != nil, "spin is not installed (Debian package `spin`): the model's traces cannot be made"))
    func everyDecisionOfTheModelIsTheSwiftMachines() throws {
        var decisions = 0
        var kinds = Set<String>()
        for seed in 1...60 {
            let steps = try SpinTrace.simulate("TokenRefresh", seed: seed)
            #expect(steps.contains { $0.event == "read" }, "seed \(seed) made no trace")
            var machine = Machine(configuration: .init(maxRefreshes: 1_000, window: .zero, proactiveRefreshLead: .zero))
            for step in steps {
                switch step.event {
                case "read":
                    let provider = step[u: "provider"]
                    let token = provider == 0 ? nil : "t\(provider)"
                    let stamp = Machine.Stamp(generation: step[u: "sg"], epoch: step[u: "se"])
                    check(machine.tokenRead(token, stamp: stamp, now: .zero), step, seed: seed, kinds: &kinds)
                case "unauthorized":
                    let stamp = Machine.Stamp(generation: step[u: "sg"], epoch: step[u: "se"])
                    check(machine.unauthorized(stamp, now: .zero), step, seed: seed, kinds: &kinds)
                case "succeeded":
                    let completion = machine.refreshSucceeded(step[u: "id"], token: "t\(step[u: "result"])", expiresAt: nil, now: .zero)
                    check(completion, step, seed: seed)
                case "failed":
                    check(machine.refreshFailed(step[u: "id"], .refreshFailed(underlying: ModelError())), step, seed: seed)
                case "timedout":
                    check(machine.refreshTimedOut(step[u: "id"]), step, seed: seed)
                case "left":
                    let removed = machine.waiterLeft(step[u: "w"])
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
            token: "t\(step[u: "tok"])", stamp: Machine.Stamp(generation: step[u: "gen"], epoch: step[u: "epoch"]))
        switch (step[u: "act"], action) {
        case (1, .send(let token)):
            #expect(token == issued, "\(context)")
            kinds.insert("send")
        case (2, .sendAndReadExpiry(let token)):
            #expect(token == issued, "\(context)")
            kinds.insert("sendAndReadExpiry")
        case (4, .wait(let waiter)):
            #expect(waiter == step[u: "w"], "\(context)")
            kinds.insert("wait")
        case (5, .startRefreshAndWait(let waiter, let refresh)):
            #expect(waiter == step[u: "w"] && refresh == step[u: "r"], "\(context)")
            kinds.insert("startRefreshAndWait")
        case (6, .fail(let error)):
            #expect(Self.code(of: error) == step[u: "err"], "\(context)")
            kinds.insert("fail")
        default:
            Issue.record("the model and the machine decided differently: \(context)")
        }
    }

    private func check(_ completion: Machine.Completion, _ step: Step, seed: Int) {
        let context = "seed \(seed): \(step), Swift: \(completion)"
        let waiters = completion.waiters.reduce(UInt64(0)) { $0 | (1 << $1) }
        #expect(waiters == step[u: "waiters"], "\(context)")
        switch (step[u: "outcome"], completion.outcome) {
        case (1, .success(let token)):
            let issued = Machine.IssuedToken(token: "t\(step[u: "tok"])", stamp: Machine.Stamp(generation: step[u: "gen"], epoch: step[u: "epoch"]))
            #expect(token == issued, "\(context)")
        case (2, .failure(let error)):
            #expect(Self.code(of: error) == step[u: "err"], "\(context)")
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

extension SpinTrace.Step {
    /// A field as the machine's ids, generations and epochs are: unsigned.
    fileprivate subscript(u key: String) -> UInt64 { UInt64(clamping: self[key]) }
}
