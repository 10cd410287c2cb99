import Foundation
import Resilience
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension Demo {
    /// A feed read online and stored; shown offline from the cache; a read made offline waits and
    /// goes on at reconnect, revalidated with a 304 that transfers no body; then the server goes
    /// away and the stored feed is served stale; and a second cache on the folder, as after a
    /// restart, still has it.
    static func offlineReads(_ server: LoopbackHTTPServer) async throws -> Outcome {
        let body = "[" + (1...50).map { "{\"post\":\($0)}" }.joined(separator: ",") + "]"
        server.route(
            "/feed",
            handler: { request in
                request.header("if-none-match") == "\"feed-v1\""
                    ? .status(304, headers: ["ETag": "\"feed-v1\""])
                    : .status(200, headers: ["ETag": "\"feed-v1\"", "Content-Type": "application/json"], body: body)
            })
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-demo-cache-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }
        let feedURL = server.url("/feed")
        let monitor = ManualReachabilityMonitor(isConnected: true)
        var steps: [Bool] = []
        do {
            let cache = try DiskResponseCache(directory: folder, maxBytes: 10 << 20)
            let reads = CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: cache, reachabilityMonitor: monitor)

            let first = try await reads.response(for: DemoRequest(url: feedURL), mode: .online, staleTime: .seconds(60))
            print("    online: GET /feed → \(first.source), \(first.data.count) bytes, stored")
            steps.append(first.source == .network)

            await monitor.setConnected(false)
            let offline = try await reads.response(for: DemoRequest(url: feedURL), mode: .offlineFirst, staleTime: .seconds(60))
            print("    offline: the screen shows the stored feed → \(offline.source), stale: \(offline.isStale), server asked \(server.hits("/feed"))×")
            steps.append(offline.source == .cache && server.hits("/feed") == 1)

            let paused = Task { try await reads.response(for: DemoRequest(url: feedURL), mode: .online, staleTime: .zero) }
            while await monitor.subscriberCount == 0 { await Task.yield() }
            print("    offline: a read that needs the network waits (no request, no retry spent)")
            steps.append(server.hits("/feed") == 1)
            await monitor.setConnected(true)
            let resumed = try await paused.value
            let conditional = server.requestLog.last?.header("if-none-match") ?? "none"
            print("    reconnect: it goes on, If-None-Match: \(conditional) → 304, body served from the cache (\(resumed.source), stale: \(resumed.isStale))")
            steps.append(resumed.source == .cache && !resumed.isStale && server.hits("/feed") == 2 && conditional == "\"feed-v1\"")

            server.route("/feed", .reset)
            let failing = try await reads.response(for: DemoRequest(url: feedURL), mode: .online, staleTime: .zero)
            print("    server resets every connection: the stored feed is served marked stale (\(failing.source), stale: \(failing.isStale))")
            steps.append(failing.source == .cache && failing.isStale)
            await cache.waitForWrites()
        }
        // "Restart": a new cache on the same folder, with nothing listening.
        let reopened = try DiskResponseCache(directory: folder, maxBytes: 10 << 20)
        let afterRestart = CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: reopened, reachabilityMonitor: ManualReachabilityMonitor(isConnected: false))
        let restored = try await afterRestart.response(for: DemoRequest(url: feedURL), mode: .offlineFirst, staleTime: .seconds(60))
        print("    restart, still offline: \(reopened.count) stored response(s), the feed → \(restored.source), \(restored.data.count) bytes")
        steps.append(restored.source == .cache && restored.data == Data(body.utf8))
        let passed = steps.allSatisfy { $0 }
        return Outcome(
            passed: passed,
            detail: passed
                ? "shown offline, paused read resumed with a 304, served stale when the server failed, kept across a restart"
                : "steps: \(steps)")
    }
}
