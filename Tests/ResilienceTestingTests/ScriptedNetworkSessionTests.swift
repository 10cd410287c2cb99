import Foundation
import ResilienceTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("ScriptedNetworkSession", .timeLimit(.minutes(1)))
struct ScriptedNetworkSessionTests {
    let request = URLRequest(url: URL(string: "https://example.test/a")!)

    @Test func stepsPlayInOrderAndTheLastRepeats() async throws {
        let session = ScriptedNetworkSession([.status(503), .ok("yes")])
        var statuses: [Int] = []
        for _ in 0..<4 {
            let (_, response) = try await session.data(for: request)
            statuses.append((response as? HTTPURLResponse)?.statusCode ?? 0)
        }
        #expect(statuses == [503, 200, 200, 200])
        #expect(session.callCount == 4)
    }

    @Test func failStepsThrowTheirError() async {
        let session = ScriptedNetworkSession([.urlError(.notConnectedToInternet)])
        await #expect(throws: URLError.self) { try await session.data(for: request) }
    }

    @Test func heldCallsWaitForReleaseEvenIfReleasedBeforeTheySuspend() async throws {
        let session = ScriptedNetworkSession([.held(.ok("go"))])
        let request = self.request
        let call = Task { try await session.data(for: request) }
        await session.waitForCalls(1)
        session.releaseHeld()
        let (data, _) = try await call.value
        #expect(String(decoding: data, as: UTF8.self) == "go")
    }

    @Test func hangingCallsEndOnlyByCancellation() async {
        let session = ScriptedNetworkSession([.hang])
        let request = self.request
        let call = Task { try await session.data(for: request) }
        await session.waitForCalls(1)
        session.releaseHeld()  // does not release a hang
        call.cancel()
        await #expect(throws: URLError.self) { try await call.value }
        await session.waitUntilNoneSuspended()
        #expect(session.suspendedCount == 0)
    }
}
