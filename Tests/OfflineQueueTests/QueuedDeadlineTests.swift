import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A queued request's `deadline` is part of the request: it goes with the first attempt and with
/// every replay (each a send of its own, counted from its start), it is kept in the entry file
/// across a restart, and the engine cuts a send that outlives it. It used to be dropped silently.
@Suite("OfflineQueueEngine: a queued request's deadline", .timeLimit(.minutes(1)))
struct QueuedDeadlineTests {
    /// Records each request it is asked to send (as the sender saw it) and answers from a
    /// script of statuses (200 once it runs out).
    final class RecordingSender: RequestSending, Sendable {
        private let seen = Locked<[PreparedRequest]>([])
        private let statuses: Locked<[Int]>

        init(statuses: [Int]) { self.statuses = Locked(statuses) }

        var requests: [PreparedRequest] { seen.withLock { $0 } }

        func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
            seen.withLock { $0.append(PreparedRequest(request)) }
            let status = statuses.withLock { $0.isEmpty ? 200 : $0.removeFirst() }
            return (Data(), HTTPURLResponse(url: request.url, statusCode: status, httpVersion: "HTTP/1.1", headerFields: [:])!)
        }
    }

    /// A queue online over `sender`, retrying every 10 s on `clock`, in a folder of its own.
    static func queue(over sender: some RequestSending, clock: ManualClock) throws -> (OfflineQueueEngine, TemporaryDirectory) {
        let directory = TemporaryDirectory()
        let engine = OfflineQueueEngine(
            requestEngine: sender,
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: directory.url),
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: clock
        )
        return (engine, directory)
    }

    @Test func theDeadlineGoesWithTheFirstAttemptAndEveryReplay() async throws {
        let clock = ManualClock()
        let sender = RecordingSender(statuses: [503, 503, 200])
        let (engine, directory) = try Self.queue(over: sender, clock: clock)
        defer { withExtendedLifetime(directory) {} }
        var request = Mutation("/a")
        request.deadline = .seconds(5)
        let id = try #require(try await engine.enqueue(request).queuedID)  // 503: kept
        #expect(engine.disk?.entry(id: id)?.deadline == .seconds(5))
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().kept == [id])
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().delivered == [id])
        #expect(sender.requests.map(\.deadline) == [.seconds(5), .seconds(5), .seconds(5)])
    }

    @Test func theFirstAttemptTakesTheCallersShareAndReplaysTheBackgroundOne() async throws {
        let clock = ManualClock()
        let sender = RecordingSender(statuses: [503, 200])
        let (engine, directory) = try Self.queue(over: sender, clock: clock)
        defer { withExtendedLifetime(directory) {} }
        let id = try #require(try await engine.enqueue(Mutation("/a")).queuedID)
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().delivered == [id])
        #expect(sender.requests.map(\.requestPriority) == [.interactive, .background])
    }

    @Test func aDeadlineWithNothingLeftIsRefusedAtEnqueueAndNothingIsStored() async throws {
        let h = try QueueHarness([])
        for deadline in [Duration.zero, .seconds(-1)] {
            var request = Mutation("/a")
            request.deadline = deadline
            let error = await thrownError { try await h.engine.enqueue(request) }
            #expect((error as? NetworkError)?.caseName == "invalidRequest")
        }
        #expect(h.directory.fileNames.isEmpty)
        #expect(h.session.callCount == 0)
    }

    @Test func anEntryFileWithANonPositiveDeadlineIsNotTrusted() throws {
        let text =
            #"{"id":"6F9619FF-8B86-D011-B42D-00C04FC964FF","url":"https:\/\/api.example.test\/a","method":"POST","headers":{},"timeout":30,"enqueuedAt":0,"ttl":60,"priority":0,"idempotencyKey":"k","sequence":1,"attempts":0,"revision":0,"formatVersion":1,"deadlineSeconds":-2}"#
        #expect(QueueEntryDecoder.decode(Data(text.utf8)) == nil)
        #expect(QueueEntryDecoder.decode(Data(text.replacingOccurrences(of: "-2", with: "2.5").utf8))?.deadline == .milliseconds(2_500))
    }

    @Test func aRequestWithoutADeadlineSendsNone() async throws {
        let clock = ManualClock()
        let sender = RecordingSender(statuses: [503, 200])
        let (engine, directory) = try Self.queue(over: sender, clock: clock)
        defer { withExtendedLifetime(directory) {} }
        let id = try #require(try await engine.enqueue(Mutation("/a")).queuedID)
        #expect(engine.disk?.entry(id: id)?.deadline == nil)
        clock.advance(by: .seconds(10))
        #expect(await engine.flush().delivered == [id])
        #expect(sender.requests.map(\.deadline) == [nil, nil])
    }

    @Test func theEntryFileKeepsTheDeadlineAcrossARestart() async throws {
        let h = try QueueHarness([], connected: false)
        var request = Mutation("/a")
        request.deadline = .milliseconds(2_500)
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        h.store.releaseLock()
        let reopened = try DiskQueueStore(directory: h.directory.url)
        #expect(reopened.openReport.quarantined.isEmpty)
        #expect(reopened.entry(id: id)?.deadline == .milliseconds(2_500))
    }

    @Test func anEntryFileWithoutTheFieldReadsAsNoDeadline() throws {
        let entry = QueueEntry(
            id: UUID(), url: URL(string: "https://api.example.test/a")!, method: "POST", headers: [:], body: nil,
            timeout: 30, enqueuedAt: Date(timeIntervalSinceReferenceDate: 0), ttl: 60, priority: 0,
            idempotencyKey: "k", orderingKey: nil, coalescingKey: nil, sequence: 1, attempts: 0,
            nextAttemptAt: nil, lastError: nil, revision: 0, formatVersion: 1
        )
        let data = try QueueEntry.makeEncoder().encode(entry)
        #expect(!String(decoding: data, as: UTF8.self).contains("deadline"))
        #expect(QueueEntryDecoder.decode(data)?.deadline == nil)
    }

    @Test func theEngineCutsAHangingFirstAttemptAtTheDeadlineAndTheEntryIsKept() async throws {
        let h = try QueueHarness([.hang])
        var request = Mutation("/a")  // no attempt timeout: only the deadline bounds it
        request.deadline = .seconds(5)
        let enqueue = Task { try await h.engine.enqueue(request) }
        await h.session.waitForCalls(1)
        await h.clock.waitForSleepers(2)  // the engine's deadline watchdog and the queue's first-attempt bound
        #expect(h.clock.nextDeadline == .init(offset: .seconds(5)))
        h.clock.advance(by: .seconds(5))
        let id = try #require(try await enqueue.value.queuedID)
        #expect(h.store.entry(id: id)?.attempts == 1)
        await h.session.waitUntilNoneSuspended()  // the hanging attempt was cancelled
    }

    @Test func theEngineCutsAHangingReplayAtTheDeadline() async throws {
        let h = try QueueHarness([.respond(status: 503), .hang])
        var request = Mutation("/a")
        request.deadline = .seconds(5)
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        h.clock.advance(by: .seconds(10))
        let flush = Task { await h.engine.flush() }
        await h.session.waitForCalls(2)
        await h.clock.waitForSleepers(1)  // the engine's deadline watchdog
        h.clock.advance(by: .seconds(5))
        let report = await flush.value
        #expect(report.kept == [id])
        #expect(h.store.entry(id: id)?.lastError?.contains("deadline") == true)
        await h.session.waitUntilNoneSuspended()
    }
}
