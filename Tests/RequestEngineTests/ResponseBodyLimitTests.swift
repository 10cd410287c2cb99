import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The body-size limit as the engine applies it, over a scripted session whose bodies arrive
/// whole (the default `NetworkSession.data(for:maximumBodySize:)` checks them afterwards), and the
/// transfer state machine that lets `URLSessionTransport` stop a body while it arrives.
@Suite("Response body size limit")
struct ResponseBodyLimitTests {
    private static func body(_ count: Int) -> Data { Data(repeating: 0x62, count: count) }

    @Test func theDefaultLimitIs16MiB() {
        #expect(AsyncRequestEngine.Configuration().maximumResponseBodySize == 16 * 1024 * 1024)
        #expect(AsyncRequestEngine(configuration: .init(maximumResponseBodySize: -5)).configuration.maximumResponseBodySize == 0)
        #expect(AsyncRequestEngine(configuration: .init(maximumResponseBodySize: nil)).configuration.maximumResponseBodySize == nil)
    }

    @Test func aBodyOverTheEnginesLimitFailsTypedAndIsNotRetried() async {
        let session = ScriptedNetworkSession([.respond(status: 200, body: Self.body(11)), .ok("small")])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(
            session: session, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 3, interval: 0)), maximumResponseBodySize: 10, eventSink: recorder), clock: ManualClock())
        let error = await networkError { try await engine.send(TestRequest()) }
        #expect(error?.caseName == "responseTooLarge(10)")
        #expect(error?.isRetryable == false)
        #expect(session.callCount == 1)
        #expect(recorder.timeline == ["started", "failed(response body larger than 10 bytes (HTTP 200),0)"])
    }

    @Test func aBodyOfExactlyTheLimitIsAccepted() async throws {
        let session = ScriptedNetworkSession([.respond(status: 200, body: Self.body(10))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: 10), clock: ManualClock())
        #expect(try await engine.send(TestRequest()).0.count == 10)
    }

    @Test func theRequestsLimitReplacesTheEnginesEitherWay() async throws {
        let session = ScriptedNetworkSession([.respond(status: 200, body: Self.body(100))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: 10), clock: ManualClock())
        var larger = TestRequest("/larger")
        larger.maximumResponseBodySize = 100
        #expect(try await engine.send(larger).0.count == 100)
        var unlimited = TestRequest("/unlimited")
        unlimited.maximumResponseBodySize = .max
        #expect(try await engine.send(unlimited).0.count == 100)

        let roomy = AsyncRequestEngine(session: session, clock: ManualClock())  // 16 MiB
        var smaller = TestRequest("/smaller")
        smaller.maximumResponseBodySize = 99
        #expect(await networkError { try await roomy.send(smaller) }?.caseName == "responseTooLarge(99)")
    }

    @Test func withoutAnEngineLimitAnyBodyIsAccepted() async throws {
        let session = ScriptedNetworkSession([.respond(status: 200, body: Self.body(17 * 1024 * 1024))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(maximumResponseBodySize: nil), clock: ManualClock())
        #expect(try await engine.send(TestRequest()).0.count == 17 * 1024 * 1024)
    }

    @Test func aNegativeRequestLimitIsAnInvalidRequestAndNothingIsSent() async {
        let session = ScriptedNetworkSession([.ok()])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        var request = TestRequest()
        request.maximumResponseBodySize = -1
        #expect(await networkError { try await engine.send(request) }?.caseName == "invalidRequest")
        #expect(session.callCount == 0)
    }

    @Test func anOversizedBodyDoesNotCountAgainstTheCircuitBreaker() async {
        let breaker = CircuitBreaker(configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5), clock: ManualClock())
        let session = ScriptedNetworkSession([.respond(status: 200, body: Self.body(2))])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .shared(breaker), maximumResponseBodySize: 1), clock: ManualClock())
        for _ in 0..<4 {
            #expect(await networkError { try await engine.send(TestRequest()) }?.caseName == "responseTooLarge(1)")
        }
        #expect(breaker.state == .closed)
        #expect(session.callCount == 4)
    }

    @Test func identicalReadsWithDifferentLimitsDoNotShareACall() async throws {
        let session = ScriptedNetworkSession([.held(.respond(status: 200, body: Self.body(50)))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        var strict = TestRequest()
        strict.maximumResponseBodySize = 10
        let roomy = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(1)
        let sameAsRoomy = Task { try await engine.send(TestRequest()) }
        await recorder.waitForDeduplicated(1)
        let tight = Task { await networkError { try await engine.send(strict) } }
        await session.waitForCalls(2)  // its own call: sharing would have handed it the 50-byte body
        session.releaseHeld()
        #expect(try await roomy.value.0.count == 50)
        #expect(try await sameAsRoomy.value.0.count == 50)
        #expect(await tight.value?.caseName == "responseTooLarge(10)")
        #expect(session.callCount == 2)
    }

    @Test func theErrorsDescriptionCarriesOnlyTheLimit() {
        #expect(NetworkError.responseTooLarge(limit: 1024, statusCode: 200).description == "response body larger than 1024 bytes (HTTP 200)")
    }
}

/// `TransferStateMachine` on its own: what `URLSessionTransport` does with each event.
@Suite("Transfer state machine")
struct TransferStateMachineTests {
    /// A task that only counts what is done to it.
    final class CountingTask: TransferTask {
        let taskIdentifier = 1
        let calls = Locked<[String]>([])
        func resume() { calls.withLock { $0.append("resume") } }
        func cancel() { calls.withLock { $0.append("cancel") } }
    }

    private static func response(status: Int = 200, contentLength: Int? = nil) -> HTTPURLResponse {
        let url = URL(string: "https://api.example.test/file")!
        let headers = contentLength.map { ["Content-Length": String($0)] } ?? [:]
        return HTTPURLResponse(url: url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: headers)!
    }

    /// Runs `events` against a started machine and returns the caller's result, the actions'
    /// names, and the bytes the machine still holds.
    private static func run(
        limit: Int?,
        expectsBody: Bool = true,
        _ events: @escaping @Sendable (inout TransferStateMachine) -> [TransferStateMachine.Action]
    ) async -> (result: Result<Data, any Error>, actions: [String], buffered: Int) {
        let machine = Locked(TransferStateMachine(limit: limit, expectsBody: expectsBody))
        let actions = Locked<[String]>([])
        let task = CountingTask()
        let result: Result<Data, any Error> = await withCheckedContinuation { outer in
            Task {
                do {
                    let (data, _) = try await withUnsafeThrowingContinuation { continuation in
                        var all = [machine.withLock { $0.start(continuation) }, machine.withLock { $0.taskMade(task) }]
                        all += machine.withLock { events(&$0) }
                        for action in all {
                            actions.withLock { $0.append(Self.name(of: action)) }
                            switch action {
                            case .none, .makeTask, .resume, .cancel: break
                            case .answer(let continuation, let result), .answerAndCancel(let continuation, let result, _):
                                continuation.resume(with: result)
                            }
                        }
                    }
                    outer.resume(returning: .success(data))
                } catch {
                    outer.resume(returning: .failure(error))
                }
            }
        }
        return (result, actions.withLock { $0 }, machine.withLock { $0.bufferedByteCount })
    }

    private static func name(of action: TransferStateMachine.Action) -> String {
        switch action {
        case .none: "none"
        case .makeTask: "makeTask"
        case .resume: "resume"
        case .cancel: "cancel"
        case .answer: "answer"
        case .answerAndCancel: "answerAndCancel"
        }
    }

    private static func limitError(_ result: Result<Data, any Error>) -> Int? {
        if case .failure(NetworkError.responseTooLarge(let limit, _)) = result { return limit }
        return nil
    }

    @Test func aContentLengthOverTheLimitFailsBeforeAnyBodyByte() async {
        let outcome = await Self.run(limit: 100) { machine in
            [machine.receive(response: Self.response(contentLength: 101)), machine.receive(data: Data(count: 10))]
        }
        #expect(Self.limitError(outcome.result) == 100)
        #expect(outcome.actions == ["makeTask", "resume", "answerAndCancel", "none"])
        #expect(outcome.buffered == 0)
    }

    @Test func aContentLengthDoesNotFailAResponseWithoutABody() async {
        for (status, expectsBody) in [(200, false), (204, true), (304, true)] {
            let outcome = await Self.run(limit: 10, expectsBody: expectsBody) { machine in
                [
                    machine.receive(response: Self.response(status: status, contentLength: 1_000_000)),
                    machine.complete(data: nil, response: nil, error: nil),
                ]
            }
            #expect((try? outcome.result.get()) == Data(), "status \(status), HEAD \(!expectsBody)")
        }
    }

    @Test func theChunkThatCrossesTheLimitFailsTheTransferAndLaterBytesAreDropped() async {
        let outcome = await Self.run(limit: 25) { machine in
            [
                machine.receive(response: Self.response()),
                machine.receive(data: Data(count: 10)),
                machine.receive(data: Data(count: 15)),  // exactly 25: still fine
                machine.receive(data: Data(count: 1)),  // 26: over
                machine.receive(data: Data(count: 1_000)),
                machine.complete(data: nil, response: nil, error: URLError(.cancelled)),
            ]
        }
        #expect(Self.limitError(outcome.result) == 25)
        #expect(outcome.actions == ["makeTask", "resume", "none", "none", "none", "answerAndCancel", "none", "none"])
        #expect(outcome.buffered == 0)
    }

    @Test func aBodyOfExactlyTheLimitCompletes() async {
        let outcome = await Self.run(limit: 25) { machine in
            [
                machine.receive(response: Self.response(contentLength: 25)),
                machine.receive(data: Data(count: 25)),
                machine.complete(data: nil, response: nil, error: nil),
            ]
        }
        #expect((try? outcome.result.get())?.count == 25)
    }

    @Test func aCancelledTransferAnswersAtOnceAndDropsEverythingAfter() async {
        let outcome = await Self.run(limit: nil) { machine in
            [
                machine.receive(response: Self.response()),
                machine.receive(data: Data(count: 10)),
                machine.cancel(),
                machine.receive(data: Data(count: 1_000_000)),
                machine.cancel(),
                machine.complete(data: nil, response: nil, error: URLError(.cancelled)),
            ]
        }
        #expect((outcome.result.failure as? URLError)?.code == .cancelled)
        #expect(outcome.actions == ["makeTask", "resume", "none", "none", "answerAndCancel", "none", "none", "none"])
        #expect(outcome.buffered == 0)
    }

    /// Runs `body` inside a continuation and returns what the caller was answered.
    private static func answer(
        _ body: @escaping @Sendable (TransferStateMachine.Continuation) -> Void
    ) async -> (any Error)? {
        await withCheckedContinuation { outer in
            Task {
                do {
                    _ = try await withUnsafeThrowingContinuation(body)
                    outer.resume(returning: nil)
                } catch {
                    outer.resume(returning: error)
                }
            }
        }
    }

    /// Does what `SessionTransfer` does with `action`, but making tasks.
    private static func perform(_ action: TransferStateMachine.Action) {
        switch action {
        case .none, .makeTask: break
        case .resume(let task): task.resume()
        case .cancel(let task): task.cancel()
        case .answer(let continuation, let result): continuation.resume(with: result)
        case .answerAndCancel(let continuation, let result, let task):
            continuation.resume(with: result)
            task.cancel()
        }
    }

    @Test func aCancelBeforeTheStartAnswersAtOnceAndNoTaskIsMade() async {
        let machine = Locked(TransferStateMachine(limit: nil))
        let actions = Locked<[String]>([])
        let error = await Self.answer { continuation in
            let cancelled = machine.withLock { $0.cancel() }
            let started = machine.withLock { $0.start(continuation) }
            actions.withLock { $0 = [cancelled, started].map(Self.name(of:)) }
            Self.perform(started)
        }
        #expect((error as? URLError)?.code == .cancelled)
        #expect(actions.withLock { $0 } == ["none", "answer"])  // answered, and no `makeTask`
    }

    @Test func aCancelWhileTheTaskIsMadeAnswersAtOnceAndTheTaskIsCancelledNotResumed() async {
        let machine = Locked(TransferStateMachine(limit: nil))
        let task = CountingTask()
        let actions = Locked<[String]>([])
        let error = await Self.answer { continuation in
            let started = machine.withLock { $0.start(continuation) }
            // The caller is cancelled before the task exists (it is made on another thread).
            let cancelled = machine.withLock { $0.cancel() }
            let late = machine.withLock { $0.taskMade(task) }
            actions.withLock { $0 = [started, cancelled, late].map(Self.name(of:)) }
            Self.perform(cancelled)
            Self.perform(late)
        }
        #expect((error as? URLError)?.code == .cancelled)
        #expect(actions.withLock { $0 } == ["makeTask", "answer", "cancel"])
        #expect(task.calls.withLock { $0 } == ["cancel"])  // never resumed
    }
}
