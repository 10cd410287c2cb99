import Foundation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("FaultInjectingSession", .timeLimit(.minutes(1)))
struct FaultInjectingSessionTests {
    private let clock = ManualClock()
    private let request = URLRequest(url: URL(string: "https://api.example.com/items")!)

    private func session(_ faults: [InjectedFault], seed: UInt64 = 42, wrapped: ScriptedNetworkSession = ScriptedNetworkSession([.ok("real")])) -> FaultInjectingSession {
        FaultInjectingSession(wrapping: wrapped, faults: faults, seed: seed, clock: clock)
    }

    /// What one call produced: the status, or the `NetworkError` case name of what it threw.
    private func outcome(_ session: FaultInjectingSession) async -> String {
        do {
            let (_, response) = try await session.data(for: request)
            return "\((response as? HTTPURLResponse)?.statusCode ?? -1)"
        } catch {
            return NetworkError(mapping: error).caseName
        }
    }

    private func outcomes(_ session: FaultInjectingSession, count: Int) async -> [String] {
        var results: [String] = []
        for _ in 0..<count { results.append(await outcome(session)) }
        return results
    }

    // MARK: Rates and determinism

    @Test func aRateOfOneTenthHitsAboutOneCallInTen() async {
        let session = session([.status(503, rate: 0.1)])
        let results = await outcomes(session, count: 10_000)
        let injected = results.filter { $0 == "503" }.count
        // Binomial(10 000, 0.1): mean 1 000, standard deviation 30; ±120 is four deviations.
        #expect((880...1_120).contains(injected))
        #expect(results.filter { $0 == "200" }.count == 10_000 - injected)
    }

    @Test func theSameSeedGivesTheSameSequenceAndAnotherSeedAnother() async {
        let faults: [InjectedFault] = [.status(500, rate: 0.3), .transport(.connectionLost, rate: 0.2)]
        let first = await outcomes(session(faults, seed: 7), count: 200)
        let second = await outcomes(session(faults, seed: 7), count: 200)
        let other = await outcomes(session(faults, seed: 8), count: 200)
        #expect(first == second)
        #expect(first != other)
        #expect(Set(first) == ["200", "500", "transport(connectionLost)"])
    }

    @Test func ratesAreClamped() async {
        #expect(InjectedFault.status(500, rate: .nan).rate == 0)
        #expect(InjectedFault.status(500, rate: -1).rate == 0)
        #expect(InjectedFault.status(500, rate: 7).rate == 1)
        #expect(InjectedFault.latency(.seconds(1), rate: .infinity).rate == 1)
        #expect(Set(await outcomes(session([.status(500, rate: .nan), .status(502, rate: -3)]), count: 100)) == ["200"])
        #expect(Set(await outcomes(session([.status(500, rate: 2)]), count: 100)) == ["500"])
    }

    // MARK: What each fault does

    @Test func aStatusFaultAnswersWithoutCallingTheWrappedSession() async throws {
        let wrapped = ScriptedNetworkSession([.ok("real")])
        let session = session([.status(429, rate: 1)], wrapped: wrapped)
        let (data, response) = try await session.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        #expect(http.statusCode == 429)
        #expect(http.url == request.url)
        #expect(data.isEmpty)
        #expect(wrapped.callCount == 0)
    }

    @Test(arguments: [TransportFailure.cannotConnectToHost, .connectionLost, .dnsFailure, .secureConnectionFailed])
    func aTransportFaultThrowsWhatURLSessionThrowsForIt(failure: TransportFailure) async {
        let wrapped = ScriptedNetworkSession([.ok()])
        let session = session([.transport(failure, rate: 1)], wrapped: wrapped)
        let error = await thrownError { _ = try await session.data(for: request) }
        #expect(error is URLError)
        #expect(NetworkError(mapping: error ?? CancellationError()).caseName == "transport(\(failure.rawValue))")
        #expect(wrapped.callCount == 0)
    }

    @Test func latencySleepsOnTheClockThenCallsTheWrappedSession() async throws {
        let wrapped = ScriptedNetworkSession([.ok("real")])
        let session = session([.latency(.seconds(2), rate: 1)], wrapped: wrapped)
        let call = Task { try await session.data(for: request) }
        await clock.waitForSleepers(1)
        #expect(wrapped.callCount == 0)
        clock.advance(by: .seconds(2))
        let (data, _) = try await call.value
        #expect(String(decoding: data, as: UTF8.self) == "real")
        #expect(wrapped.callCount == 1)
    }

