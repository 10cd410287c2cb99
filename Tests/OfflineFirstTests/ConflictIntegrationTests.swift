import Foundation
import OfflineQueue
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import ResponseCache
import Testing

@testable import OfflineFirst

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Issue 46 end to end: two devices (two folders, two clients) edit one note offline; the origin
/// versions it and enforces `If-Match` on every `PATCH` (428 without, 412 on a stale version).
/// Real URLSession, a real server on 127.0.0.1, real files.
@Suite("Conflicts through URLSession: two devices edit one note offline", .timeLimit(.minutes(2)))
struct ConflictIntegrationTests {
    /// The note as JSON: `{"title": …, "body": …}`; a `PATCH` carries the fields it changes.
    struct Note: Codable, Equatable {
        var title: String?
        var body: String?

        func merged(with patch: Note) -> Note { Note(title: patch.title ?? title, body: patch.body ?? body) }
        var data: Data { try! JSONEncoder().encode(self) }
        static func from(_ data: Data?) -> Note? { data.flatMap { try? JSONDecoder().decode(Note.self, from: $0) } }
    }

    /// `GET /notes/1`: the note with `ETag: "v<n>"`; `PATCH /notes/1`: 428 without `If-Match`, 412
    /// unless it names the current version, else the fields applied (once per `Idempotency-Key`).
    final class NoteOrigin: Sendable {
        let server: LoopbackHTTPServer
        private let state = Locked((note: Note(title: "t0", body: "b0"), version: 1, keys: Set<String>(), statuses: [Int]()))

        init() throws {
            server = try LoopbackHTTPServer()
            server.route(
                "/notes/1",
                handler: { [state] request in
                    state.withLock { state in
                        let etag = "\"v\(state.version)\""
                        guard request.method == "PATCH" else {
                            return .status(200, headers: ["ETag": etag, "Cache-Control": "max-age=60"], body: String(decoding: state.note.data, as: UTF8.self))
                        }
                        let status: Int
                        if let key = request.header("idempotency-key"), state.keys.contains(key) {
                            status = 200
                        } else if let match = request.header("if-match") {
                            if match == etag, let patch = Note.from(request.body) {
                                state.note = state.note.merged(with: patch)
                                state.version += 1
                                if let key = request.header("idempotency-key") { state.keys.insert(key) }
                                status = 200
                            } else {
                                status = 412
                            }
                        } else {
                            status = 428
                        }
                        state.statuses.append(status)
                        return .status(status, headers: ["ETag": "\"v\(state.version)\""])
                    }
                })
        }

        var note: Note { state.withLock { $0.note } }
        var statuses: [Int] { state.withLock { $0.statuses } }
    }

