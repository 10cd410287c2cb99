import Dispatch
import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting
import Retry
import Testing

@testable import Drainer

/// A `BackgroundTaskScheduling` for tests: records registrations and submitted requests, and
/// launches tasks by hand — what SwiftResilience's protocols made possible without a device.
final class FakeBackgroundScheduler: BackgroundTaskScheduling {
    struct Submitted: Sendable, Equatable {
        let identifier: String
        let requiresNetworkConnectivity: Bool
        let requiresExternalPower: Bool
        let earliestBeginDate: Date?
    }

    /// `@unchecked Sendable`: a registered handler is only called by `launch`, from the test.
    private struct Registration: @unchecked Sendable {
        let identifier: String
        let queue: DispatchQueue?
        let handler: (any BackgroundTaskHandling) -> Void
    }

    private struct State: Sendable {
        var registrations: [Registration] = []
        var submitted: [Submitted] = []
        var refusal: FakeRefusal?
    }

    struct FakeRefusal: Error, Sendable, Equatable {}

    private let state = Locked(State())

    var registeredIdentifiers: [String] { state.withLock { $0.registrations.map(\.identifier) } }
    var registeredQueues: [DispatchQueue?] { state.withLock { $0.registrations.map(\.queue) } }
    var submitted: [Submitted] { state.withLock { $0.submitted } }

    /// Makes the next submits throw.
    func refuseSubmissions() { state.withLock { $0.refusal = FakeRefusal() } }

    func register(
        forTaskWithIdentifier identifier: String,
        using queue: DispatchQueue?,
        launchHandler: @escaping (any BackgroundTaskHandling) -> Void
    ) {
        state.withLock { $0.registrations.append(Registration(identifier: identifier, queue: queue, handler: launchHandler)) }
    }

    func submit(_ taskRequest: BackgroundTaskRequest) throws {
        let processing = taskRequest as? BackgroundProcessingTaskRequest
        try state.withLock { state in
            if let refusal = state.refusal { throw refusal }
            state.submitted.append(
                Submitted(
                    identifier: taskRequest.identifier,
                    requiresNetworkConnectivity: processing?.requiresNetworkConnectivity ?? false,
                    requiresExternalPower: processing?.requiresExternalPower ?? false,
                    earliestBeginDate: taskRequest.earliestBeginDate
                ))
        }
    }

    /// What the system does when it grants time: calls the handler registered for `identifier`.
    func launch(_ identifier: String, _ task: FakeBackgroundTask) {
        let handler = state.withLock { $0.registrations.last { $0.identifier == identifier }?.handler }
        handler?(task)
    }
}

/// A `BackgroundTaskHandling` for tests: records completions; `expire()` plays the system's expiry.
final class FakeBackgroundTask: BackgroundTaskHandling, @unchecked Sendable {
    // @unchecked Sendable: every field is behind `lock`.
    private let lock = NSLock()
    private var handler: (() -> Void)?
    private var completions: [Bool] = []
    private var completionWaiter: CheckedContinuation<Bool, Never>?
    private let expiresWhenHandlerIsSet: Bool

    /// With `expiresWhenHandlerIsSet`, the system takes the time back the moment the handler is
    /// installed, before any work could start.
    init(expiresWhenHandlerIsSet: Bool = false) {
        self.expiresWhenHandlerIsSet = expiresWhenHandlerIsSet
    }

    var expirationHandler: (() -> Void)? {
        get { lock.withLock { handler } }
        set {
            lock.withLock { handler = newValue }
            if expiresWhenHandlerIsSet { expire() }
        }
    }

    func setTaskCompleted(success: Bool) {
        let waiter = lock.withLock { () -> CheckedContinuation<Bool, Never>? in
            completions.append(success)
            defer { completionWaiter = nil }
            return completionWaiter
        }
        waiter?.resume(returning: success)
    }

    var completed: [Bool] { lock.withLock { completions } }

    /// The system expires the task.
    func expire() {
        lock.withLock { handler }?()
    }

