import Foundation
import OfflineFirst
import OfflineQueue
import PostgresNIO
import RequestEngine
import ResiliencePostgres
import ResilienceTesting
import ResponseCache
import Synchronization
import Testing

/// `OfflineFirstClient` over `PostgresQueueStore`, with two replicas on one table: the client
/// follows its store's change feed, which learns of the other replica's writes from their
/// `NOTIFY`, so a write stored by one shows in a live read on the other, and leaves it as the
/// other replica settles it. Real URLSession, a real server on 127.0.0.1, a real PostgreSQL.
@Suite(.postgresReachable, .timeLimit(.minutes(2)))
struct PostgresOfflineFirstTests {
    /// The notes the server holds: a GET lists them, a POST appends one.
    final class Locked<Value: Sendable>: Sendable {
        let mutex: Mutex<Value>
        init(_ value: Value) { mutex = Mutex(value) }
        func withLock<Result>(_ body: (inout sending Value) -> sending Result) -> Result { mutex.withLock(body) }
    }

    final class NotesServer: Sendable {
        let server: LoopbackHTTPServer

        init() throws {
            server = try LoopbackHTTPServer()
            let notes = Locked(["a"])
            server.route("/notes") { request in
                if request.method == "POST" { notes.withLock { $0.append(String(decoding: request.body, as: UTF8.self)) } }
                let list = notes.withLock { $0 }
                let body = String(decoding: (try? JSONEncoder().encode(list)) ?? Data(), as: UTF8.self)
                return .json(body, status: request.method == "POST" ? 201 : 200)
            }
        }
    }

    struct NotesList: NetworkRequest {
        let url: URL
        var method: HTTPMethod { .get }
    }

    static let appendNote = OptimisticUpdate(
        mutations: { $0.method == "POST" && $0.url.path == "/notes" },
        reads: { $0.path == "/notes" },
        apply: { current, pending in
            let notes = current.flatMap { try? JSONDecoder().decode([String].self, from: $0) } ?? []
            return try JSONEncoder().encode(notes + [String(decoding: pending.body ?? Data(), as: UTF8.self)])
        }
    )

    static func notes(_ snapshot: QuerySnapshot?) -> [String] {
        snapshot?.data.flatMap { try? JSONDecoder().decode([String].self, from: $0) } ?? []
    }

    @Test func aWriteStoredOnOneReplicaShowsInALiveReadOnAnotherUntilItIsSettled() async throws {
        try await PostgresTestDatabase.withStore { storeA, client in
            let origin = try NotesServer()
            let folder = FileManager.default.temporaryDirectory.appendingPathComponent("pg-offline-first-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: folder) }
            let list = NotesList(url: origin.server.url("/notes"))

            // Replica B: a live read of the list, over its own store on the shared table.
            let storeB = try PostgresQueueStore(client: client, tableName: storeA.tableName)
            let monitorB = ManualReachabilityMonitor(isConnected: true)
            let sender = AsyncRequestEngine(session: URLSessionTransport.shared)
            let reads = CachedRequestEngine(
                requestEngine: sender, cache: try DiskResponseCache(directory: folder, maxBytes: 1 << 20), reachabilityMonitor: monitorB)
            // B's queue stays offline: it must not deliver A's note before the test has seen B show
            // it pending (started and online, the notice would wake it to send the note at once).
            let queueB = OfflineQueueEngine(requestEngine: sender, reachabilityMonitor: ManualReachabilityMonitor(isConnected: false), store: storeB)
            let clientB = OfflineFirstClient(reads: reads, queue: queueB, optimisticUpdates: [Self.appendNote])
            let shown = Locked<[QuerySnapshot]>([])
            let reader = Task {
                for try await snapshot in clientB.snapshots(for: list, mode: .online, staleTime: .seconds(0)) {
                    shown.withLock { $0.append(snapshot) }
                }
            }
            // The first snapshot shown so far that meets `condition` (not only the last: two may
            // arrive between two looks).
            func waitFor(_ condition: (QuerySnapshot) -> Bool) async -> QuerySnapshot? {
                while !Task.isCancelled {
                    if let met = shown.withLock({ $0.first(where: condition) }) { return met }
                    await Task.yield()
                }
                return shown.withLock { $0.last }
            }
            let first = await waitFor { Self.notes($0) == ["a"] && !$0.isFetching }
            #expect(Self.notes(first) == ["a"])

            // Replica A, offline, stores a note in the table.
            let monitorA = ManualReachabilityMonitor(isConnected: false)
            let queueA = OfflineQueueEngine(requestEngine: sender, reachabilityMonitor: monitorA, store: storeA)
            let body = Data("from A".utf8)
            guard case .queued(let id) = try await queueA.enqueue(QueuedRequest(method: .post, url: list.url, body: body)) else {
                Issue.record("the note was not queued")
                return
            }

            // B shows it, overlaid, as soon as its notice arrives.
            let pending = await waitFor { $0.pendingEntryIDs == [id] }
            #expect(Self.notes(pending) == ["a", "from A"] && pending?.hasPendingWrites == true)
            #expect(queueB.storage.changeFeed.count == 1)

            // Delivered by A's flush, B learns of the delivery, refetches, and shows the server's
            // list, which holds the note once.
            await monitorA.setConnected(true)
            let report = await queueA.flush()
            #expect(report.delivered == [id] && report.storageError == nil)
            let settled = await waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && !$0.isFetching && Self.notes($0) == ["a", "from A"] }
            #expect(Self.notes(settled) == ["a", "from A"] && settled?.source == .network)
            let lists = shown.withLock { $0.map(Self.notes) }
            let firstShown = try #require(lists.firstIndex(of: ["a", "from A"]))
            #expect(lists[firstShown...].allSatisfy { $0 == ["a", "from A"] }, "\(lists)")
            #expect(queueB.storage.changeFeed.count == 0)

            reader.cancel()
            await queueA.close()
            await queueB.close()
        }
    }
}
