import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// How a read treats the network and the cache (TanStack Query's `networkMode`, over HTTP caching).
public enum NetworkMode: Sendable, Hashable {
    /// A fresh stored response (see `StaleTime`) is served without the network; otherwise the
    /// network is asked (revalidating what is stored; within a `stale-while-revalidate` window the
    /// stale response is served and revalidated in the background). While the monitor says offline
    /// the request **waits** — paused, not failing, spending no retries — until connectivity
    /// returns or the caller cancels. A connectivity failure or a failing server with a stored
    /// response serves it, marked stale (stale-if-error), unless the server said `no-cache` or
    /// `must-revalidate` or its `stale-if-error` window has passed.
    case online
    /// Any stored response is returned at once, marked stale or not; a stale one is revalidated in
    /// the background — at once when online, otherwise once connectivity returns — updating the
    /// cache for the next read. A response that said `no-cache` or `must-revalidate` is never
    /// shown stale; with it, or with nothing stored, it behaves as `.online`.
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
        /// Answered by the cache: read from the store (after a 304 revalidation too, which is then
        /// not stale), or the `504` it makes for `only-if-cached` with nothing usable stored.
        case cache
    }

    public let data: Data
    public let response: HTTPURLResponse
    public let source: Source
    /// Whether the response was served although not fresh for this read (older than its
    /// freshness lifetime under the read's `StaleTime`, or than the request's own `max-age`):
    /// offline, on a failure, within `stale-while-revalidate` or `max-stale`. Always false for
    /// `.network`.
    public let isStale: Bool
    /// The note the layer above keeps with a stored response (`CachedRequestEngine.annotateStored`);
    /// empty for a response from the network.
    package let note: Data

    public init(data: Data, response: HTTPURLResponse, source: Source, isStale: Bool) {
        self.init(data: data, response: response, source: source, isStale: isStale, note: Data())
    }

    package init(data: Data, response: HTTPURLResponse, source: Source, isStale: Bool, note: Data) {
        self.data = data
        self.response = response
        self.source = source
        self.isStale = isStale
        self.note = note
    }
}

/// What a `CachedRequestEngine` tells the layer above about its exchanges with the origin, and
/// asks it: OfflineFirst keeps out of the store a response that may hold a write whose fate is
/// not settled (`CachedRequestEngine.observeExchanges(with:)`).
package protocol ExchangeObserver: Sendable {
    /// An exchange for `url` is about to send its request: returns its token once it may (the
    /// layer above may make it wait for a write of the read to be sent first), or nil when the
    /// calling task is cancelled meanwhile (then nothing is sent). `storedNote` is the note of the
    /// response stored for the request when the exchange began (empty when none).
    func exchangeBegins(url: URL, storedNote: Data) async -> UInt64?
    /// Whether the response the exchange `token` brought may be stored.
    func mayStore(_ token: UInt64) -> Bool
    /// The exchange `token` is over (stored or not, answered or failed).
    func exchangeEnded(_ token: UInt64)
}