    @Test func cancellationDuringInjectedLatencyEndsTheCallAtOnce() async {
        let wrapped = ScriptedNetworkSession([.ok()])
        let session = session([.latency(.seconds(60), rate: 1)], wrapped: wrapped)
        let call = Task { try await session.data(for: request) }
        await clock.waitForSleepers(1)
        call.cancel()
        let error = await thrownError { _ = try await call.value }
        #expect((error as? URLError)?.code == .cancelled)
        #expect(NetworkError(mapping: error ?? CancellationError()).caseName == "cancelled")
        #expect(wrapped.callCount == 0)
        #expect(clock.sleeperCount == 0)
    }

    @Test func anOversizedBodyLimitStillReachesTheWrappedSession() async {
        let session = session([], wrapped: ScriptedNetworkSession([.ok("0123456789")]))
        let error = await thrownError { _ = try await session.data(for: request, maximumBodySize: 4) }
        #expect((error as? NetworkError)?.caseName == "responseTooLarge(4)")
    }

    // MARK: Order

    @Test func theFirstEndingFaultThatFiresWins() async {
        #expect(await outcome(session([.status(503, rate: 1), .transport(.dnsFailure, rate: 1)])) == "503")
        #expect(await outcome(session([.transport(.dnsFailure, rate: 1), .status(503, rate: 1)])) == "transport(dnsFailure)")
        #expect(await outcome(session([.status(503, rate: 0), .status(502, rate: 1)])) == "502")
    }

    @Test func aLatencyBeforeAnEndingFaultDelaysItAndOneAfterItDoesNot() async throws {
        let delayed = session([.latency(.seconds(1), rate: 1), .latency(.seconds(2), rate: 1), .status(503, rate: 1)])
        let call = Task { await outcome(delayed) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == ManualClock.Instant(offset: .seconds(3)))  // the waits add up
        clock.advance(by: .seconds(3))
        #expect(await call.value == "503")

        let immediate = session([.status(503, rate: 1), .latency(.seconds(5), rate: 1)])
        #expect(await outcome(immediate) == "503")  // no sleeper: it answered at once
        #expect(clock.sleeperCount == 0)
    }

    @Test func everyFaultDrawsOnEveryCallSoItsDecisionsDoNotDependOnTheOthers() async {
        // The 502 fault's decisions are the same whether or not a fault before it ends calls.
        let alone = await outcomes(session([.status(200, rate: 0), .status(502, rate: 0.5)], seed: 3), count: 300)
        let behind = await outcomes(session([.status(201, rate: 0.5), .status(502, rate: 0.5)], seed: 3), count: 300)
        for (a, b) in zip(alone, behind) where b != "201" {
            #expect(a == b)
        }
    }

    // MARK: isEnabled

    @Test func disablingPassesEveryCallThroughAndResumesTheSequenceWhereItStopped() async {
        let faults: [InjectedFault] = [.status(500, rate: 0.5)]
        let reference = await outcomes(session(faults, seed: 99), count: 40)

        let wrapped = ScriptedNetworkSession([.ok()])
        let session = session(faults, seed: 99, wrapped: wrapped)
        #expect(session.isEnabled)
        var switched = await outcomes(session, count: 20)
        session.isEnabled = false
        #expect(!session.isEnabled)
        let passed = await outcomes(session, count: 25)
        #expect(Set(passed) == ["200"])
        session.isEnabled = true
        switched += await outcomes(session, count: 20)
        #expect(switched == reference)
        #expect(wrapped.callCount == 25 + reference.filter { $0 == "200" }.count)
    }

    @Test func isEnabledCanBeSwitchedFromManyTasksAtOnce() async {
        let session = session([.status(500, rate: 1)])
        let request = request
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<100 {
                group.addTask { session.isEnabled = index % 2 == 0 }
                group.addTask { _ = try? await session.data(for: request) }
            }
        }
        session.isEnabled = false
        #expect(await outcome(session) == "200")
    }

    // MARK: With the engine

    @Test func theEngineSeesInjectedFaultsAsItWouldRealOnes() async {
        let session = session([.transport(.cannotConnectToHost, rate: 1)])
        let engine = AsyncRequestEngine(session: session, clock: clock)
        let error = await networkError { _ = try await engine.send(TestRequest(url: request.url!)) }
        #expect(error?.caseName == "transport(cannotConnectToHost)")
    }
}
