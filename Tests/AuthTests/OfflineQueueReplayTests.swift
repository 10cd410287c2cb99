import Foundation
import OfflineQueue
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import Auth

/// `AuthenticatedRequestEngine` as the offline queue's sender (Sources/Auth/Auth.docc/AuthGuide.md, "As the offline
/// queue's sender"): what a drain pass does when the token cannot be refreshed.
@Suite("AuthenticatedRequestEngine as the OfflineQueueEngine's sender", .timeLimit(.minutes(1)))
struct OfflineQueueReplayTests {
    @Test func aFlushWhoseRefreshNeverReturnsFinishesAtTheRefreshTimeoutAndKeepsTheEntry() async throws {
        let directory = TemporaryDirectory()
        let authClock = ManualClock()
        let queueClock = ManualClock()
        let gate = Gate()  // the provider's refresh hangs until the end of the test
        let scripted = ScriptedNetworkSession([.status(401), .ok()])
        let coordinator = TokenRefreshCoordinator(provider: TestTokenProvider(current: "expired", gate: gate), clock: authClock)
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let queue = OfflineQueueEngine(
            requestEngine: AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: scripted), coordinator: coordinator),
            reachabilityMonitor: monitor,
            store: try DiskQueueStore(directory: directory.url),
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: queueClock
        )
        let request = QueuedRequest(method: .post, url: try #require(URL(string: "https://api.example.test/comments")), timeout: .infinity)
        let id = try #require(try await queue.enqueue(request).queuedID)
        await monitor.setConnected(true)

        let pass = Task { await queue.flush() }
        await coordinator.waitForWaiters(1)  // the replay got a 401 and waits for the refresh
        await authClock.waitForSleepers(1)
        authClock.advance(by: .seconds(30))
        let report = await pass.value

        #expect(report.results.count == 1)
        guard case .keptForRetry(let keptID, _, let attempts, _) = try #require(report.results.first) else {
            Issue.record("\(report.results)"); gate.open(); return
        }
        #expect(keptID == id)
        #expect(attempts == 1)
        #expect(report.remaining == 1)
        #expect(await queue.items.map(\.id) == [id])
        #expect(scripted.callCount == 1)
        gate.open()
    }

    /// The issue's path: an enqueue made online, whose first attempt goes through an
    /// `AuthenticatedRequestEngine` that waits for a refresh that never returns, is stored and
    /// returns `.queued` when its request's timeout runs out on the queue's clock, long before the
    /// coordinator's own refresh timeout.
    @Test func anEnqueueWhoseRefreshNeverReturnsIsStoredAtTheRequestsTimeout() async throws {
        let directory = TemporaryDirectory()
        let authClock = ManualClock()  // never advanced: the refresh timeout (30 s) never fires
        let queueClock = ManualClock()
        let gate = Gate()  // the provider's refresh hangs until the end of the test
        let scripted = ScriptedNetworkSession([.status(401), .ok()])
        let coordinator = TokenRefreshCoordinator(provider: TestTokenProvider(current: "expired", gate: gate), clock: authClock)
        let store = try DiskQueueStore(directory: directory.url)
        let queue = OfflineQueueEngine(
            requestEngine: AuthenticatedRequestEngine(requestEngine: AsyncRequestEngine(session: scripted), coordinator: coordinator),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: queueClock
        )
        let request = QueuedRequest(method: .post, url: try #require(URL(string: "https://api.example.test/comments")), timeout: 5)
        let enqueue = Task { try await queue.enqueue(request) }
        await coordinator.waitForWaiters(1)  // the first attempt got a 401 and waits for the refresh
        await queueClock.waitForSleepers(1)
        queueClock.advance(by: .seconds(5))
        let id = try #require(try await enqueue.value.queuedID)
        let entry = try #require(store.entry(id: id))
        #expect(entry.attempts == 1)
        #expect(entry.lastError == NetworkError.timedOut.description)
        #expect(scripted.callCount == 1)
        gate.open()
    }
}
