import Foundation
import Reachability
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Two users of one app on one device, through the real URLSession transport, a real server on
/// 127.0.0.1 and real cache files: a response the server personalized by cookie is never served
/// to the other user. The server answers `GET /me` with the user its `Cookie` names (or a guest),
/// `Vary: Cookie` and `max-age=60`; `GET /login?user=X` sets `session=X` (a session cookie).
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("Cookies and the cache: no user sees another's response", .serialized, .timeLimit(.minutes(5)))
struct CookieIsolationTests {
    static func server() throws -> LoopbackHTTPServer {
        let server = try LoopbackHTTPServer()
        server.route(
            "/me",
            handler: { request in
                let user = request.header("cookie").flatMap { cookie in
                    cookie.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
                        .first { $0.hasPrefix("session=") }.map { String($0.dropFirst("session=".count)) }
                }
                return .status(200, headers: ["Cache-Control": "max-age=60", "Vary": "Cookie"], body: "hello \(user ?? "guest")")
            })
        server.route(
            "/login",
            handler: { request in
                let user = URLComponents(string: request.target)?.queryItems?.first { $0.name == "user" }?.value ?? "nobody"
                return .status(204, headers: ["Set-Cookie": "session=\(user); Path=/"])
            })
        return server
    }

    struct Read: NetworkRequest {
        let url: URL
        var method: HTTPMethod { .get }
        var timeout: TimeInterval = 10
    }

    /// A jar of its own (the process's shared one is left alone), holding `session=user` for 127.0.0.1.
    static func jar(signedIn user: String) throws -> HTTPCookieStorage {
        let jar = HTTPCookieStorage.sharedCookieStorage(forGroupContainerIdentifier: "resilience-tests-\(UUID().uuidString)")
        try signIn(user, in: jar)
        return jar
    }

    /// `session=user` for 127.0.0.1, sent with requests below `path`.
    static func sessionCookie(_ user: String, path: String = "/") throws -> HTTPCookie {
        let origin = try #require(URL(string: "http://127.0.0.1\(path)"))
        return try #require(HTTPCookie(properties: [.name: "session", .value: user, .domain: "127.0.0.1", .path: path, .originURL: origin]))
    }

    static func signIn(_ user: String, in jar: HTTPCookieStorage) throws {
        for cookie in jar.cookies ?? [] { jar.deleteCookie(cookie) }
        jar.setCookie(try sessionCookie(user))
    }

