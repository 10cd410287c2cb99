import Foundation
import OfflineReads
import Resilience
import ResilienceTesting

/// The offline-reads snippets against the loopback server: a stored feed shown offline, a 304
/// revalidation, and the pending indicator.
@MainActor func runOfflineReadsChecks(_ server: LoopbackHTTPServer, scratch: URL) async {
    server.route("/offline-reads/feed", handler: { request in
        request.headers["if-none-match"] == "\"feed-1\""
            ? .status(304, headers: ["ETag": "\"feed-1\""])
            : .status(200, headers: ["ETag": "\"feed-1\""], body: "[\"post 1\"]")
    })
    let monitor = ManualReachabilityMonitor(isConnected: true)
    do {
        let reads = try OfflineReads.makeReads(cacheFolder: scratch.appendingPathComponent("responses"), monitor: monitor)
        let firstVisit = try await OfflineReads.show(server.url("/offline-reads/feed"), with: reads)
        check("offline reads: the first visit comes from the network",
              firstVisit.map(\.source) == [.network] && firstVisit.first?.body == "[\"post 1\"]", "\(firstVisit.map(\.source))")
        await monitor.setConnected(false)
        let offline = try await reads.response(for: FeedRequest(url: server.url("/offline-reads/feed")), mode: .offlineFirst, staleTime: .seconds(60))
        check("offline reads: offline, the stored feed is shown", offline.source == .cache && !offline.isStale && server.hits("/offline-reads/feed") == 1,
              "\(offline.source), \(server.hits("/offline-reads/feed")) request(s)")
        let paused = Task { try await reads.response(for: FeedRequest(url: server.url("/offline-reads/feed")), mode: .online, staleTime: .zero) }
        while await monitor.subscriberCount == 0 { await Task.yield() }
        let sentWhileOffline = server.hits("/offline-reads/feed")
        await monitor.setConnected(true)
        let resumed = try await paused.value
        check("offline reads: a paused read resumes on reconnect and a 304 revalidates it",
              sentWhileOffline == 1 && resumed.source == .cache && !resumed.isStale && server.hits("/offline-reads/feed") == 2
                  && server.requestLog.last?.headers["if-none-match"] == "\"feed-1\"",
              "\(sentWhileOffline) then \(server.hits("/offline-reads/feed")) request(s), \(resumed.source)")
    } catch {
        check("offline reads", false, "\(error)")
    }

    // The pending indicator.
    do {
        let offlineMonitor = ManualReachabilityMonitor(isConnected: false)
        let queue = OfflineQueueEngine(
            reachabilityMonitor: offlineMonitor,
            store: try DiskQueueStore(directory: scratch.appendingPathComponent("queue"))
        )
        var lines = OfflineReads.statusLines(for: queue).makeAsyncIterator()
        for index in 0..<3 { _ = try await queue.enqueue(QueuedRequest(method: .post, url: server.url("/items/\(index)")), sending: .onNextDrain) }
        var line = ""
        while line != "offline · 3 pending", let next = await lines.next() { line = next }
        check("pending indicator reads \"offline · 3 pending\"", line == "offline · 3 pending", line)
    } catch {
        check("pending indicator", false, "\(error)")
    }
}
