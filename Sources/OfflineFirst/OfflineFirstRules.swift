import Foundation
import OfflineQueue
import ResponseCache

/// How a pending write changes what a read shows: which queue entries it applies to, which reads
/// (by URL) it changes, and the body to show — a pure function of the read's current body (`nil`
/// while nothing is cached or fetched yet) and the pending entry.
///
/// ```swift
/// // A note saved offline appears at the end of GET /notes until the server has it.
/// OptimisticUpdate(
///     mutations: { $0.method == "POST" && $0.url.path == "/notes" },
///     reads: { $0.path == "/notes" },
///     apply: { notes, pending in try appendNote(pending.body, to: notes) }
/// )
/// ```
///
/// Overlays are computed from the queue's entries every time a read is shown, never stored: a
/// relaunch, offline, in a new process, shows the same screen. An `apply` that throws skips that
/// overlay; the snapshot reports it (`QuerySnapshot.overlayFailures`), and nothing else fails. A
/// delivered write that an update applies to also makes its reads stale (they are refetched), as
/// an `Invalidation` would.
public struct OptimisticUpdate: Sendable {
    /// Whether the update applies to a queue entry (method, URL, headers, body…).
    public let mutations: @Sendable (QueueEntry) -> Bool
    /// Whether it changes the read of a URL. Live and one-shot reads ask it with the read's own
    /// URL; marking stored reads stale after a delivery, and recording the write with them for a
    /// relaunch, ask it with the URL as stored, which keeps query parameter names but not their
    /// values.
    public let reads: @Sendable (URL) -> Bool
    /// The body to show: the read's current body with the pending entry applied.
    public let apply: @Sendable (_ current: Data?, _ pending: QueueEntry) throws -> Data?

    public init(
        mutations: @escaping @Sendable (QueueEntry) -> Bool,
        reads: @escaping @Sendable (URL) -> Bool,
        apply: @escaping @Sendable (_ current: Data?, _ pending: QueueEntry) throws -> Data?
    ) {
        self.mutations = mutations
        self.reads = reads
        self.apply = apply
    }
}

/// Which reads a delivered write makes stale: when an entry the rule applies to is delivered
/// (2xx), the stored responses of the reads it names are marked stale, and live reads of them
/// refetch (when online).
public struct Invalidation: Sendable {
    /// Whether the rule applies to a queue entry.
    public let mutations: @Sendable (QueueEntry) -> Bool
    /// Whether it makes the read of a URL stale. Stored responses are matched by their URL as
    /// stored, which keeps query parameter names but not their values.
    public let reads: @Sendable (URL) -> Bool
    /// The reads as patterns, for a rule made with `init(mutations:readsMatching:)`: a delivery
    /// then marks them from the cache's index of stored paths (`markStale(matching:)`), running no
    /// code per stored URL — the way to keep a delivery's invalidation cheap in a large cache.
    public let readPatterns: [CacheURLPattern]?

    public init(mutations: @escaping @Sendable (QueueEntry) -> Bool, reads: @escaping @Sendable (URL) -> Bool) {
        self.mutations = mutations
        self.reads = reads
        self.readPatterns = nil
    }

    /// A rule whose reads are the stored responses `patterns` match (any method, as
    /// `CachedRequestEngine.markStale(matching:)` marks them). An `OfflineFirstClient` given such
    /// a rule has the cache build its tables of stored paths ahead, in the background
    /// (`DiskResponseCache.prepareMarkingByPattern()`: a few hundred bytes per distinct stored
    /// URL), so that the first delivery after a launch finds them built.
    ///
    /// ```swift
    /// Invalidation(mutations: { $0.url.path.hasPrefix("/notes") }, readsMatching: [.pathPrefix("/notes"), .path("/me/counts")])
    /// ```
    public init(mutations: @escaping @Sendable (QueueEntry) -> Bool, readsMatching patterns: [CacheURLPattern]) {
        self.mutations = mutations
        self.reads = { url in patterns.contains { $0.matches(url) } }
        self.readPatterns = patterns
    }
}
