import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A conflict across a SIGKILL (issue 46): a process killed after the server's 412 was stored,
/// and before the resolved write was sent — or while it was on the wire — leaves the next process
/// on the same folder to resolve and deliver it once, and the refused body never goes again.
/// Real processes, real files, URLSession to a real server on 127.0.0.1.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("Conflicts across SIGKILL: the next process resolves and delivers once", .timeLimit(.minutes(5)))
struct ConflictCrashTests {
    /// `GET /notes/1`: `ETag: "v<n>"`, the body applied last. `PUT`: 412 unless `If-Match` names
    /// the current version; applied once per `Idempotency-Key`; when `killing` names a process,
    /// that process is killed as the write is applied, before it is answered.
    final class Origin: Sendable {
        let server: LoopbackHTTPServer
        private let state = Locked((version: 1, body: "server v1", keys: Set<String>(), applied: [String](), puts: [(String?, String)]()))
        let killing = Locked<String?>(nil)

        init() throws {
            server = try LoopbackHTTPServer()
            server.route(
                "/notes/1",
                handler: { [state, killing] request in
                    let (status, applies): (Int, Bool) = state.withLock { state in
                        if request.method == "GET" { return (200, false) }
                        let body = String(decoding: request.body, as: UTF8.self)
                        state.puts.append((request.header("if-match"), body))
                        let key = request.header("idempotency-key") ?? ""
                        if state.keys.contains(key) { return (200, false) }
                        guard request.header("if-match") == "\"v\(state.version)\"" else { return (412, false) }
                        state.keys.insert(key)
                        state.version += 1
                        state.body = body
                        state.applied.append(body)
                        return (200, true)
                    }
                    if applies, let path = killing.withLock({ $0 }), let text = try? String(contentsOfFile: path, encoding: .utf8), let pid = pid_t(text) {
                        _ = kill(pid, SIGKILL)
                    }
                    if request.method == "GET" {
                        let (version, body) = state.withLock { ($0.version, $0.body) }
                        return .status(200, headers: ["ETag": "\"v\(version)\""], body: body)
                    }
                    return .status(status)
                })
        }

        var applied: [String] { state.withLock { $0.applied } }
        var puts: [(ifMatch: String?, body: String)] { state.withLock { $0.puts.map { ($0.0, $0.1) } } }
    }

    struct Rebase: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
            .rebase(body: Data("\(String(decoding: conflict.serverBody ?? Data(), as: UTF8.self)) + mine".utf8))
        }
    }

    /// Kills its process when asked: after the 412 and the server's version were had, before any answer.
    struct KillWhenAsked: ConflictResolver {
        func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution {
            kill(getpid(), SIGKILL)
            return .discard
        }
    }

    static func engine(folder: String, resolver: any ConflictResolver) throws -> OfflineQueueEngine {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        return OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: configuration)),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: try DiskQueueStore(directory: URL(fileURLWithPath: folder)),
            configuration: .init(conflictResolver: resolver)
        )
    }

    /// The next process: the same folder, a resolver that rebases; resolves (if need be) and
    /// sends. Returns what the two passes delivered.
    private func relaunch(_ folder: TemporaryDirectory) async throws -> [UUID] {
        let engine = try Self.engine(folder: folder.url.path, resolver: Rebase())
        #expect(engine.disk?.openReport.quarantined.isEmpty == true)
        var delivered = await engine.flush().delivered
        await engine.resolutionsSettled()
        delivered += await engine.flush().delivered
        #expect(await engine.pendingCount() == 0)
        await engine.close()
        return delivered
    }

    @Test func killedWhileTheResolverThinksTheNextProcessResolvesAndDeliversOnce() async throws {
        #if os(Linux)
        let origin = try Origin()
        defer { origin.server.shutdown() }
        let folder = TemporaryDirectory()
        let url = origin.server.url("/notes/1").absoluteString
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = folder.url.path as String, url = url as String] in
                let engine = try ConflictCrashTests.engine(folder: path, resolver: KillWhenAsked())
                let request = QueuedRequest(method: .put, url: URL(string: url)!, body: Data("mine".utf8), editBase: EditBase(etag: "\"v0\""))
                _ = try await engine.enqueue(request, sending: .onNextDrain)
                _ = await engine.flush()
                await engine.resolutionsSettled()  // killed in the resolver: never returns
                exit(0)
            }
        }
        let stored = try #require(try DiskQueueStore(directory: folder.url).orderedEntries().first)
        #expect(stored.conflict?.statusCode == 412 && stored.body == Data("mine".utf8))
        #expect(try await relaunch(folder) == [stored.id])
        #expect(origin.applied == ["server v1 + mine"])
        // The refused body went once (the 412), never again; every write carried a version.
        #expect(origin.puts.map(\.body) == ["mine", "server v1 + mine"] && origin.puts.allSatisfy { $0.ifMatch != nil })
        #endif
    }

    @Test func killedWithTheResolvedWriteOnTheWireTheNextProcessSendsItAgainAndItAppliesOnce() async throws {
        #if os(Linux)
        let origin = try Origin()
        defer { origin.server.shutdown() }
        let folder = TemporaryDirectory()
        let pidFile = TemporaryDirectory()
        try FileManager.default.createDirectory(at: pidFile.url, withIntermediateDirectories: true)
        let pidPath = pidFile.url.appendingPathComponent("pid").path
        origin.killing.withLock { $0 = pidPath }
        let url = origin.server.url("/notes/1").absoluteString
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = folder.url.path as String, url = url as String, pidPath = pidPath as String] in
                ExitTests.append("\(getpid())", toFileAt: pidPath)
                let engine = try ConflictCrashTests.engine(folder: path, resolver: Rebase())
                let request = QueuedRequest(method: .put, url: URL(string: url)!, body: Data("mine".utf8), editBase: EditBase(etag: "\"v0\""))
                _ = try await engine.enqueue(request, sending: .onNextDrain)
                _ = await engine.flush()
                await engine.resolutionsSettled()
                _ = await engine.flush()  // the origin applies the rebased write and kills this process
                exit(0)
            }
        }
        origin.killing.withLock { $0 = nil }
        let stored = try #require(try DiskQueueStore(directory: folder.url).orderedEntries().first)
        #expect(stored.conflict == nil && stored.base == EditBase(etag: "\"v1\"") && stored.body == Data("server v1 + mine".utf8))
        #expect(try await relaunch(folder) == [stored.id])
        // Sent twice with one key: applied once.
        #expect(origin.applied == ["server v1 + mine"])
        #expect(origin.puts.map(\.body) == ["mine", "server v1 + mine", "server v1 + mine"])
        #endif
    }
}
