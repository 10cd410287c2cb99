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

/// Real parts: URLSession, LoopbackHTTPServer on 127.0.0.1, real files, a second process, SIGKILL.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("ResponseCache through URLSession, a real server, a restart and SIGKILL", .timeLimit(.minutes(5)))
struct CacheIntegrationTests {
    /// An engine over a URLSession of its own, on the cache in `folder`.
    static func engine(_ folder: URL, connected: Bool = true) throws -> CachedRequestEngine {
        CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: .ephemeral)),
            cache: try DiskResponseCache(directory: folder, maxBytes: 1 << 20),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: connected)
        )
    }

    struct Feed: NetworkRequest {
        let url: URL
        var method: HTTPMethod { .get }
        var timeout: TimeInterval = 10
    }

    @Test func aStaleFeedIsRevalidatedByTheServerWithA304AndItsBodyIsNotSentAgain() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/feed",
            handler: { request in
                request.header("if-none-match") == "\"v1\""
                    ? .status(304, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=0"])
                    : .status(200, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=0"], body: "the feed")
            })
        let folder = TemporaryDirectory()
        let engine = try Self.engine(folder.url)
        let first = try await engine.response(for: Feed(url: server.url("/feed")), mode: .online, staleTime: .zero)
        #expect(first.source == .network && String(decoding: first.data, as: UTF8.self) == "the feed")
        let second = try await engine.response(for: Feed(url: server.url("/feed")), mode: .online, staleTime: .zero)
        #expect(second.source == .cache && !second.isStale && String(decoding: second.data, as: UTF8.self) == "the feed")
        #expect(server.requestLog.map { $0.header("if-none-match") } == [nil, "\"v1\""])
    }

    /// An engine over a URLSession that caches nothing itself, with a monitor the test drives.
    static func engine(_ folder: URL, monitor: ManualReachabilityMonitor) throws -> CachedRequestEngine {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        return CachedRequestEngine(
            requestEngine: AsyncRequestEngine(session: URLSession(configuration: configuration)),
            cache: try DiskResponseCache(directory: folder, maxBytes: 1 << 20),
            reachabilityMonitor: monitor
        )
    }

    struct Read: NetworkRequest {
        let url: URL
        var method: HTTPMethod = .get
        var headers: [String: String] = [:]
        var timeout: TimeInterval = 10
    }

    /// RFC 9111 §4.3.4, the poisoning case over a real socket: the caller's own `If-None-Match:
    /// "X"` gets the server's 304, and the stored `"Y"` response is neither answered with nor
    /// relabelled: the next read revalidates it with `"Y"`.
    @Test func aCallersNotModifiedForAnotherTagNeverRelabelsTheStoredResponse_Section4_3_4() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/doc",
            handler: { request in
                switch request.header("if-none-match") {
                case "\"X\"": .status(304, headers: ["ETag": "\"X\"", "Cache-Control": "max-age=600"])
                case "\"Y\"": .status(304, headers: ["ETag": "\"Y\"", "Cache-Control": "max-age=0"])
                default: .status(200, headers: ["ETag": "\"Y\"", "Cache-Control": "max-age=0"], body: "body Y")
                }
            })
        let folder = TemporaryDirectory()
        let engine = try Self.engine(folder.url, monitor: ManualReachabilityMonitor(isConnected: true))
        let url = server.url("/doc")
        _ = try await engine.response(for: Read(url: url), mode: .online, staleTime: .http)
        let callers = try await engine.response(for: Read(url: url, headers: ["If-None-Match": "\"X\""]), mode: .online, staleTime: .http)
        #expect(callers.source == .network && callers.response.statusCode == 304)
        let plain = try await engine.response(for: Read(url: url), mode: .online, staleTime: .http)
        #expect(plain.source == .cache && String(decoding: plain.data, as: UTF8.self) == "body Y")
        #expect(plain.response.value(forHTTPHeaderField: "ETag") == "\"Y\"")
        #expect(server.requestLog.map { $0.header("if-none-match") } == [nil, "\"X\"", "\"Y\""])
    }

    /// RFC 9111 §4.2.4: a `no-cache` response is not served stale when its origin is gone.
    @Test func aNoCacheResponseIsNotServedWhenItsOriginIsDown_Section4_2_4() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/doc", .status(200, headers: ["ETag": "\"v1\"", "Cache-Control": "no-cache"], body: "v1"))
        let folder = TemporaryDirectory()
        let engine = try Self.engine(folder.url, monitor: ManualReachabilityMonitor(isConnected: true))
        let url = server.url("/doc")
        _ = try await engine.response(for: Read(url: url), mode: .online, staleTime: .seconds(3600))
        server.shutdown()
        for mode in [NetworkMode.online, .offlineFirst] {
            await #expect(throws: NetworkError.self, "\(mode)") {
                try await engine.response(for: Read(url: url, timeout: 5), mode: mode, staleTime: .seconds(3600))
            }
        }
    }

    /// RFC 9111 §5.2.1.7 offline: `only-if-cached` answers from the store or with a 504, at once,
    /// and never reaches the server.
    @Test func onlyIfCachedOfflineAnswersFromTheStoreOrWithA504_Section5_2_1_7() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/stored", .status(200, headers: ["Cache-Control": "max-age=600"], body: "kept"))
        let folder = TemporaryDirectory()
        let monitor = ManualReachabilityMonitor(isConnected: true)
        let engine = try Self.engine(folder.url, monitor: monitor)
        _ = try await engine.response(for: Read(url: server.url("/stored")), mode: .online, staleTime: .http)
        await monitor.setConnected(false)
        let onlyIfCached = ["Cache-Control": "only-if-cached"]
        let stored = try await engine.response(for: Read(url: server.url("/stored"), headers: onlyIfCached), mode: .online, staleTime: .http)
        #expect(stored.source == .cache && String(decoding: stored.data, as: UTF8.self) == "kept")
        let missing = try await engine.response(for: Read(url: server.url("/missing"), headers: onlyIfCached), mode: .online, staleTime: .http)
        #expect(missing.response.statusCode == 504 && missing.data.isEmpty)
        #expect(server.totalHits == 1)
    }

    /// RFC 9111 §4.3.5 over a real socket: a `200` to `HEAD` with the stored `ETag` and the
    /// stored body's `Content-Length` freshens the stored GET response, whose body is then served
    /// without asking again.
    @Test func aHEADResponseFreshensTheStoredGET_Section4_3_5() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/doc",
            handler: { request in
                request.method == "HEAD"
                    ? .status(200, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=600", "X-Version": "2"], body: "the body")
                    : .status(200, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=0", "X-Version": "1"], body: "the body")
            })
        let folder = TemporaryDirectory()
        let engine = try Self.engine(folder.url, monitor: ManualReachabilityMonitor(isConnected: true))
        let url = server.url("/doc")
        _ = try await engine.response(for: Read(url: url), mode: .online, staleTime: .http)
        let head = try await engine.response(for: Read(url: url, method: .head), mode: .online, staleTime: .http)
        #expect(head.source == .network && head.data.isEmpty)
        await engine.cache.waitForWrites()
        let get = try await engine.response(for: Read(url: url), mode: .online, staleTime: .http)
        #expect(get.source == .cache && String(decoding: get.data, as: UTF8.self) == "the body")
        #expect(get.response.value(forHTTPHeaderField: "X-Version") == "2")
        #expect(server.requestLog.map(\.method) == ["GET", "HEAD"])
    }

    /// The feed is stored by this process; the server stops; a second process opens the same
    /// folder and shows the feed — from the store, marked stale, since the network fails.
    @Test func aSecondProcessServesTheCachedFeedWithTheServerStopped() async throws {
        let folder = TemporaryDirectory()
        let server = try LoopbackHTTPServer()
        server.route("/feed", .status(200, headers: ["ETag": "\"v1\""], body: "[\"post 1\",\"post 2\"]"))
        let url = server.url("/feed")
        do {
            let engine = try Self.engine(folder.url)
            let fetched = try await engine.response(for: Feed(url: url), mode: .online, staleTime: .seconds(60))
            #expect(fetched.source == .network)
            await engine.cache.waitForWrites()
        }  // this process's cache (and its folder lock) is gone
        server.shutdown()
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = folder.url.path as String, url = url.absoluteString as String] in
                let engine = try CacheIntegrationTests.engine(URL(fileURLWithPath: path))
                let feed = Feed(url: try #require(URL(string: url)), timeout: 5)
                // Online, stale time zero: the network is tried, fails (refused), the stored feed is served.
                let online = try await engine.response(for: feed, mode: .online, staleTime: .zero)
                #expect(online.source == .cache && online.isStale)
                #expect(String(decoding: online.data, as: UTF8.self) == "[\"post 1\",\"post 2\"]")
                // Offline first: at once, without the network.
                let shown = try await engine.response(for: feed, mode: .offlineFirst, staleTime: .seconds(60))
                #expect(shown.source == .cache && String(decoding: shown.data, as: UTF8.self) == "[\"post 1\",\"post 2\"]")
            }
        }
    }

    /// A child stores responses in a loop (twenty keys, bodies of up to 256 KiB made of one repeated
    /// stamp) and is killed at a random moment; twenty times on one folder. After each kill every
    /// response the reopened cache serves is whole: its body is its own stamp repeated, for its own
    /// key, and nothing torn is ever served.
    @Test func responsesStoredWhenTheProcessIsKilledAreWholeOrAbsentNeverTorn() async throws {
        #if os(Linux) || os(macOS)
        let folder = TemporaryDirectory()
        let path = folder.url.path
        var served = 0
        for round in 0..<20 {
            let delayMicroseconds = UInt32.random(in: 20_000...150_000)
            try await ExitTests.oneAtATime {
                await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, delayMicroseconds = delayMicroseconds as UInt32, round = round as Int] in
                    let killer = Thread {
                        usleep(delayMicroseconds)
                        kill(getpid(), SIGKILL)
                    }
                    killer.start()
                    let cache = try DiskResponseCache(directory: URL(fileURLWithPath: path), maxBytes: 4 << 20, memoryBytes: 0)
                    var generator = SystemRandomNumberGenerator()
                    var version = 0
                    while true {
                        let item = Int.random(in: 0..<20, using: &generator)
                        let stamp = "item \(item) round \(round) version \(version);"
                        let repeats = Int.random(in: 1...(256 * 1024 / stamp.utf8.count), using: &generator)
                        cache.store(CacheIntegrationTests.stored(item: item, body: String(repeating: stamp, count: repeats)))
                        version += 1
                        if version % 8 == 0 { await cache.waitForWrites() }
                    }
                }
            }
            let cache = try DiskResponseCache(directory: folder.url, maxBytes: 4 << 20, memoryBytes: 0)
            for item in 0..<20 {
                guard let response = cache.response(for: Self.stored(item: item, body: "").key) else { continue }
                served += 1
                let body = String(decoding: response.body, as: UTF8.self)
                let stamp = body.split(separator: ";", omittingEmptySubsequences: false).first.map { $0 + ";" } ?? ""
                #expect(stamp.hasPrefix("item \(item) round "), "round \(round): item \(item) served another's body")
                #expect(
                    !stamp.isEmpty && body == String(repeating: String(stamp), count: body.utf8.count / max(1, stamp.utf8.count)),
                    "round \(round): item \(item) served a torn body of \(body.utf8.count) bytes")
            }
            #expect(cache.totalBytes <= 4 << 20)
        }
        #expect(served > 0, "the children never got a response onto the disk")
        print("cache SIGKILL test: \(served) whole responses served over 20 kills, none torn")
        #endif
    }

    /// Issue 48, item 3, with real parts: a server sends legal responses the cache file cannot
    /// hold (a `Vary` list of 1 001 names, 10 001 header fields), a child process reads them
    /// through URLSession and is killed; the next process opens the folder and finds nothing
    /// corrupt — they were returned, never stored — and a normal response beside them survived.
    @Test func responsesBeyondTheFileFormatAreNeverStoredSoARelaunchFindsNothingCorrupt() async throws {
        #if os(Linux) || os(macOS)
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        let vary = (0...1_000).map { "X-Vary-\($0)" }.joined(separator: ", ")
        server.route("/vary", LoopbackResponse(status: 200, headers: ["Cache-Control": "max-age=600", "Vary": vary], body: Data("vary".utf8)))
        var many = ["Cache-Control": "max-age=600"]
        for number in 0...10_000 { many["X-Field-\(number)"] = "v" }
        server.route("/many", LoopbackResponse(status: 200, headers: many, body: Data("many".utf8)))
        server.route("/plain", LoopbackResponse(status: 200, headers: ["Cache-Control": "max-age=600"], body: Data("plain".utf8)))
        let folder = TemporaryDirectory()
        let (path, base) = (folder.url.path, server.url("/").absoluteString)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, base = base as String] in
                let engine = try CacheIntegrationTests.engine(URL(fileURLWithPath: path))
                for name in ["vary", "many", "plain"] {
                    let answer = try await engine.response(for: Feed(url: try #require(URL(string: base + name))), mode: .online, staleTime: .http)
                    #expect(String(decoding: answer.data, as: UTF8.self) == name)  // the caller gets it either way
                }
                await engine.cache.waitForWrites()
                #expect(engine.cache.statistics.beyondFormatLimits == 2 && engine.cache.count == 1)
                kill(getpid(), SIGKILL)
            }
        }
        let reopened = try DiskResponseCache(directory: folder.url, maxBytes: 1 << 20)
        #expect(reopened.statistics.corruptRemoved == 0 && reopened.count == 1)
        #endif
    }

    /// Issue 49: a marking stale rewrites no response file, so its durability is the marks
    /// file's. A child process stores 20 reads through URLSession from a real server, has one
    /// marked stale by a delivered PUT (§4.4) and one by `markStale(where:)`, and is killed with
    /// SIGKILL at once; the next process, offline, shows exactly those two stale.
    @Test func marksStaleSurviveASIGKILLedProcessWithoutAResponseFileRewritten() async throws {
        #if os(Linux) || os(macOS)
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route(
            "/items/*",
            handler: { request in
                request.method == "PUT" ? .status(204) : .status(200, headers: ["Cache-Control": "max-age=3600"], body: request.path)
            })
        let folder = TemporaryDirectory()
        let (path, base) = (folder.url.path, server.url("/items/").absoluteString)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String, base = base as String] in
                let engine = try CacheIntegrationTests.engine(URL(fileURLWithPath: path))
                for item in 0..<20 {
                    _ = try await engine.response(for: Feed(url: try #require(URL(string: base + "\(item)"))), mode: .online, staleTime: .http)
                }
                await engine.cache.waitForWrites()
                let stored = engine.cache.statistics.stored
                struct Put: NetworkRequest {
                    let url: URL
                    var method: HTTPMethod { .put }
                }
                _ = try await engine.response(for: Put(url: try #require(URL(string: base + "3"))))
                #expect(engine.markStale { _, url in url.path == "/items/7" } == 1)
                await engine.cache.waitForWrites()
                #expect(engine.cache.statistics.stored == stored)  // no response file written again
                kill(getpid(), SIGKILL)
            }
        }
        let engine = try Self.engine(folder.url, connected: false)
        var stale: [Int] = []
        for item in 0..<20 {
            let answer = try await engine.response(for: Feed(url: server.url("/items/\(item)")), mode: .offlineFirst, staleTime: .http)
            if answer.isStale { stale.append(item) }
        }
        #expect(stale == [3, 7])
        #endif
    }

    static func stored(item: Int, body: String) -> StoredResponse {
        let url = "https://example.test/items/\(item)"
        return StoredResponse(
            key: CacheDigest("GET\n" + url + "\n"), primaryKey: CacheDigest("GET\n" + url + "\n"),
            method: "GET", url: url, partition: nil, storedAt: Date(timeIntervalSinceReferenceDate: 800_000_000), initialAge: 0, statusCode: 200,
            headers: ["Content-Type": "text/plain"], varyNames: [], varyDigest: nil, body: Data(body.utf8)
        )
    }
}