    /// The user's fields win over the server's, the others are the server's: the user's patch
    /// re-sent on the server's version.
    struct FieldMerge: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
            let server = Note.from(conflict.serverBody) ?? Note()
            let mine = Note.from(conflict.entry.body) ?? Note()
            let merged = server.merged(with: mine)
            // Only the fields that differ from the server's go: a patch of the user's changes.
            return .rebase(body: Note(title: merged.title == server.title ? nil : merged.title, body: merged.body == server.body ? nil : merged.body).data)
        }
    }

    struct Discard: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution { .discard }
    }

    /// One device: its own folders, its own URLSession, its own connectivity.
    struct Device {
        let monitor: ManualReachabilityMonitor
        let queue: OfflineQueueEngine
        let client: OfflineFirstClient
        let read: NotesRead

        init(folder: String, origin: NoteOrigin, resolver: (any ConflictResolver)?) async throws {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.urlCache = nil
            let engine = AsyncRequestEngine(session: URLSession(configuration: configuration))
            monitor = ManualReachabilityMonitor(isConnected: true)
            let store = try await DiskQueueStore.open(directory: URL(fileURLWithPath: folder + "/queue"), lockTimeout: .seconds(10))
            queue = OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: store, configuration: .init(conflictResolver: resolver))
            let cache = try DiskResponseCache(directory: URL(fileURLWithPath: folder + "/cache"), maxBytes: 1 << 20)
            let reads = CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor)
            let url = origin.server.url("/notes/1")
            read = NotesRead(url: url)
            let overlay = OptimisticUpdate(
                mutations: { $0.url.path == "/notes/1" && $0.method == "PATCH" },
                reads: { $0.path == "/notes/1" },
                apply: { current, pending in
                    guard let patch = Note.from(pending.body) else { return current }
                    return (Note.from(current) ?? Note()).merged(with: patch).data
                })
            client = OfflineFirstClient(reads: reads, queue: queue, optimisticUpdates: [overlay])
        }

        func edit(_ patch: Note) async throws {
            let request = QueuedRequest(method: .patch, url: read.url, headers: ["Content-Type": "application/json"], body: patch.data)
            _ = try await client.mutate(request, editing: read)
        }
    }

    /// Both devices read version 1, go offline, edit; then come online one after the other.
    private func twoOfflineEdits(
        aFirst: Bool, resolverA: (any ConflictResolver)?, resolverB: (any ConflictResolver)?
    ) async throws -> (origin: NoteOrigin, a: Device, b: Device, readerA: SnapshotReader, readerB: SnapshotReader, folders: [TemporaryDirectory]) {
        let origin = try NoteOrigin()
        let folders = [TemporaryDirectory(), TemporaryDirectory()]
        let a = try await Device(folder: folders[0].url.path, origin: origin, resolver: resolverA)
        let b = try await Device(folder: folders[1].url.path, origin: origin, resolver: resolverB)
        let readerA = SnapshotReader(a.client.snapshots(for: a.read, mode: .offlineFirst, staleTime: .http))
        let readerB = SnapshotReader(b.client.snapshots(for: b.read, mode: .offlineFirst, staleTime: .http))
        await readerA.waitFor { $0.source == .network }
        await readerB.waitFor { $0.source == .network }
        await a.monitor.setConnected(false)
        await b.monitor.setConnected(false)
        try await a.edit(Note(title: "A's title"))
        try await b.edit(Note(body: "B's body"))
        #expect(Note.from(readerA.latest?.data) == Note(title: "A's title", body: "b0"))
        for device in aFirst ? [a, b] : [b, a] {
            await device.monitor.setConnected(true)
            try await device.client.waitForPendingWrites()
        }
        return (origin, a, b, readerA, readerB, folders)
    }

    @Test(arguments: [true, false])
    func withAFieldMergingResolverBothEditsReachTheServerInEitherOrder(aFirst: Bool) async throws {
        let run = try await twoOfflineEdits(aFirst: aFirst, resolverA: FieldMerge(), resolverB: FieldMerge())
        defer { run.origin.server.shutdown() }
        #expect(run.origin.note == Note(title: "A's title", body: "B's body"))
        // The first comes home on its version; the second meets a 412, is rebased, and goes once.
        #expect(run.origin.statuses == [200, 412, 200])
        let later = aFirst ? run.readerB : run.readerA
        // While it was in conflict the second device said so, with its edit on the newest body.
        #expect(later.all.contains { !$0.conflictedEntryIDs.isEmpty })
        await later.waitFor { Note.from($0.data) == Note(title: "A's title", body: "B's body") && !$0.hasPendingWrites && !$0.isFetching }
        await run.readerA.cancel()
        await run.readerB.cancel()
    }

    @Test func withDiscardTheLoserIsReportedAndItsOverlayDrops() async throws {
        let run = try await twoOfflineEdits(aFirst: true, resolverA: Discard(), resolverB: Discard())
        defer { run.origin.server.shutdown() }
        #expect(run.origin.note == Note(title: "A's title", body: "b0"))
        let shown = await run.readerB.waitFor { !$0.rejectedWrites.isEmpty && !$0.hasPendingWrites && !$0.isFetching }
        #expect(shown.rejectedWrites.map(\.reason) == [.conflict(statusCode: 412)])
        await run.readerB.waitFor { Note.from($0.data) == Note(title: "A's title", body: "b0") }
        await run.readerA.cancel()
        await run.readerB.cancel()
    }

    @Test func withoutAResolverThe412IsARejectedWrite() async throws {
        let run = try await twoOfflineEdits(aFirst: true, resolverA: nil, resolverB: nil)
        defer { run.origin.server.shutdown() }
        #expect(run.origin.note == Note(title: "A's title", body: "b0") && run.origin.statuses == [200, 412])
        let shown = await run.readerB.waitFor { !$0.rejectedWrites.isEmpty }
        #expect(shown.rejectedWrites.map(\.reason) == [.rejected(statusCode: 412)])
        await run.readerA.cancel()
        await run.readerB.cancel()
    }
}
