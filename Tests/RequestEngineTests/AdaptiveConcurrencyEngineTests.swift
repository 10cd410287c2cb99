import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `Configuration.limits.adaptiveConcurrencyPerHost` on a scripted session and a ManualClock: places per host,
/// what shrinks the limit and what does not.
@Suite("AsyncRequestEngine: adaptive concurrency per host", .timeLimit(.minutes(1)))
struct AdaptiveConcurrencyEngineTests {
    static let url = URL(string: "https://api.example.test/resource")!

    static func engine(_ session: ScriptedNetworkSession, initial: Int, backoff: Double = 0.5, clock: ManualClock = ManualClock()) throws -> AsyncRequestEngine {
        AsyncRequestEngine(
            session: session,
            configuration: .init(
                limits: .init(
                    adaptiveConcurrencyPerHost: try .init(
                        algorithm: .aimd(backoff: backoff), minLimit: 1, maxLimit: 50, maxWaiting: 10, initialLimit: initial, interactiveShare: 0
                    ))), clock: clock)
    }

    @Test func attemptsBeyondTheHostsLimitWaitForAPlace() async throws {
        let session = ScriptedNetworkSession([.held(.ok("a")), .held(.ok("b")), .ok("c")])
        let engine = try Self.engine(session, initial: 2)
        #expect(engine.adaptiveConcurrencyLimiter(for: Self.url) == nil)  // none before the first request
        let requests = (0..<3).map { index in Task { try await engine.send(TestRequest(method: .post, body: Data([UInt8(index)]))) } }
        await session.waitForCalls(2)
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        await yieldUntil { limiter.waiting == 1 }
        #expect(limiter.inFlight == 2 && session.callCount == 2)
        session.releaseHeld()
        for request in requests { _ = try await request.value }
        #expect(session.callCount == 3)
        #expect(limiter.inFlight == 0)
    }

    @Test func a503ShrinksTheHostsLimitAndSuccessesInUseGrowIt() async throws {
        let session = ScriptedNetworkSession([.status(503), .ok(), .ok(), .ok()])
        let engine = try Self.engine(session, initial: 4)
        _ = try await engine.response(for: TestRequest())
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        #expect(limiter.currentLimit == 2)
        _ = try await engine.send(TestRequest())  // one in flight of two: in use
        #expect(limiter.currentLimit == 2)
        _ = try await engine.send(TestRequest())  // two successes in use, a limit's worth: +1
        #expect(limiter.currentLimit == 3)
        _ = try await engine.send(TestRequest())  // one of three: not in use
        #expect(limiter.currentLimit == 3)
    }

