import Auth
import Foundation
import HTTPTypes
import IntegrationTestSupport
import NotesAPI
import NotesOrigin
import OfflineQueue
import OpenAPIRuntime
import Reachability
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceOpenAPI
import ResilienceTesting
import ResponseCache
import Retry
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Both sides generated from `NotesAPI/openapi.yaml`: the generated client over
/// `ResilienceTransport` and the engine on real AsyncHTTPClient, against the generated server on
/// Hummingbird (`NotesOrigin`) on 127.0.0.1.
@Suite("A generated client over ResilienceTransport against the generated server", .timeLimit(.minutes(2)))
struct GeneratedClientTests {
    let session = AsyncHTTPClientSession()

    static func retrying(_ configuration: AsyncRequestEngine.Configuration = .init()) -> AsyncRequestEngine.Configuration {
        var configuration = configuration
        configuration.retry.policy = FixedIntervalRetryPolicy(maxRetries: 3, interval: 0)
        return configuration
    }

    func client(_ server: NotesServer, sender: some RequestSending, configuration: ResilienceTransport.Configuration = .init()) -> Client {
        Client(serverURL: server.baseURL, transport: ResilienceTransport(sender: sender, configuration: configuration))
    }

    func withServer(_ body: (NotesServer) async throws -> Void) async throws {
        let server = try await NotesServer.start()
        do {
            try await body(server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    // MARK: Retries

    @Test func a503BurstIsRetriedWithTheSameIdempotencyKeyAndOneEffect() async throws {
        try await withServer { server in
            // The first two answers are lost after the note was made: only the key keeps it one note.
            server.origin.failNext(2, retryAfter: 0, operation: "createNote", afterEffect: true)
            let notes = client(server, sender: AsyncRequestEngine(session: session, configuration: Self.retrying()))
            let output = try await notes.createNote(headers: .init(Idempotency_hyphen_Key: "note-1"), body: .json(.init(text: "hello")))
            let note = try output.created.body.json
            #expect(note.text == "hello")
            #expect(server.origin.effects == 1)
            let keys = server.origin.requests.map { $0.headerFields[.init("Idempotency-Key")!] }
            #expect(keys == ["note-1", "note-1", "note-1"])
        }
    }

    @Test func aPOSTWithoutAKeyIsNotRetried() async throws {
        try await withServer { server in
            server.origin.failNext(1, retryAfter: 0)
            let notes = client(server, sender: AsyncRequestEngine(session: session, configuration: Self.retrying()))
            let output = try await notes.createNote(body: .json(.init(text: "once")))
            guard case .serviceUnavailable(let unavailable) = output else {
                Issue.record("expected 503, got \(output)")
                return
            }
            #expect(unavailable.headers.Retry_hyphen_After == 0)
            #expect(server.origin.hits("createNote") == 1)
            #expect(server.origin.effects == 0)
        }
    }

    // MARK: Tokens

    @Test func aStormOf1000OperationsMeeting401RefreshesTheTokenOnce() async throws {
        try await withServer { server in
            server.origin.requireToken("fresh")
            let provider = CountingTokenProvider(current: "expired", next: "fresh")
            // Every operation its own request (identical GETs would otherwise share one call).
            let engine = AsyncRequestEngine(session: session, configuration: .init(deduplicatedMethods: []))
            let authenticated = AuthenticatedRequestEngine(requestEngine: engine, coordinator: TokenRefreshCoordinator(provider: provider))
            let notes = client(server, sender: authenticated)
            let outcomes = try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<1_000 {
                    group.addTask {
                        if case .ok = try await notes.listNotes() { return true }
                        return false
                    }
                }
                return try await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(outcomes.count == 1_000)
            #expect(outcomes.allSatisfy { $0 })
            #expect(provider.refreshes == 1)
            // Each request sent with the expired token met a 401 and went once more with the fresh one.
            let expired = server.origin.requests.filter { $0.headerFields[.authorization] == "Bearer expired" }.count
            #expect(expired >= 1)
            #expect(server.origin.requests.count == 1_000 + expired)
            #expect(server.origin.requests.allSatisfy { ["Bearer expired", "Bearer fresh"].contains($0.headerFields[.authorization]) })
        }
    }

    // MARK: The cache

    @Test func aGETIsServedFromTheCacheOffline() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("notes-cache-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let monitor = ManualReachabilityMonitor(isConnected: true)
        let cached = CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: session), cache: try DiskResponseCache(directory: folder, maxBytes: 1 << 20),
            reachabilityMonitor: monitor, configuration: .init(defaultMode: .offlineFirst))
        let server = try await NotesServer.start()
        server.origin.cacheSeconds = 0  // stale at once: only offlineFirst may serve it
        let notes = client(server, sender: cached)
        _ = try await notes.createNote(body: .json(.init(text: "kept")))
        let online = try await notes.listNotes()
        #expect(try online.ok.body.json.map(\.text) == ["kept"])
        await server.stop()
        await monitor.setConnected(false)
        let offline = try await notes.listNotes()
        #expect(try offline.ok.body.json.map(\.text) == ["kept"])
        #expect(try offline.ok.headers.ETag == online.ok.headers.ETag)
    }

    @Test func aSecondUserOnTheDeviceNeverGetsTheFirstUsersCachedNotes() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("notes-cache-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let monitor = ManualReachabilityMonitor(isConnected: true)
        // One device: one store on disk, each user's engine with the user's partition.
        let store = try DiskResponseCache(directory: folder, maxBytes: 1 << 20)
        func signedIn(_ user: String) -> CachedRequestEngine {
            CachedRequestEngine(
                requestEngine: AsyncRequestEngine(session: session), cache: store, reachabilityMonitor: monitor,
                configuration: .init(partition: user, defaultMode: .offlineFirst))
        }
        let server = try await NotesServer.start()
        server.origin.cacheSeconds = 0
        let alice = client(server, sender: signedIn("alice"))
        let bob = client(server, sender: signedIn("bob"))
        _ = try await alice.createNote(body: .json(.init(text: "alice's")))
        #expect(try await alice.listNotes().ok.body.json.map(\.text) == ["alice's"])
        await server.stop()
        await monitor.setConnected(false)
        // Offline, Alice reads her notes from the store. Bob, on the same device, finds nothing of
        // hers there: his read waits for the network (offline-first pauses a miss) and, with the
        // network back and the server gone, fails — it never answers with her notes.
        #expect(try await alice.listNotes().ok.body.json.map(\.text) == ["alice's"])
        let bobs = Task { await transportError { _ = try await bob.listNotes() } }
        await monitor.setConnected(true)
        let error = await bobs.value
        #expect((error as? NetworkError)?.caseName == "transport(cannotConnectToHost)", "\(String(describing: error))")
    }

    // MARK: Offline operations

    static let offlineClient = ChildProcess.executable(named: "notes-offline-client", overriddenBy: "NOTES_OFFLINE_CLIENT")

    @Test(.enabled(if: offlineClient != nil, "notes-offline-client is not beside the test bundle: build with `swift build --build-tests`"))
    func anOfflineCreateNoteIsDeliveredAfterARelaunchExactlyOnce() async throws {
        let binary = try #require(Self.offlineClient)
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("notes-queue-\(UUID().uuidString)")
        let logs = FileManager.default.temporaryDirectory.appendingPathComponent("notes-logs-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: logs, withIntermediateDirectories: true)
        defer {
            try? FileManager.default.removeItem(at: folder)
            try? FileManager.default.removeItem(at: logs)
        }
        try await withServer { server in
            let url = server.baseURL.absoluteString
            // The app, offline, stores the operation and dies by SIGKILL once it has the answer.
            let app = try ChildProcess(
                binary: binary, arguments: ["enqueue", folder.path, url, "written offline"], outputURL: logs.appendingPathComponent("enqueue"))
            #expect(await app.exited() == .signal(SIGKILL), "\(app.tail())")
            #expect(app.output.contains("QUEUED ") && !app.output.contains("QUEUED none"), "\(app.tail())")
            #expect(server.origin.requests.isEmpty)
            // Relaunched online, twice: the note is made once.
            for run in 0..<2 {
                let relaunched = try ChildProcess(binary: binary, arguments: ["drain", folder.path, url], outputURL: logs.appendingPathComponent("drain\(run)"))
                #expect(await relaunched.exited() == .status(0), "\(relaunched.tail())")
                #expect(relaunched.output.contains(run == 0 ? "DRAINED 1 REMAINING 0" : "DRAINED 0 REMAINING 0"), "\(relaunched.tail())")
            }
            #expect(server.origin.effects == 1)
            #expect(server.origin.hits("createNote") == 1)
            let notes = client(server, sender: AsyncRequestEngine(session: session))
            #expect(try await notes.listNotes().ok.body.json.map(\.text) == ["written offline"])
        }
    }

    @Test func anOperationQueuedOfflineKeepsItsOperationIDAndItsOwnIdempotencyKey() async throws {
        try await withServer { server in
            let monitor = ManualReachabilityMonitor(isConnected: false)
            let folder = FileManager.default.temporaryDirectory.appendingPathComponent("notes-queue-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: folder) }
            let queue = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session), reachabilityMonitor: monitor, store: try DiskQueueStore(directory: folder))
            let offline = OfflineOperations(queue: queue) { Client(serverURL: server.baseURL, transport: $0) }
            let result = try await offline.enqueue(orderingKey: "notes") {
                _ = try await $0.createNote(headers: .init(Idempotency_hyphen_Key: "chosen-key"), body: .json(.init(text: "mine")))
            }
            let id = try #require(result.queuedID)
            let entry = try #require(await queue.items.first { $0.id == id })
            #expect(entry.operationID == "createNote")
            #expect(entry.idempotencyKey == "chosen-key")
            #expect(entry.orderingKey == "notes")
            #expect(entry.headers.keys.allSatisfy { $0.lowercased() != "idempotency-key" })
            await #expect(throws: OfflineOperationsError.noOperation) { _ = try await offline.enqueue { _ in } }
            await monitor.setConnected(true)
            _ = await queue.flush()
            #expect(server.origin.requests.map { $0.headerFields[.init("Idempotency-Key")!] } == ["chosen-key"])
            #expect(server.origin.effects == 1)
            // Online, the operation goes at once and the queue says how it was answered.
            let sent = try await offline.enqueue { _ = try await $0.createNote(body: .json(.init(text: "now"))) }
            #expect(sent == .sent(statusCode: 201))
            await queue.close()
        }
    }

    @Test func credentialsAClientMiddlewareAddsAreNeverStoredWithAnOfflineOperation() async throws {
        try await withServer { server in
            let monitor = ManualReachabilityMonitor(isConnected: false)
            let folder = FileManager.default.temporaryDirectory.appendingPathComponent("notes-queue-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: folder) }
            let queue = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session), reachabilityMonitor: monitor, store: try DiskQueueStore(directory: folder))
            // The app's client signs every request in a middleware, as generated clients often do.
            let offline = OfflineOperations(queue: queue) {
                Client(serverURL: server.baseURL, transport: $0, middlewares: [SigningMiddleware(token: "secret-token-1234")])
            }
            let result = try await offline.enqueue { _ = try await $0.createNote(body: .json(.init(text: "signed"))) }
            let id = try #require(result.queuedID)
            let entry = try #require(await queue.items.first { $0.id == id })
            #expect(entry.headers.keys.allSatisfy { !["authorization", "cookie"].contains($0.lowercased()) }, "\(entry.headers.keys)")
            // Not in the entry, not anywhere on disk.
            let files = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL } ?? []
            #expect(!files.isEmpty)
            for file in files where (try? file.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true {
                let bytes = try Data(contentsOf: file)
                #expect(bytes.range(of: Data("secret-token-1234".utf8)) == nil, "\(file.lastPathComponent)")
            }
            await monitor.setConnected(true)
            _ = await queue.flush()
            #expect(server.origin.effects == 1)
            await queue.close()
        }
    }

