#if canImport(BackgroundTasks) && !os(macOS) && !os(watchOS)
import BackgroundTasks
import Dispatch
import Foundation
import Testing
import Retry
import OfflineQueue
import ResilienceTesting
@testable import Drainer

/// A mock written the way SwiftResilience's tests wrote one, against `BGTaskRequest`: it must still
/// conform to `BackgroundTaskScheduling`.
final class PublishedStyleScheduler: BackgroundTaskScheduling, @unchecked Sendable {
    // @unchecked Sendable: every field is behind `lock`.
    private let lock = NSLock()
    private var identifiers: [String] = []
    private var handlers: [String: (any BackgroundTaskHandling) -> Void] = [:]
    private var requests: [BGTaskRequest] = []
    private var refuses = false

    var registeredIdentifiers: [String] { lock.withLock { identifiers } }
    var submittedRequests: [BGTaskRequest] { lock.withLock { requests } }

    func refuseSubmissions() { lock.withLock { refuses = true } }

    func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (any BackgroundTaskHandling) -> Void
    ) {
        lock.withLock {
            identifiers.append(identifier)
            handlers[identifier] = launchHandler
        }
    }

    func submit(_ taskRequest: BGTaskRequest) throws {
        try lock.withLock {
            if refuses { throw FakeBackgroundScheduler.FakeRefusal() }
            requests.append(taskRequest)
        }
    }

    func fireHandler(for identifier: String, with task: any BackgroundTaskHandling) {
        lock.withLock { handlers[identifier] }?(task)
    }
}

@Suite("BackgroundQueueDrainer: SwiftResilience's shape (Apple platforms)", .timeLimit(.minutes(1)))
struct BackgroundQueueDrainerTests {
    @Test func thePublishedInitializerRegistersSchedulesAndDrains() async throws {
        let h = try await DrainHarness([.ok()])
        try await h.enqueue(2)
        let scheduler = PublishedStyleScheduler()
        let drainer = BackgroundQueueDrainer(taskIdentifier: "com.myapp.queue-drain", engine: h.queue, scheduler: scheduler)
        #expect(drainer.taskIdentifier == "com.myapp.queue-drain")
        #expect(drainer.register())
        #expect(scheduler.registeredIdentifiers == ["com.myapp.queue-drain"])

        drainer.scheduleNextDrain()
        let request = try #require(scheduler.submittedRequests.first as? BGProcessingTaskRequest)
        #expect(request.identifier == "com.myapp.queue-drain")
        #expect(request.requiresNetworkConnectivity && !request.requiresExternalPower)
        #expect(request.earliestBeginDate == nil)

        let task = FakeBackgroundTask()
        scheduler.fireHandler(for: "com.myapp.queue-drain", with: task)
        #expect(await task.completion() == true)
        #expect(await h.queue.pendingCount() == 0)
    }

    @Test func scheduleNextDrainIgnoresARefusalAndScheduleThrowsIt() async throws {
        let h = try await DrainHarness([.ok()])
        let scheduler = PublishedStyleScheduler()
        scheduler.refuseSubmissions()
        let drainer = BackgroundQueueDrainer(taskIdentifier: "id", engine: h.queue, scheduler: scheduler)
        drainer.scheduleNextDrain()
        #expect(throws: FakeBackgroundScheduler.FakeRefusal.self) { try drainer.schedule() }
        #expect(scheduler.submittedRequests.isEmpty)
    }
}
#endif
