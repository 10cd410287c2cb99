import Foundation
import Resilience
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The offline-first loop end to end: a notes screen (`GET /notes`) and a note created with
/// `POST /notes` while offline meet — the note shows in the list at once, in a second process
/// relaunched offline too, and once the network is back it is delivered once and the list is
/// refetched without ever dropping it.
extension Demo {
    /// The notes list, as JSON strings.
    static func notes(_ data: Data?) -> [String] {
        data.flatMap { try? JSONDecoder().decode([String].self, from: $0) } ?? []
    }

    /// A note created offline appears at the end of the list until the server has it.
    static let appendNote = OptimisticUpdate(
        mutations: { $0.method == "POST" && $0.url.path == "/notes" },
        reads: { $0.path == "/notes" },
        apply: { current, pending in
            try JSONEncoder().encode(notes(current) + [String(decoding: pending.body ?? Data(), as: UTF8.self)])
        }
    )

    struct CreateNote: QueueableRequest {
        let url: URL
        let text: String
        var method: HTTPMethod { .post }
        var body: Data? { Data(text.utf8) }
        var timeout: TimeInterval { 10 }
    }

    /// The stack one process of the app opens on `folder`.
    static func notesApp(folder: String, connected: Bool) async throws -> (OfflineFirstClient, ManualReachabilityMonitor) {
        let monitor = ManualReachabilityMonitor(isConnected: connected)
        let engine = AsyncRequestEngine()
        let store = try await DiskQueueStore.open(directory: URL(fileURLWithPath: folder + "/queue"), lockTimeout: .seconds(10))
        var cache: DiskResponseCache?
        for _ in 0..<100 where cache == nil {  // the previous process may still be letting go of it
            do {
                cache = try DiskResponseCache(directory: URL(fileURLWithPath: folder + "/cache"), maxBytes: 1 << 20)
            } catch ResponseCacheError.folderInUse {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        guard let cache else { throw ResponseCacheError.folderInUse(path: folder + "/cache") }
        let client = OfflineFirstClient(
            reads: CachedRequestEngine(requestEngine: engine, cache: cache, reachabilityMonitor: monitor),
            queue: OfflineQueueEngine(requestEngine: engine, reachabilityMonitor: monitor, store: store),
            optimisticUpdates: [appendNote]
        )
        return (client, monitor)
    }

    static func offlineNotes(_ server: LoopbackHTTPServer) async throws -> Outcome {
        let state = Locked((notes: ["buy milk"], keys: [String]()))
        server.route(
            "/notes",
            handler: { request in
                if request.method == "POST" {
                    let key = request.header("idempotency-key") ?? ""
                    state.withLock { state in
                        if !state.keys.contains(key) { state.notes.append(String(decoding: request.body, as: UTF8.self)) }
                        state.keys.append(key)
                    }
                    return .status(201)
                }
                let list = (try? JSONEncoder().encode(state.withLock { $0.notes })) ?? Data()
                return .status(200, headers: ["Cache-Control": "max-age=60", "Content-Type": "application/json"], body: String(decoding: list, as: UTF8.self))
            })
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-demo-notes-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let url = server.url("/notes")
        var steps: [Bool] = []
        do {
            let (client, monitor) = try await notesApp(folder: folder, connected: true)
            let screen = client.snapshots(for: DemoRequest(url: url), mode: .offlineFirst, staleTime: .http)
            var shown = screen.makeAsyncIterator()
            var latest = try await shown.next()
            while latest?.source != .network { latest = try await shown.next() }
            print("    online: the screen shows \(notes(latest?.data)) (\(latest.map { "\($0.source)" } ?? "-"))")
            steps.append(notes(latest?.data) == ["buy milk"])

            await monitor.setConnected(false)
            try await client.mutate(CreateNote(url: url, text: "call mum"))
            latest = try await shown.next()
            print("    offline: \"call mum\" saved → the screen shows \(notes(latest?.data)), pending writes: \(latest?.hasPendingWrites ?? false)")
            steps.append(notes(latest?.data) == ["buy milk", "call mum"] && latest?.hasPendingWrites == true && state.withLock { $0.keys.isEmpty })
        }  // the app quits (its folders are released)

        let relaunch = await relaunchOffline(folder: folder, url: url.absoluteString)
        for line in relaunch.lines { print("    second process: \(line)") }
        steps.append(relaunch.passed)
        let keys = state.withLock { $0.keys }
        let serverNotes = state.withLock { $0.notes }
        print("    server: \(serverNotes), \(keys.count) POST(s) with \(Set(keys).count) Idempotency-Key(s)")
        steps.append(serverNotes == ["buy milk", "call mum"] && keys.count == 1)
        let passed = steps.allSatisfy { $0 }
        return Outcome(
            passed: passed,
            detail: passed
                ? "shown at once offline, in a relaunched process too, delivered once, refetched without flicker"
                : "steps: \(steps)")
    }

    /// Runs `resilience-demo notes-relaunch FOLDER URL`: a second process of the app.
    static func relaunchOffline(folder: String, url: String) async -> (passed: Bool, lines: [String]) {
        let executable = Demo.ownExecutable
        do {
            let (termination, output) = try SpawnedProcess.run(executable, ["notes-relaunch", folder, url])
            let lines = String(decoding: output, as: UTF8.self).split(separator: "\n").map(String.init)
            return (termination == .exited(0), lines)
        } catch {
            return (false, ["could not run: \(error)"])
        }
    }
}

/// `resilience-demo notes-relaunch FOLDER URL`: the app started again, offline, on the folders
/// a previous run left: its first snapshot must hold the pending note; then the network comes
/// back, the note is delivered, and the list is refetched. Exits 0 when all of that held.
enum NotesRelaunchCommand {
    static func run(_ arguments: [String]) async -> Int32 {
        guard arguments.count == 2, let url = URL(string: arguments[1]) else {
            FileHandle.standardError.write(Data("usage: resilience-demo notes-relaunch FOLDER URL\n".utf8))
            return 64
        }
        do {
            let (client, monitor) = try await Demo.notesApp(folder: arguments[0], connected: false)
            var shown = client.snapshots(for: DemoRequest(url: url), mode: .offlineFirst, staleTime: .http).makeAsyncIterator()
            guard let first = try await shown.next() else { return 1 }
            print("relaunched offline: the screen shows \(Demo.notes(first.data)), pending writes: \(first.hasPendingWrites)")
            await monitor.setConnected(true)
            await client.queue.start()
            var seen = [Demo.notes(first.data)]
            var last = first
            while last.hasPendingWrites || !last.settlingEntryIDs.isEmpty || last.isFetching || last.source != .network {
                guard let next = try await shown.next() else { return 1 }
                last = next
                seen.append(Demo.notes(next.data))
            }
            print("reconnected: delivered, refetched → \(Demo.notes(last.data)) from the \(last.source), pending writes: \(last.hasPendingWrites)")
            let neverDropped = seen.allSatisfy { $0.contains("call mum") }
            print("the note was on screen in all \(seen.count) snapshots: \(neverDropped)")
            let ok =
                Demo.notes(first.data) == ["buy milk", "call mum"] && first.hasPendingWrites
                && Demo.notes(last.data) == ["buy milk", "call mum"] && neverDropped
            await client.queue.stop()
            return ok ? 0 : 1
        } catch {
            print("failed: \(error)")
            return 1
        }
    }
}
