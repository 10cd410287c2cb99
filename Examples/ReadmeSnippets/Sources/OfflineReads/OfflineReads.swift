import Foundation
import OfflineQueue
import RequestEngine
import ResponseCache
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

// The README's "ResponseCache" and "pending indicator" snippets, on the products ResponseCache,
// OfflineQueue and RequestEngine only.

public struct FeedRequest: NetworkRequest {
    public let url: URL
    public let method: HTTPMethod = .get
    public init(url: URL) { self.url = url }
}

public enum OfflineReads {
    /// README: a reads engine over a cache folder.
    public static func makeReads(cacheFolder: URL, monitor: any ReachabilityMonitoring) throws -> CachedRequestEngine {
        let cache = try DiskResponseCache(directory: cacheFolder, maxBytes: 50 << 20)
        return CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: cache, reachabilityMonitor: monitor)
    }

    /// README: what a screen shows — the stored feed at once, then the network's answer.
    public static func show(_ feedURL: URL, with reads: CachedRequestEngine) async throws -> [(body: String, source: CachedResponse.Source, stale: Bool)] {
        var shown: [(body: String, source: CachedResponse.Source, stale: Bool)] = []
        for try await feed in reads.responses(for: FeedRequest(url: feedURL), mode: .offlineFirst, staleTime: .seconds(60)) {
            shown.append((String(decoding: feed.data, as: UTF8.self), feed.source, feed.isStale))
        }
        return shown
    }

    /// README: "offline · 3 pending", updated as connectivity and the queue change.
    public static func statusLines(for queue: OfflineQueueEngine) -> AsyncStream<String> {
        AsyncStream { continuation in
            let task = Task {
                enum Change: Sendable { case online(Bool), pending(Int) }
                let (changes, input) = AsyncStream<Change>.makeStream()
                await withTaskGroup(of: Void.self) { group in
                    group.addTask { for await online in await queue.reachabilityMonitor.connectivity { input.yield(.online(online)) } }
                    group.addTask { for await count in queue.pendingCounts { input.yield(.pending(count)) } }
                    var online = true
                    var pending = 0
                    for await change in changes {
                        switch change {
                        case .online(let value): online = value
                        case .pending(let value): pending = value
                        }
                        let parts = (online ? [] : ["offline"]) + (pending > 0 ? ["\(pending) pending"] : [])
                        continuation.yield(parts.joined(separator: " · "))
                    }
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