    // MARK: Breakers, cancellation, bounds, header fields

    @Test func aBreakerOpensOnAFailingOperationAndNotOnOthers() async throws {
        try await withServer { server in
            let registry = CircuitBreakerRegistry(configuration: .init(windowSize: 4, minimumCalls: 4, failureRateThreshold: 0.5, openDuration: .seconds(3600)))
            let engine = AsyncRequestEngine(session: session, configuration: .init(circuitBreaker: .perOperation(registry)))
            let notes = client(server, sender: engine)
            server.origin.failNext(4, operation: "getNote")
            for _ in 0..<4 {
                guard case .serviceUnavailable = try await notes.getNote(path: .init(noteID: "n1")) else {
                    Issue.record("expected 503")
                    return
                }
            }
            let refused = await transportError { _ = try await notes.getNote(path: .init(noteID: "n1")) }
            #expect((refused as? NetworkError)?.caseName == "circuitOpen")
            #expect(server.origin.hits("getNote") == 4)
            guard case .ok = try await notes.listNotes() else {
                Issue.record("listNotes should pass its own breaker")
                return
            }
            let host = try #require(CircuitBreakerRegistry.authority(of: server.baseURL))
            #expect(registry.breaker(forOperation: "getNote", onHost: host).state == .open)
            #expect(registry.breaker(forOperation: "listNotes", onHost: host).state == .closed)
        }
    }

