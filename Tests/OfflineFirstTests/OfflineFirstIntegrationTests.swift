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
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Real parts: URLSession, LoopbackHTTPServer on 127.0.0.1, real folders, two processes, SIGKILL.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("OfflineFirst through URLSession, a real server, and a relaunch after SIGKILL", .timeLimit(.minutes(5)))
struct OfflineFirstIntegrationTests {
    /// A notes server on loopback: `GET /notes` (the list, `max-age=60`), `POST /notes` (appended
    /// once per `Idempotency-Key`, 201). Every POST's key is logged.
    final class NotesServer: Sendable {
        let server: LoopbackHTTPServer
        private let state = Locked((notes: [String](), keys: [String]()))

        init(notes: [String]) throws {
            server = try LoopbackHTTPServer()
            state.withLock { $0.notes = notes }
            server.route(
                "/notes",
                handler: { [state] request in
                    if request.method == "POST" {
                        let key = request.header("idempotency-key") ?? ""
                        state.withLock { state in
                            if !state.keys.contains(key) { state.notes.append(String(decoding: request.body, as: UTF8.self)) }
                            state.keys.append(key)
                        }
                        return .status(201)
                    }
                    let body = String(decoding: Notes.encode(state.withLock { $0.notes }), as: UTF8.self)
                    return .status(200, headers: ["Cache-Control": "max-age=60", "Content-Type": "application/json"], body: body)
                })
        }

        var notes: [String] { state.withLock { $0.notes } }
        var postedKeys: [String] { state.withLock { $0.keys } }
    }

    @Test func aNoteSavedOfflineIsShownAtOnceThenDeliveredOnceAndTheListRefetched() async throws {
        let notes = try NotesServer(notes: ["a"])
        defer { notes.server.shutdown() }
        let folder = TemporaryDirectory()
        let app = try await NotesApp(folder: folder.url.path, connected: true)
        let list = NotesRead(url: notes.server.url("/notes"))
        let reader = SnapshotReader(app.client.snapshots(for: list, mode: .offlineFirst, staleTime: .http))
        await reader.waitFor { $0.source == .network && Notes.decode($0.data) == ["a"] }
        await app.monitor.setConnected(false)
        try await app.client.mutate(NewNote(url: notes.server.url("/notes"), text: "b"))
        // Yielded before `mutate` returned; the reader's own task takes it from the stream.
        let shown = await reader.waitFor { $0.hasPendingWrites }
        #expect(Notes.decode(shown.data) == ["a", "b"])
        await app.monitor.setConnected(true)
        let report = await app.queue.flush()
        // Once a pass is over the note is delivered (by this pass or the reconnect's before it):
        // if not, say what the pass saw instead of waiting for a snapshot that cannot come.
        try #require(await app.queue.pendingCount() == 0, "flush: \(report.results), ended offline: \(report.endedOffline)")
        let settled = await reader.waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.source == .network }
        #expect(Notes.decode(settled.data) == ["a", "b"] && notes.notes == ["a", "b"])
        #expect(notes.postedKeys.count == 1)
        await reader.cancel()
    }

    /// Process A goes offline, saves a note and is killed; process B opens the same folders
    /// offline and its first snapshot holds the note; B reconnects, the note is delivered once
    /// (one `Idempotency-Key`), the list is refetched, and the overlay goes.
    @Test func aNoteSavedOfflineByAKilledProcessShowsInTheNextOneAndIsDeliveredOnce() async throws {
        let notes = try NotesServer(notes: ["a"])
        defer { notes.server.shutdown() }
        let folder = TemporaryDirectory()
        let url = notes.server.url("/notes").absoluteString
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = folder.url.path as String, url = url as String] in
                let app = try await NotesApp(folder: path, connected: true)
                let list = NotesRead(url: try #require(URL(string: url)))
                _ = try await app.client.snapshot(for: list, mode: .online, staleTime: .http)  // the list is stored
                await app.monitor.setConnected(false)
                try await app.client.mutate(NewNote(url: try #require(URL(string: url)), text: "from A"))
                kill(getpid(), SIGKILL)
            }
        }
        #expect(notes.postedKeys.isEmpty)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = folder.url.path as String, url = url as String] in
                let app = try await NotesApp(folder: path, connected: false)
                let list = NotesRead(url: try #require(URL(string: url)))
                let reader = SnapshotReader(app.client.snapshots(for: list, mode: .offlineFirst, staleTime: .http))
                // Offline, before anything is fetched: the stored list with A's note on it.
                let first = await reader.waitFor { _ in true }
                #expect(Notes.decode(first.data) == ["a", "from A"] && first.hasPendingWrites && first.source == .cache)
                await app.monitor.setConnected(true)
                _ = await app.queue.flush()
                let settled = await reader.waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.source == .network }
                #expect(Notes.decode(settled.data) == ["a", "from A"])
                await reader.cancel()
            }
        }
        #expect(notes.notes == ["a", "from A"])
        #expect(notes.postedKeys.count == 1)
    }
}