    /// Waits for the first `setTaskCompleted(success:)` and returns its value.
    func completion() async -> Bool {
        await withCheckedContinuation { continuation in
            let done = lock.withLock { () -> Bool? in
                if let first = completions.first { return first }
                completionWaiter = continuation
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }
}

@Suite("BackgroundQueueDrainer's logic, with a fake scheduler (runs on Linux)", .timeLimit(.minutes(1)))
struct BackgroundDrainHandlerTests {
    func handler(
        _ h: DrainHarness,
        scheduler: FakeBackgroundScheduler,
        earliestBeginInterval: TimeInterval = 0,
        requiresExternalPower: Bool = false
    ) -> BackgroundDrainHandler {
        BackgroundDrainHandler(
            identifier: "com.example.queue-drain",
            queue: h.queue,
            scheduler: scheduler,
            earliestBeginInterval: earliestBeginInterval,
            requiresExternalPower: requiresExternalPower,
            onReport: nil
        )
    }

    @Test func registersItsIdentifierAndRequestsAProcessingTaskThatNeedsTheNetwork() async throws {
        let h = try await DrainHarness([.ok()])
        let scheduler = FakeBackgroundScheduler()
        let drainer = handler(h, scheduler: scheduler)
        drainer.register()
        #expect(scheduler.registeredIdentifiers == ["com.example.queue-drain"])
        #expect(scheduler.registeredQueues.count == 1 && scheduler.registeredQueues[0] == nil)
        try drainer.schedule()
        #expect(
            scheduler.submitted == [
                .init(
                    identifier: "com.example.queue-drain", requiresNetworkConnectivity: true,
                    requiresExternalPower: false, earliestBeginDate: nil)
            ])

        let later = handler(h, scheduler: scheduler, earliestBeginInterval: 900, requiresExternalPower: true)
        let before = Date()
        try later.schedule()
        let request = try #require(scheduler.submitted.last)
        #expect(request.requiresExternalPower && request.requiresNetworkConnectivity)
        let begin = try #require(request.earliestBeginDate)
        #expect(begin >= before.addingTimeInterval(900) && begin <= Date().addingTimeInterval(900))
    }

    @Test func aRefusedRequestIsThrown() async throws {
        let h = try await DrainHarness([.ok()])
        let scheduler = FakeBackgroundScheduler()
        scheduler.refuseSubmissions()
        #expect(throws: FakeBackgroundScheduler.FakeRefusal.self) { try handler(h, scheduler: scheduler).schedule() }
    }

    @Test func aLaunchedTaskDrainsTheQueueAndCompletesOnceWithSuccess() async throws {
        let h = try await DrainHarness([.ok()])
        try await h.enqueue(3)
        let scheduler = FakeBackgroundScheduler()
        let drainer = handler(h, scheduler: scheduler)
        drainer.register()
        let task = FakeBackgroundTask()
        scheduler.launch("com.example.queue-drain", task)
        #expect(task.expirationHandler != nil, "installed before the cycle starts")
        #expect(await task.completion() == true)
        #expect(h.session.callCount == 3)
        #expect(await h.queue.pendingCount() == 0)
        #expect(task.completed == [true])
        #expect(scheduler.submitted.isEmpty, "nothing left: no next task requested")
    }

    @Test func aLaunchedTaskSendsEvenWhileTheMonitorSaysOffline() async throws {
        let h = try await DrainHarness([.ok()], connected: false)
        try await h.enqueue(2)
        let scheduler = FakeBackgroundScheduler()
        let report = await handler(h, scheduler: scheduler).launched(FakeBackgroundTask()).value
        #expect(report.delivered == 2 && report.trigger == .background)
        #expect(await h.queue.pendingCount() == 0)
    }

    @Test func expiryCancelsTheCycleKeepsTheEntryInFlightRequestsTheNextTaskAndCompletesWithFailure() async throws {
        let h = try await DrainHarness([.held(.ok())])
        let ids = try await h.enqueue(2)
        let scheduler = FakeBackgroundScheduler()
        let task = FakeBackgroundTask()
        let completing = handler(h, scheduler: scheduler).launched(task)
        await h.session.waitForCalls(1)
        let key = h.session.requests.first?.value(forHTTPHeaderField: "Idempotency-Key")
        task.expire()
        let report = await completing.value
        #expect(report.interrupted && report.delivered == 0 && report.remaining == 2)
        #expect(task.completed == [false])
        #expect(scheduler.submitted.count == 1, "entries remain: the next task is requested")
        let first = try #require(await h.queue.items.first { $0.id == ids[0] })
        #expect(first.attempts == 0, "a cancelled send is not a counted attempt")
        #expect(first.idempotencyKey == key)
    }

    @Test func anExpiryBeforeTheCycleStartsStillCancelsIt() async throws {
        let h = try await DrainHarness([.ok()])
        try await h.enqueue(2)
        let scheduler = FakeBackgroundScheduler()
        let task = FakeBackgroundTask(expiresWhenHandlerIsSet: true)
        let report = await handler(h, scheduler: scheduler).launched(task).value
        #expect(report.interrupted && report.delivered == 0)
        #expect(h.session.callCount == 0)
        #expect(task.completed == [false])
    }

    @Test func aCycleWithATransientFailureCompletesWithFailureAndAsksForTheNextTask() async throws {
        let h = try await DrainHarness([.status(503)])
        try await h.enqueue(1)
        let scheduler = FakeBackgroundScheduler()
        let task = FakeBackgroundTask()
        let report = await handler(h, scheduler: scheduler).launched(task).value
        #expect(report.keptForRetry == 1 && report.isFailure)
        #expect(task.completed == [false])
        #expect(scheduler.submitted.count == 1)
    }

    @Test func eachReportReachesOnReport() async throws {
        let h = try await DrainHarness([.ok()])
        try await h.enqueue(1)
        let reports = Locked<[DrainCycleReport]>([])
        let drainer = BackgroundDrainHandler(
            identifier: "id", queue: h.queue, scheduler: FakeBackgroundScheduler(), earliestBeginInterval: 0,
            requiresExternalPower: false, onReport: { report in reports.withLock { $0.append(report) } }
        )
        _ = await drainer.launched(FakeBackgroundTask()).value
        #expect(reports.withLock { $0.map(\.delivered) } == [1])
    }
}