    @Test func anAttemptThatTimesOutIsADrop() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.hang])
        let engine = try Self.engine(session, initial: 8, clock: clock)
        let request = Task { await networkError { try await engine.send(TestRequest(timeout: 1)) } }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(1))
        #expect(await request.value?.caseName == "timedOut")
        await session.waitUntilNoneSuspended()
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        await yieldUntil { limiter.inFlight == 0 }
        #expect(limiter.currentLimit == 4)
    }

    @Test func aCallerThatCancelsIsNotADrop() async throws {
        let session = ScriptedNetworkSession([.hang])
        let engine = try Self.engine(session, initial: 8)
        let request = Task { await networkError { try await engine.send(TestRequest()) } }
        await session.waitForCalls(1)
        request.cancel()
        #expect(await request.value?.caseName == "cancelled")
        await session.waitUntilNoneSuspended()
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        await yieldUntil { limiter.inFlight == 0 }
        #expect(limiter.currentLimit == 8)
    }

    @Test func eachHostHasItsOwnLimit() async throws {
        let session = ScriptedNetworkSession([.status(503), .ok()])
        let engine = try Self.engine(session, initial: 4)
        _ = try await engine.response(for: TestRequest())
        let other = URL(string: "https://other.example.test/x")!
        _ = try await engine.send(TestRequest(url: other))
        #expect(engine.adaptiveConcurrencyLimiter(for: Self.url)?.currentLimit == 2)
        #expect(engine.adaptiveConcurrencyLimiter(for: other)?.currentLimit == 4)
    }

    @Test func aHedgeTakesTheBackgroundShare() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("first")), .ok("hedge")])
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(
                // One place, and it kept for interactive calls: the first copy takes it, a background copy waits.
                limits: .init(
                    adaptiveConcurrencyPerHost: try .init(algorithm: .aimd(), minLimit: 1, maxLimit: 50, maxWaiting: 10, initialLimit: 1, interactiveShare: 1)
                ),
                hedging: HedgingPolicy(delay: .milliseconds(100), maxAttempts: 2)
            ),
            clock: clock
        )
        let request = Task { try await engine.send(TestRequest()) }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)  // the hedge timer
        clock.advance(by: .milliseconds(100))
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        await yieldUntil { limiter.waiting == 1 }  // the hedge, waiting in the background share
        #expect(session.callCount == 1 && limiter.inFlight == 1)
        session.releaseHeld()
        let (data, _) = try await request.value
        #expect(String(decoding: data, as: UTF8.self) == "first")
        await yieldUntil { limiter.waiting == 0 && limiter.inFlight == 0 }
        #expect(session.callCount == 1)
    }

    /// A request of a given priority (each one a POST of its own: no deduplication).
    struct Prioritised: NetworkRequest {
        let number: Int
        let requestPriority: RequestPriority
        var url: URL { AdaptiveConcurrencyEngineTests.url }
        var method: HTTPMethod { .post }
        var body: Data? { Data([UInt8(number)]) }
        var timeout: TimeInterval { .infinity }
    }

    @Test func aBackgroundRequestTakesTheBackgroundShareAndAnInteractiveOneStillGetsAPlace() async throws {
        let session = ScriptedNetworkSession([.held(.ok()), .held(.ok()), .held(.ok()), .ok()])
        // Four places, two kept for interactive calls: two background calls run, a third waits.
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(
                limits: .init(
                    adaptiveConcurrencyPerHost: try .init(
                        algorithm: .aimd(), minLimit: 4, maxLimit: 4, maxWaiting: 10, initialLimit: 4, interactiveShare: 0.5
                    ))))
        let background = (0..<3).map { number in Task { try await engine.send(Prioritised(number: number, requestPriority: .background)) } }
        await session.waitForCalls(2)
        let limiter = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        await yieldUntil { limiter.waiting == 1 }
        #expect(session.callCount == 2 && limiter.inFlight == 2)
        let interactive = Task { try await engine.send(Prioritised(number: 9, requestPriority: .interactive)) }
        await session.waitForCalls(3)  // past the waiting background call, into its own share
        #expect(limiter.waiting == 1 && limiter.inFlight == 3)
        session.releaseHeld()
        _ = try await interactive.value
        for request in background { _ = try await request.value }
        #expect(session.callCount == 4 && limiter.inFlight == 0)
    }

    @Test func withAFixedLimitToo_anAttemptTakesBothPlaces() async throws {
        let session = ScriptedNetworkSession([.held(.ok()), .ok()])
        let engine = AsyncRequestEngine(
            session: session,
            configuration: .init(limits: .init(concurrencyPerHost: 1, adaptiveConcurrencyPerHost: try .init(algorithm: .aimd(), minLimit: 10, maxLimit: 10, maxWaiting: 10, interactiveShare: 0))))
        let first = Task { try await engine.send(Prioritised(number: 0, requestPriority: .interactive)) }
        await session.waitForCalls(1)
        let second = Task { try await engine.send(Prioritised(number: 1, requestPriority: .interactive)) }
        let adaptive = try #require(engine.adaptiveConcurrencyLimiter(for: Self.url))
        // The second holds its adaptive place and waits for the fixed one: it is not sent.
        await yieldUntil { adaptive.inFlight == 2 }
        #expect(session.callCount == 1)
        session.releaseHeld()
        _ = try await first.value
        _ = try await second.value
        #expect(session.callCount == 2 && adaptive.inFlight == 0)
    }

    @Test func theLimiterOutcomeOfEachResult() {
        let response = { (status: Int) in
            Result<(Data, ResponseHead), NetworkError>.success((Data(), ResponseHead(HTTPURLResponse(url: Self.url, statusCode: status, httpVersion: nil, headerFields: nil)!)))
        }
        #expect(RequestStateMachine.limiterOutcome(of: response(200), timedOut: false) == .success)
        #expect(RequestStateMachine.limiterOutcome(of: response(404), timedOut: false) == .success)
        #expect(RequestStateMachine.limiterOutcome(of: response(429), timedOut: false) == .dropped)
        #expect(RequestStateMachine.limiterOutcome(of: response(503), timedOut: false) == .dropped)
        #expect(RequestStateMachine.limiterOutcome(of: .failure(.transport(.connectionLost)), timedOut: false) == .dropped)
        #expect(RequestStateMachine.limiterOutcome(of: .failure(.timedOut), timedOut: false) == .dropped)
        #expect(RequestStateMachine.limiterOutcome(of: .failure(.cancelled), timedOut: true) == .dropped)
        #expect(RequestStateMachine.limiterOutcome(of: .failure(.cancelled), timedOut: false) == .ignored)
        #expect(RequestStateMachine.limiterOutcome(of: .failure(.responseTooLarge(limit: 1, statusCode: 200)), timedOut: false) == .ignored)
    }
}
