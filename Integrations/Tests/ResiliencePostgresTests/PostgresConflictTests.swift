import Foundation
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import ResilienceTesting
import Testing

/// Conflicts (issue 46) on `PostgresQueueStore`: a coalesced edit keeps the oldest base in its row,
/// and a 412 is stored in conflict, resolved under a leased claim, and the rebased write delivered
/// (a real PostgreSQL, URLSession to a loopback origin that enforces `If-Match`).
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresConflictTests {
    struct Rebase: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
            .rebase(body: Data("\(String(decoding: conflict.serverBody ?? Data(), as: UTF8.self))+mine".utf8))
        }
    }

    @Test func aCoalescedEditKeepsTheBaseOfTheEditItReplacesInItsRow() async throws {
        try await PostgresTestDatabase.withStore { store, _ in
            let url = URL(string: "https://api.example.test/notes/1")!
            let first = QueueEntry(QueuedRequest(method: .put, url: url, body: Data("a".utf8), coalescingKey: "note", editBase: EditBase(etag: "\"v1\"")))
            let second = QueueEntry(
                QueuedRequest(method: .put, url: url, body: Data("b".utf8), coalescingKey: "note", editBase: EditBase(lastModified: "Tue, 01 Dec 2026 10:00:00 GMT")))
            _ = try await store.add(first, limit: nil)
            let stored = try await store.add(second, limit: nil)
            #expect(stored.base == EditBase(etag: "\"v1\"") && stored.body == Data("b".utf8))
            let row = try #require(try await store.queuedEntries().first)
            #expect(try await store.queuedCount() == 1)
            #expect(row.id == second.id && row.base == EditBase(etag: "\"v1\""))
            // A first edit without a base lets the next one bring its own.
            let third = QueueEntry(QueuedRequest(method: .put, url: url, coalescingKey: "other"))
            let fourth = QueueEntry(QueuedRequest(method: .put, url: url, coalescingKey: "other", editBase: EditBase(etag: "\"v9\"")))
            _ = try await store.add(third, limit: nil)
            #expect(try await store.add(fourth, limit: nil).base == EditBase(etag: "\"v9\""))
            #expect(try await store.queuedEntry(id: fourth.id)?.base == EditBase(etag: "\"v9\""))
        }
    }

    @Test func a412IsStoredInConflictResolvedUnderALeaseAndTheRebasedWriteDelivered() async throws {
        let origin = try LoopbackHTTPServer()
        defer { origin.shutdown() }
        origin.route(
            "/notes/1",
            handler: { request in
                if request.method == "GET" { return .status(200, headers: ["ETag": "\"v2\""], body: "server") }
                return request.header("if-match") == "\"v2\"" ? .status(200) : .status(412)
            })
        try await PostgresTestDatabase.withStore { store, _ in
            let clock = ManualClock()
            let monitor = ManualReachabilityMonitor(isConnected: false)
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: URLSessionTransport.shared, clock: clock),
                reachabilityMonitor: monitor,
                store: store,
                configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10), conflictResolver: Rebase()),
                clock: clock
            )
            let results = await engine.results
            let request = QueuedRequest(method: .put, url: origin.url("/notes/1"), body: Data("mine".utf8), editBase: EditBase(etag: "\"v1\""))
            let id = try #require(try await engine.enqueue(request).queuedID)
            await engine.start()
            await monitor.setConnected(true)
            var seen: [String] = []
            for await result in results where result.id == id {
                switch result {
                case .delivered: seen.append("delivered")
                case .keptForRetry(_, let error, _, _): seen.append("kept \(error.statusCode.map(String.init) ?? "-")")
                default: seen.append("\(result)")
                }
                if case .delivered = result { break }
            }
            await engine.stop()
            #expect(seen == ["kept 412", "delivered"])
            #expect(origin.requestLog.map(\.method) == ["PUT", "GET", "PUT"])
            let last = try #require(origin.requestLog.last)
            #expect(last.header("if-match") == "\"v2\"" && String(decoding: last.body, as: UTF8.self) == "server+mine")
            #expect(try await store.queuedCount() == 0)
        }
    }
}