    @Test func cancellingAnOperationCancelsItsRequest() async throws {
        try await withServer { server in
            server.origin.hold("listNotes")
            let notes = client(server, sender: AsyncRequestEngine(session: session))
            let call = Task { await transportError { _ = try await notes.listNotes() } }
            await server.origin.waitForHeld(1)
            call.cancel()
            let error = await call.value
            #expect((error as? NetworkError)?.caseName == "cancelled")
            server.origin.release()
            #expect(server.origin.hits("listNotes") == 1)
        }
    }

    @Test func aBodyOverTheBoundFailsWithTheTypedErrorAndNothingIsSent() async throws {
        try await withServer { server in
            let notes = client(server, sender: AsyncRequestEngine(session: session), configuration: .init(maximumRequestBodySize: 64))
            let error = await transportError { _ = try await notes.createNote(body: .json(.init(text: String(repeating: "x", count: 100)))) }
            #expect(error as? ResilienceTransportError == .requestBodyTooLarge(limit: 64))
            #expect(server.origin.requests.isEmpty)
            guard case .created = try await notes.createNote(body: .json(.init(text: "short"))) else {
                Issue.record("a body within the bound should go")
                return
            }
        }
    }

    @Test func repeatedHeaderFieldsSurviveBothWays() async throws {
        try await withServer { server in
            let notes = client(server, sender: AsyncRequestEngine(session: session))
            let output = try await notes.echoTags(headers: .init(X_hyphen_Tag: ["red", "green", "blue"]))
            let ok = try output.ok
            #expect(try ok.body.json == ["red", "green", "blue"])  // as the server read them
            #expect(ok.headers.X_hyphen_Tag == ["red", "green", "blue"])  // as the client read the answer
        }
    }
}

/// The error under a generated client's `ClientError`: what the transport threw.
func transportError(_ body: () async throws -> Void) async -> (any Error)? {
    do {
        try await body()
        return nil
    } catch let error as ClientError {
        return error.underlyingError
    } catch {
        return error
    }
}

/// Adds `Authorization` and a session `Cookie` to every request, as an app's signing middleware does.
struct SigningMiddleware: ClientMiddleware {
    let token: String

    func intercept(
        _ request: HTTPRequest, body: HTTPBody?, baseURL: URL, operationID: String,
        next: @Sendable (HTTPRequest, HTTPBody?, URL) async throws -> (HTTPResponse, HTTPBody?)
    ) async throws -> (HTTPResponse, HTTPBody?) {
        var request = request
        request.headerFields[.authorization] = "Bearer " + token
        request.headerFields[.cookie] = "session=" + token
        return try await next(request, body, baseURL)
    }
}
