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

@Suite("AsyncRequestEngine: single-flight deduplication and cancellation", .timeLimit(.minutes(1)))
struct AsyncRequestEngineDeduplicationTests {
    @Test func eachPropertyOfARequestIsReadOnceAndTheSentRequestAgreesWithTheIdentity() async throws {
        // A request that counts reads and makes up a fresh Idempotency-Key at each read of
        // `headers`: read more than once, its identity, its retry eligibility and the request on
        // the wire could each see another key.
        for method in [HTTPMethod.get, .post] {
            let session = ScriptedNetworkSession([.status(503), .ok()])
            let engine = AsyncRequestEngine(session: session, retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0), clock: ManualClock())
            let request = ShiftingRequest(method: method)
            _ = try await engine.send(request)
            #expect(request.reads == ["url": 1, "method": 1, "headers": 1, "body": 1, "timeout": 1])
            // The POST was retried (it had a key when read) with the same key on both attempts.
            let keys = session.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") }
            #expect(keys.count == 2 && keys[0] != nil && keys[0] == keys[1])
        }
    }

    @Test func concurrentIdenticalGETsShareOneCall() async throws {
        let session = ScriptedNetworkSession([.held(.ok("shared"))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let results = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<100 {
                group.addTask { String(decoding: try await engine.send(TestRequest()).0, as: UTF8.self) }
            }
            await recorder.waitForDeduplicated(99)
            await session.waitForCalls(1)
            session.releaseHeld()
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(results == Array(repeating: "shared", count: 100))
        #expect(session.callCount == 1)
        #expect(recorder.events.filter(\.isDeduplicated).count == 99)
        #expect(engine.inFlightCount == 0)
    }

    @Test func aSendAfterCompletionStartsAFreshCall() async throws {
        let session = ScriptedNetworkSession([.ok("1"), .ok("2")])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        _ = try await engine.send(TestRequest())
        let (second, _) = try await engine.send(TestRequest())
        #expect(String(decoding: second, as: UTF8.self) == "2")
        #expect(session.callCount == 2)
    }

    @Test func differentAuthorizationValuesNeverShare() async throws {
        let session = ScriptedNetworkSession([.held(.ok())])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        async let a = engine.send(TestRequest(headers: ["Authorization": "Bearer alice"]))
        async let b = engine.send(TestRequest(headers: ["Authorization": "Bearer bob"]))
        async let c = engine.send(TestRequest(headers: ["authorization": "Bearer alice"]))  // same as a: names are case-insensitive
        await session.waitForCalls(2)
        await recorder.waitForDeduplicated(1)
        session.releaseHeld()
        _ = try await (a, b, c)
        #expect(session.callCount == 2)
        let sent = Set(session.requests.compactMap { $0.value(forHTTPHeaderField: "Authorization") })
        #expect(sent == ["Bearer alice", "Bearer bob"])
    }

    @Test func identityCoversMethodURLQueryHeadersAndBody() {
        let base = RequestIdentity(TestRequest("/x?a=1"))
        #expect(base == RequestIdentity(TestRequest("/x?a=1", timeout: 3)))
        #expect(base != RequestIdentity(TestRequest("/x?a=2")))
        #expect(base != RequestIdentity(TestRequest("/x?a=1", method: .head)))
        #expect(base != RequestIdentity(TestRequest("/x?a=1", headers: ["Accept": "text/plain"])))
        #expect(base != RequestIdentity(TestRequest("/x?a=1", body: Data("b".utf8))))
        #expect(RequestIdentity(TestRequest(headers: ["X-A": "1"])) == RequestIdentity(TestRequest(headers: ["x-a": "1"])))
    }

    @Test func postsAreNotDeduplicatedByDefault() async throws {
        let session = ScriptedNetworkSession([.held(.ok())])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        async let a = engine.send(TestRequest(method: .post, body: Data("same".utf8)))
        async let b = engine.send(TestRequest(method: .post, body: Data("same".utf8)))
        await session.waitForCalls(2)
        session.releaseHeld()
        _ = try await (a, b)
        #expect(session.callCount == 2)
    }

    @Test func deduplicatedMethodsAreConfigurable() async throws {
        let session = ScriptedNetworkSession([.held(.ok())])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, configuration: .init(deduplicatedMethods: [.get, .put], eventSink: recorder), clock: ManualClock())
        async let a = engine.send(TestRequest(method: .put, body: Data("v".utf8)))
        async let b = engine.send(TestRequest(method: .put, body: Data("v".utf8)))
        await recorder.waitForDeduplicated(1)
        await session.waitForCalls(1)
        session.releaseHeld()
        _ = try await (a, b)
        #expect(session.callCount == 1)
    }

    @Test func oneWaiterCancellingLeavesTheSharedCallRunning() async throws {
        let session = ScriptedNetworkSession([.held(.ok("for the others"))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let quitter = Task { await networkError { try await engine.send(TestRequest()) } }
        let stayers = (0..<3).map { _ in Task { try await engine.send(TestRequest()) } }
        await recorder.waitForDeduplicated(3)
        await session.waitForCalls(1)
        quitter.cancel()
        #expect(await quitter.value?.caseName == "cancelled")  // answered while the call is still held
        session.releaseHeld()
        for stayer in stayers {
            let (data, _) = try await stayer.value
            #expect(String(decoding: data, as: UTF8.self) == "for the others")
        }
        #expect(session.callCount == 1)
    }

    @Test func allWaitersCancellingCancelsTheSharedCall() async {
        let session = ScriptedNetworkSession([.hang])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let waiters = (0..<5).map { _ in Task { await networkError { try await engine.send(TestRequest()) } } }
        await recorder.waitForDeduplicated(4)
        await session.waitForCalls(1)
        for waiter in waiters { waiter.cancel() }
        for waiter in waiters { #expect(await waiter.value?.caseName == "cancelled") }
        await recorder.wait { events in events.contains { if case .failed(_, .cancelled, _) = $0 { true } else { false } } }
        await session.waitUntilNoneSuspended()
        #expect(session.suspendedCount == 0)  // the network call itself was cancelled
    }

    @Test func aNewCallerAfterEveryoneCancelledGetsAFreshCallNotACancelledOne() async throws {
        let session = ScriptedNetworkSession([.hang, .ok("fresh")])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let first = Task { await networkError { try await engine.send(TestRequest()) } }
        await session.waitForCalls(1)
        first.cancel()
        #expect(await first.value?.caseName == "cancelled")
        let (data, _) = try await engine.send(TestRequest())
        #expect(String(decoding: data, as: UTF8.self) == "fresh")
        #expect(session.callCount == 2)
    }

    @Test func aWaiterCancelledBeforeItStartsWaitingIsAnsweredCancelled() async {
        let session = ScriptedNetworkSession([.held(.ok())])
        let engine = AsyncRequestEngine(session: session, clock: ManualClock())
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await networkError { try await engine.send(TestRequest()) }
        }
        #expect(await task.value?.caseName == "cancelled")
    }

    @Test func sharedCallErrorsReachEveryWaiter() async {
        let session = ScriptedNetworkSession([.held(.status(404))])
        let recorder = EventRecorder()
        let engine = AsyncRequestEngine(session: session, eventSink: recorder, clock: ManualClock())
        let waiters = (0..<10).map { _ in Task { await networkError { try await engine.send(TestRequest()) } } }
        await recorder.waitForDeduplicated(9)
        await session.waitForCalls(1)
        session.releaseHeld()
        for waiter in waiters { #expect(await waiter.value?.caseName == "httpError(404)") }
        #expect(session.callCount == 1)
    }
}

/// Counts how often the engine reads each property; every read of `headers` makes up a new
/// Idempotency-Key.
final class ShiftingRequest: NetworkRequest {
    private let counts = Locked<[String: Int]>([:])
    private let fixedMethod: HTTPMethod

    init(method: HTTPMethod) {
        fixedMethod = method
    }

    var reads: [String: Int] { counts.withLock { $0 } }

    private func read(_ name: String) {
        counts.withLock { $0[name, default: 0] += 1 }
    }

    var url: URL { read("url"); return URL(string: "https://api.example.test/shifting")! }
    var method: HTTPMethod { read("method"); return fixedMethod }
    var headers: [String: String] { read("headers"); return ["Idempotency-Key": UUID().uuidString] }
    var body: Data? { read("body"); return nil }
    var timeout: TimeInterval { read("timeout"); return 30 }
}
