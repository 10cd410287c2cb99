import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `HedgeRace` performing `RequestStateMachine.HedgedAttempt`'s steps: the copies run in tasks of
/// their own, the first acceptable answer resumes the attempt at once and the other copies are
/// cancelled. Time is a `ManualClock`; a copy's answer is held behind a `Gate`.
@Suite("HedgeRace: an attempt's hedged copies in their tasks", .timeLimit(.minutes(1)))
struct HedgeRaceTests {
    private static let url = URL(string: "https://api.example.test/items")!

    private static func answer(_ status: Int) -> HedgeRace.Answer {
        .success((Data(), ResponseHead(HTTPURLResponse(url: url, statusCode: status, httpVersion: nil, headerFields: nil)!)))
    }

    /// The status of the race's answer; `nil` when it is a failure.
    private static func status(of answer: HedgeRace.Answer) -> Int? {
        guard case .success(let (_, response)) = answer else { return nil }
        return response.statusCode
    }

    /// What each copy did: sent, then answered or cancelled.
    private final class Copies: Sendable {
        let sent = Log<Int>()
        let cancelled = Log<Int>()
        let gates = [Gate(), Gate(), Gate()]
        /// Copy N answers `answers[N]` once its gate opens; a copy cancelled first answers `.cancelled`.
        let answers: [HedgeRace.Answer]

        init(_ answers: [HedgeRace.Answer]) { self.answers = answers }

        func send(_ copy: Int) async -> HedgeRace.Answer {
            sent.append(copy)
            await gates[copy].wait()
            if Task.isCancelled {
                cancelled.append(copy)
                return .failure(.cancelled)
            }
            return answers[copy]
        }
    }

    private func race(_ copies: Copies, clock: ManualClock, maxAttempts: Int = 2, mayHedge: @escaping @Sendable () -> Bool = { true }) -> HedgeRace {
        HedgeRace(
            policy: HedgingPolicy(delay: .milliseconds(100), maxAttempts: maxAttempts),
            time: TimeSource(clock),
            send: { await copies.send($0) },
            mayHedge: mayHedge,
            onHedge: nil
        )
    }

    @Test func theHedgesAnswerWinsAndTheSlowFirstCopyIsCancelled() async {
        let clock = ManualClock()
        let copies = Copies([Self.answer(200), Self.answer(201)])
        let race = race(copies, clock: clock)
        let running = Task { await race.run() }
        await yieldUntil { copies.sent.count == 1 }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))  // the hedge delay: copy 1 goes
        await yieldUntil { copies.sent.count == 2 }
        copies.gates[1].open()
        #expect(Self.status(of: await running.value) == 201)
        copies.gates[0].open()  // copy 0 was cancelled by the decision; it answers cancelled
        await yieldUntil { copies.cancelled.count == 1 }
        #expect(copies.cancelled.values == [0])
    }

    @Test func aFirstCopyThatAnswersBeforeTheDelaySendsNoHedge() async {
        let clock = ManualClock()
        let copies = Copies([Self.answer(200), Self.answer(201)])
        let race = race(copies, clock: clock)
        let running = Task { await race.run() }
        await yieldUntil { copies.sent.count == 1 }
        copies.gates[0].open()
        #expect(Self.status(of: await running.value) == 200)
        await yieldUntil { clock.sleeperCount == 0 }  // the hedge timer was cancelled with the decision
        clock.advance(by: .seconds(1))
        #expect(copies.sent.values == [0])
    }

    /// Race guarded: the attempt cancelled before the race installs its continuation. The
    /// decision is taken as it installs; no copy is sent.
    @Test func anAttemptCancelledBeforeItRunsAnswersCancelledAndSendsNothing() async {
        let clock = ManualClock()
        let copies = Copies([Self.answer(200), Self.answer(201)])
        let race = race(copies, clock: clock)
        let gate = Gate()
        let running = Task {
            await gate.wait()  // returns once cancelled
            return await race.run()
        }
        running.cancel()
        gate.open()
        guard case .failure(.cancelled) = await running.value else {
            Issue.record("expected cancelled")
            return
        }
        #expect(copies.sent.count == 0)
    }

    @Test func whenEveryCopyFailsTheNextGoesAtOnceWithoutWaitingForTheDelay() async {
        let clock = ManualClock()
        let copies = Copies([Self.answer(503), Self.answer(200)])
        let race = race(copies, clock: clock)
        let running = Task { await race.run() }
        await yieldUntil { copies.sent.count == 1 }
        copies.gates[0].open()  // a retryable failure, and no other copy out: copy 1 goes now
        await yieldUntil { copies.sent.count == 2 }
        #expect(clock.now == .init(offset: .zero))
        copies.gates[1].open()
        #expect(Self.status(of: await running.value) == 200)
    }
}