    static func cached(_ transport: URLSessionTransport, folder: TemporaryDirectory, partition: String? = nil) throws -> CachedRequestEngine {
        CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: transport),
            cache: try DiskResponseCache(directory: folder.url, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            configuration: .init(partition: partition)
        )
    }

    static func text(_ response: CachedResponse) -> String { String(decoding: response.data, as: UTF8.self) }

    @Test func theDefaultTransportNeitherSendsNorStoresCookies() async throws {
        let server = try Self.server()
        defer { server.shutdown() }
        // A cookie in the process's shared jar (a web login, another URLSession), as on a device.
        let planted = try Self.sessionCookie("alice", path: "/me")
        HTTPCookieStorage.shared.setCookie(planted)
        defer { HTTPCookieStorage.shared.deleteCookie(planted) }
        for transport in [URLSessionTransport.shared, URLSessionTransport(configuration: .default)] {
            let (body, _) = try await transport.data(for: URLRequest(url: server.url("/me")))
            #expect(String(decoding: body, as: UTF8.self) == "hello guest")
        }
        #expect(server.requestLog.allSatisfy { $0.header("cookie") == nil })
        // A response's `Set-Cookie` is not taken into the shared jar either.
        let before = HTTPCookieStorage.shared.cookies(for: server.url("/login"))?.count ?? 0
        _ = try await URLSessionTransport(configuration: .default).data(for: URLRequest(url: server.url("/login?user=mallory")))
        #expect((HTTPCookieStorage.shared.cookies(for: server.url("/login"))?.count ?? 0) == before)
    }

    @Test func withTheDefaultTransportTheCacheStoresOnlyWhatWasSentAnonymously() async throws {
        let server = try Self.server()
        defer { server.shutdown() }
        let planted = try Self.sessionCookie("alice", path: "/me")
        HTTPCookieStorage.shared.setCookie(planted)
        defer { HTTPCookieStorage.shared.deleteCookie(planted) }
        let folder = TemporaryDirectory()
        let reads = try Self.cached(URLSessionTransport(configuration: .default), folder: folder)
        let first = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        let second = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        // What was stored is what the server answered a request without a cookie.
        #expect(Self.text(first) == "hello guest" && first.source == .network)
        #expect(Self.text(second) == "hello guest" && second.source == .cache)
    }

    @Test func withCookiesOptedInAndNoPartitionACookiedResponseIsNeverStored() async throws {
        let server = try Self.server()
        defer { server.shutdown() }
        let configuration = URLSessionConfiguration.ephemeral
        let jar = try Self.jar(signedIn: "alice")
        configuration.httpCookieStorage = jar
        let transport = URLSessionTransport(configuration: configuration, usesCookies: true)
        #expect(transport.credentialHeaders(for: server.url("/me"))["Cookie"] == "session=alice")
        let folder = TemporaryDirectory()
        let reads = try Self.cached(transport, folder: folder)
        let alice = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        #expect(Self.text(alice) == "hello alice" && alice.source == .network)
        try Self.signIn("bob", in: jar)
        let bob = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        #expect(Self.text(bob) == "hello bob" && bob.source == .network)
        #expect(reads.cache.count == 0 && reads.cache.statistics.stored == 0)
        #expect(server.requestLog.map { $0.header("cookie") } == ["session=alice", "session=bob"])
    }

    /// Two users, two processes, one device: alice's process reads her personalized `/me` through a
    /// transport that keeps cookies (one partition for the device) and is killed; bob's process
    /// opens the same cache folder, signed in as bob, and is never answered with alice's response.
    @Test func anotherUsersProcessOnTheSameFoldersIsNeverAnsweredWithTheFirstUsersResponse() async throws {
        #if os(Linux) || os(macOS)
        let server = try Self.server()
        defer { server.shutdown() }
        let folder = TemporaryDirectory()
        let (path, url) = (folder.url.path, server.url("/me").absoluteString)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, url = url as String] in
                let text = try await CookieIsolationTests.readMe(try #require(URL(string: url)), as: "alice", folder: path)
                #expect(text == "hello alice")
                kill(getpid(), SIGKILL)
            }
        }
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = path as String, url = url as String] in
                let text = try await CookieIsolationTests.readMe(try #require(URL(string: url)), as: "bob", folder: path)
                #expect(text == "hello bob")
            }
        }
        #expect(server.requestLog.filter { $0.path == "/me" }.map { $0.header("cookie") } == ["session=alice", "session=bob"])
        #endif
    }

    /// `/me` read by a process whose transport keeps cookies and holds `session=user`, over the
    /// cache in `folder` under the device's one partition; the body's text once its write is done.
    static func readMe(_ me: URL, as user: String, folder: String) async throws -> String {
        let configuration = URLSessionConfiguration.ephemeral
        let jar = HTTPCookieStorage.sharedCookieStorage(forGroupContainerIdentifier: "resilience-tests-\(UUID().uuidString)")
        jar.setCookie(try sessionCookie(user))
        configuration.httpCookieStorage = jar
        let reads = CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: URLSessionTransport(configuration: configuration, usesCookies: true)),
            cache: try DiskResponseCache(directory: URL(fileURLWithPath: folder), maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            configuration: .init(partition: "device")
        )
        let answer = try await reads.response(for: Read(url: me), mode: .online, staleTime: .http)
        await reads.cache.waitForWrites()
        return text(answer)
    }

    @Test func withCookiesOptedInAndAPartitionVaryIsMatchedOnTheCookieAsSent() async throws {
        let server = try Self.server()
        defer { server.shutdown() }
        let configuration = URLSessionConfiguration.ephemeral
        let jar = try Self.jar(signedIn: "alice")
        configuration.httpCookieStorage = jar
        let folder = TemporaryDirectory()
        // One partition for the device: the app did not clear the cache when the user changed.
        let reads = try Self.cached(URLSessionTransport(configuration: configuration, usesCookies: true), folder: folder, partition: "device")
        let alice = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        let aliceAgain = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        #expect(Self.text(alice) == "hello alice" && Self.text(aliceAgain) == "hello alice" && aliceAgain.source == .cache)
        try Self.signIn("bob", in: jar)
        let bob = try await reads.response(for: Read(url: server.url("/me")), mode: .online, staleTime: .http)
        #expect(Self.text(bob) == "hello bob" && bob.source == .network)
        #expect(server.requestLog.map { $0.header("cookie") } == ["session=alice", "session=bob"])
    }
}
