import Foundation
import Testing
import Reachability
import RequestEngine
import ResilienceTesting
@testable import ResponseCache
import ResilienceTestSupport
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Real parts: URLSession, LoopbackHTTPServer on 127.0.0.1, real files, a second process, SIGKILL.
@Suite("ResponseCache through URLSession, a real server, a restart and SIGKILL", .timeLimit(.minutes(3)))
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
        server.route("/feed", handler: { request in
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
                #expect(!stamp.isEmpty && body == String(repeating: String(stamp), count: body.utf8.count / max(1, stamp.utf8.count)),
                        "round \(round): item \(item) served a torn body of \(body.utf8.count) bytes")
            }
            #expect(cache.totalBytes <= 4 << 20)
        }
        #expect(served > 0, "the children never got a response onto the disk")
        print("cache SIGKILL test: \(served) whole responses served over 20 kills, none torn")
        #endif
    }

    static func stored(item: Int, body: String) -> StoredResponse {
        let url = "https://example.test/items/\(item)"
        return StoredResponse(
            key: CacheDigest("GET\n" + url + "\n"),
            method: "GET", url: url, partition: nil, storedAt: Date(timeIntervalSinceReferenceDate: 800_000_000), statusCode: 200,
            headers: ["Content-Type": "text/plain"], varyNames: [], varyDigest: nil, body: Data(body.utf8)
        )
    }
}
