import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// How a read treats the network and the cache (TanStack Query's `networkMode`, over HTTP caching).
public enum NetworkMode: Sendable, Hashable {
    /// A stored response younger than `staleTime` is served without the network; otherwise the
    /// network is asked (revalidating what is stored). While the monitor says offline the request
    /// **waits** — paused, not failing, spending no retries — until connectivity returns or the
    /// caller cancels. A connectivity failure or a failing server with a stored response serves it,
    /// marked stale (stale-if-error).
    case online
    /// Any stored response is returned at once, marked stale or not; a stale one is revalidated in
    /// the background — at once when online, otherwise once connectivity returns — updating the
    /// cache for the next read. With nothing stored it behaves as `.online`.
    case offlineFirst
    /// Straight to the network whatever the monitor says (revalidating what is stored, and storing
    /// what comes back); failures are thrown.
    case always
}

/// A response from `CachedRequestEngine`: its body and head, where they came from, and whether
/// they are older than the freshness asked for.
public struct CachedResponse: Sendable {
    /// Where the body came from.
    public enum Source: Sendable, Hashable {
        /// Received from the server just now.
        case network
        /// Read from the cache (after a 304 revalidation too, which is then not stale).
        case cache
    }

    public let data: Data
    public let response: HTTPURLResponse
    public let source: Source
    /// Whether the response is older than its freshness lifetime (the stricter of the server's
    /// `max-age`/`Expires` and the caller's `staleTime`). Always false for `.network`.
    public let isStale: Bool

    public init(data: Data, response: HTTPURLResponse, source: Source, isStale: Bool) {
        self.data = data
        self.response = response
        self.source = source
        self.isStale = isStale
    }
}
