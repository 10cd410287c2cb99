import Auth
import Foundation
import NotesAPI
import NotesOrigin
import OfflineQueue
import Reachability
import Synchronization

// `swift run --package-path Integrations openapi-example`: the generated notes client through
// `NotesApp` (NotesApp.swift, the user's code) against the generated notes server on 127.0.0.1,
// with the server's switches turned to show each layer at work. Exits non-zero if one does not.

/// The app's tokens: `expired` until the first refresh, then `fresh`.
final class Tokens: TokenProvider {
    private let state = Mutex((token: "expired", refreshes: 0))
    var refreshes: Int { state.withLock { $0.refreshes } }
    func currentToken() async -> String? { state.withLock { $0.token } }
    func refreshToken() async throws -> String {
        state.withLock {
            $0 = ("fresh", $0.refreshes + 1)
        }
        return "fresh"
    }
}

func check(_ condition: Bool, _ line: String) {
    print((condition ? "ok   " : "FAIL ") + line)
    if !condition { exit(1) }
}

let server = try await NotesServer.start()
let folder = FileManager.default.temporaryDirectory.appendingPathComponent("openapi-example-\(UUID().uuidString)")
defer { try? FileManager.default.removeItem(at: folder) }
let network = ManualReachabilityMonitor(isConnected: true)
let tokens = Tokens()
let app = try NotesApp(serverURL: server.baseURL, folder: folder, user: "ada", tokens: tokens, network: network)
server.origin.requireToken("fresh")

// Ten reads at once meet 401 with the expired token: one refresh, and every read succeeds.
let reads = try await withThrowingTaskGroup(of: Bool.self) { group in
    for _ in 0..<10 { group.addTask { if case .ok = try await app.notes.listNotes() { true } else { false } } }
    var answered = 0
    for try await ok in group where ok { answered += 1 }
    return answered
}
check(reads == 10 && tokens.refreshes == 1, "10 reads through a 401: \(reads) answered, \(tokens.refreshes) token refresh")

// A 503 burst whose answers are lost after the note was made: retried with one key, one note.
server.origin.failNext(2, retryAfter: 0, operation: "createNote", afterEffect: true)
let created = try await app.notes.createNote(headers: .init(Idempotency_hyphen_Key: "first-note"), body: .json(.init(text: "hello")))
check((try? created.created) != nil && server.origin.effects == 1, "createNote through two lost answers: \(server.origin.effects) note made")

// Offline: the list read online a moment ago comes from the cache; a new note waits in the queue.
_ = try await app.notes.listNotes()
await network.setConnected(false)
let cachedRead = try await app.notes.listNotes()
check((try? cachedRead.ok.body.json.map(\.text)) == ["hello"], "listNotes offline: answered from the cache")
let queued = try await app.offline.enqueue { _ = try await $0.createNote(body: .json(.init(text: "written offline"))) }
check(queued.queuedID != nil, "createNote offline: \(queued)")

// Back online: the queue delivers it once.
await network.setConnected(true)
let report = await app.queue.flush()
check(report.delivered.count == 1 && server.origin.effects == 2, "back online: \(report.delivered.count) delivered, \(server.origin.effects) notes in all")
await app.queue.close()
await server.stop()
