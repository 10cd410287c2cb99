import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `NetworkRequest.operationID`, `retryable` and `cacheable` (the request's own say on its
/// breaker and on repeats; the cache's side is in ResponseCacheTests), on a scripted session.
@Suite("AsyncRequestEngine: a request's operation, retryable and breaker", .timeLimit(.minutes(1)))
struct RequestOperationTests {
    static let retryNow = FixedIntervalRetryPolicy(maxRetries: 2, interval: 0)

    @Test func retryableTrueRetriesAPOSTWithoutAnIdempotencyKey() async throws {
        let session = ScriptedNetworkSession([.status(503), .status(503), .ok("made")])
        let engine = AsyncRequestEngine(session: session, retryPolicy: Self.retryNow, clock: ManualClock())
        var request = PreparedRequest(TestRequest(method: .post))
        #expect(await networkError { try await engine.send(request) }?.caseName == "httpError(503)")
        #expect(session.callCount == 1)  // the method's rule: a POST without a key is sent once
        request.retryable = true
        let (data, _) = try await engine.send(request)
        #expect(String(decoding: data, as: UTF8.self) == "made")
        #expect(session.callCount == 3)
    }

    @Test func retryableFalseSendsEvenAKeyedRequestOrAGETOnce() async throws {
        let session = ScriptedNetworkSession([.status(503)])
        let engine = AsyncRequestEngine(session: session, retryPolicy: Self.retryNow, clock: ManualClock())
        let keyed = PreparedRequest(url: TestRequest().url, method: .post, headers: ["Idempotency-Key": "k"], retryable: false)
        #expect(await networkError { try await engine.send(keyed) }?.caseName == "httpError(503)")
        let get = PreparedRequest(url: TestRequest().url, retryable: false)
        #expect(await networkError { try await engine.send(get) }?.caseName == "httpError(503)")
        #expect(session.callCount == 2)
    }

    @Test func retryableFalseIsNeverHedged() async throws {
        let clock = ManualClock()
        let session = ScriptedNetworkSession([.held(.ok("first")), .ok("hedge"), .held(.ok("once"))])
        var configuration = AsyncRequestEngine.Configuration()
        configuration.hedging = HedgingPolicy(delay: .milliseconds(100), maxAttempts: 2)
        let engine = AsyncRequestEngine(session: session, configuration: configuration, clock: clock)
        // The control: a GET is hedged once its first attempt is late.
        let hedged = Task { try await engine.send(PreparedRequest(url: TestRequest().url, timeout: .infinity)) }
        await session.waitForCalls(1)
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(100))
        #expect(String(decoding: try await hedged.value.0, as: UTF8.self) == "hedge")
        session.releaseHeld()
        // Declared not retryable: one attempt, however late.
        let once = Task { try await engine.send(PreparedRequest(url: TestRequest("/other").url, timeout: .infinity, retryable: false)) }
        await session.waitForCalls(3)
        clock.advance(by: .seconds(1))
        session.releaseHeld()
        #expect(String(decoding: try await once.value.0, as: UTF8.self) == "once")
        #expect(session.callCount == 3)
    }

    @Test func perOperationBreakersOpenForTheFailingOperationOnly() async throws {
        let clock = ManualClock()
        let registry = CircuitBreakerRegistry(
            configuration: .init(windowSize: 2, minimumCalls: 2, failureRateThreshold: 0.5, openDuration: .seconds(30)), clock: clock)
        let session = ScriptedNetworkSession([.status(500), .status(500), .ok("fine")])
        let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perOperation(registry)), clock: clock)
        let failing = PreparedRequest(url: TestRequest("/notes").url, operationID: "listNotes")
        _ = await networkError { try await engine.send(failing) }
        _ = await networkError { try await engine.send(failing) }
        #expect(await networkError { try await engine.send(failing) }?.caseName == "circuitOpen")
        #expect(session.callCount == 2)
        // The same host, another operation, and a request without one (its host's breaker).
        _ = try await engine.send(PreparedRequest(url: TestRequest("/notes/1").url, operationID: "getNote"))
        _ = try await engine.send(TestRequest("/health"))
        #expect(registry.states["api.example.test listNotes"] == .open)
        #expect(registry.states["api.example.test getNote"] == .closed)
        #expect(registry.states["api.example.test"] == .closed)
    }

    @Test func anOperationsBreakerIsItsHostsKeepsItsCaseAndIsNeverAHosts() {
        let registry = CircuitBreakerRegistry()
        let getNote = registry.breaker(forOperation: "getNote", onHost: "a.example.test")
        #expect(getNote === registry.breaker(forOperation: "getNote", onHost: "A.example.test"))
        #expect(getNote !== registry.breaker(forOperation: "GetNote", onHost: "a.example.test"))
        #expect(getNote !== registry.breaker(forOperation: "getNote", onHost: "b.example.test"))
        #expect(registry.breaker(forOperation: "", onHost: "example.test") !== registry.breaker(forHost: "example.test"))
    }

    @Test func requestsOfDifferentOperationsOrRetryRulesNeverShareACall() async throws {
        let session = ScriptedNetworkSession([.held(.ok("a")), .held(.ok("b")), .held(.ok("c"))])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let url = TestRequest().url
        let calls = [
            PreparedRequest(url: url, operationID: "one"), PreparedRequest(url: url, operationID: "two"),
            PreparedRequest(url: url, operationID: "one", retryable: false),
        ].map { request in Task { try await engine.send(request) } }
        await session.waitForCalls(3)
        session.releaseHeld()
        for call in calls { _ = try await call.value }
        #expect(session.callCount == 3)
    }

    @Test func startedAndDeduplicatedEventsCarryTheOperation() async throws {
        let session = ScriptedNetworkSession([.held(.ok("notes"))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let request = PreparedRequest(url: TestRequest("/notes").url, timeout: .infinity, operationID: "listNotes")
        let first = Task { try await engine.send(request) }
        await session.waitForCalls(1)
        let second = Task { try await engine.send(request) }
        await recorder.waitForDeduplicated(1)
        session.releaseHeld()
        _ = try await (first.value, second.value)
        let tagged = recorder.operations
        let operations = recorder.events.enumerated().compactMap { index, event -> String? in
            switch event {
            case .started: "started " + (tagged[index] ?? "-")
            case .deduplicated: "deduplicated " + (tagged[index] ?? "-")
            default: tagged[index].map { "\(event) " + $0 }  // no other event carries one
            }
        }
        #expect(operations == ["started listNotes", "deduplicated listNotes"])
    }

    @Test func aPreparedRequestKeepsTheOperationAndItsSay() {
        struct Operation: NetworkRequest {
            let url = URL(string: "https://api.example.test/notes")!
            let method = HTTPMethod.post
            let operationID: String? = "createNote"
            let retryable: Bool? = true
            let cacheable: Bool? = false
        }
        let prepared = PreparedRequest(Operation())
        #expect(prepared.operationID == "createNote")
        #expect(prepared.retryable == true)
        #expect(prepared.cacheable == false)
        #expect(PreparedRequest(TestRequest()).operationID == nil)
    }
}
