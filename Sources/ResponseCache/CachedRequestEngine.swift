import Foundation
import Reachability
import RequestEngine
import Retry
import ResilienceCore
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Reads that keep working offline: GET and HEAD answered from a `DiskResponseCache` when fresh,
/// revalidated with `ETag`/`Last-Modified` when stale, paused while offline instead of failing,
/// and served stale when the network or the server fails.
///
/// ```swift
/// let reads = CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: cache, reachabilityMonitor: monitor)
/// for try await feed in reads.responses(for: FeedRequest(), mode: .offlineFirst, staleTime: .seconds(60)) {
///     show(feed.data, stale: feed.isStale)        // the stored feed at once, then the network's
/// }
/// ```
///
/// It is itself a `RequestSending` (with `defaultMode` and `defaultStaleTime`), so it composes:
/// put `AuthenticatedRequestEngine` around it (with a `partition` for the user) to cache
/// authenticated reads, or give it to the offline queue. Other methods pass straight through, and
/// a successful one invalidates what is stored for its URL (RFC 9111 §4.4).
///
/// Rules (Docs/ResponseCache.md has the tables): only GET and HEAD responses with status 200 or 203
/// are stored; `Cache-Control: no-store` on the request or the response is never stored, and a
/// request's `no-cache` skips the stored response; `Vary` is honoured (`Vary: *` is never stored);
/// `Set-Cookie` is never stored; a request carrying `Authorization` or `Cookie` is stored and served
/// only when the engine has a `partition`, and every key then includes the partition's digest,
/// never a token. `must-revalidate` responses are never served stale. Concurrent reads of one key
/// share one network request.
public final class CachedRequestEngine: RequestSending {
    /// Sends what the cache cannot answer.
    public let requestEngine: any RequestSending
    public let cache: DiskResponseCache
    public let reachabilityMonitor: any ReachabilityMonitoring
    /// Separates users: responses to requests with credentials are stored only with one.
    public let partition: String?
    /// What `send(_:)` and `response(for:)` (the `RequestSending` requirements) use.
    public let defaultMode: NetworkMode
    public let defaultStaleTime: Duration

    private let partitionDigest: CacheDigest?
    private let time: TimeSource
    private let wallClockOrigin: Date
    private let fetches = SharedFetches()
    /// Keys shown stale offline whose revalidation waits for connectivity.
    private let revalidationsAwaitingConnectivity = Locked<Set<CacheDigest>>([])

    /// - Parameters:
    ///   - requestEngine: sends requests the cache does not answer (any `RequestSending`).
    ///   - cache: where responses are stored.
    ///   - reachabilityMonitor: says when to pause (`.online`) and when to revalidate (`.offlineFirst`).
    ///   - partition: a stable identifier of the signed-in user (never a token); required for
    ///     caching requests that carry `Authorization` or `Cookie`. Clear the cache at log-out.
    ///   - defaultMode, defaultStaleTime: for `send(_:)` and `response(for:)` (default `.online`,
    ///     zero: always revalidate, serve stale only when the network fails).
    ///   - clock: the clock ages are measured on (a `ManualClock` in tests).
    public init(
        requestEngine: some RequestSending = AsyncRequestEngine(),
        cache: DiskResponseCache,
        reachabilityMonitor: any ReachabilityMonitoring,
        partition: String? = nil,
        defaultMode: NetworkMode = .online,
        defaultStaleTime: Duration = .zero,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.requestEngine = requestEngine
        self.cache = cache
        self.reachabilityMonitor = reachabilityMonitor
        self.partition = partition
        self.partitionDigest = partition.map { CacheDigest("partition\n" + $0) }
        self.defaultMode = defaultMode
        self.defaultStaleTime = defaultStaleTime
        self.time = TimeSource(clock)
        self.wallClockOrigin = Date()
    }

    /// The wall-clock time as the engine sees it (the moment it was made plus the time elapsed on
    /// its clock, so a `ManualClock` ages stored responses in tests).
    public var now: Date { wallClockOrigin.addingTimeInterval(time.now().seconds) }

    // MARK: - Reads

    /// One response for `request`, following `mode` (see `NetworkMode`).
    ///
    /// - Throws: `NetworkError` when no response can be had (`.cancelled` when the caller is
    ///   cancelled, also while paused offline); what the underlying engine throws otherwise.
    public func response(for request: some NetworkRequest, mode: NetworkMode, staleTime: Duration) async throws -> CachedResponse {
        let plan = Plan(request, engine: self)
        guard plan.isCacheable else { return try await uncached(plan, mode: mode) }
        let cached = lookup(plan)
        let now = self.now
        switch mode {
        case .always:
            return try await fetch(plan, cached: cached, staleIfError: false)
        case .online:
            if let cached, !plan.skipsStored, isFresh(cached, staleTime: staleTime, now: now) {
                return try answer(cached, plan: plan, isStale: false)
            }
            try await waitUntilOnline()
            return try await fetch(plan, cached: cached, staleIfError: true, staleTime: staleTime)
        case .offlineFirst:
            if let cached, !plan.skipsStored {
                let fresh = isFresh(cached, staleTime: staleTime, now: now)
                if fresh || mayServeStale(cached) {
                    if !fresh {
                        if await reachabilityMonitor.isConnected {
                            revalidateInBackground(plan, cached: cached)
                        } else {
                            revalidateWhenOnline(plan, cached: cached)
                        }
                    }
                    return try answer(cached, plan: plan, isStale: !fresh)
                }
            }
            try await waitUntilOnline()
            return try await fetch(plan, cached: cached, staleIfError: true, staleTime: staleTime)
        }
    }

    /// The stored response at once (fresh or stale), then the network's answer when it comes —
    /// what keeps a screen useful offline. With a fresh stored response (and a mode other than
    /// `.always`) the stream ends after it; otherwise the network part follows `mode` (it waits
    /// while offline unless `.always`). A network failure after a stored response was yielded ends
    /// the stream with the error; the screen keeps what it has.
    public func responses(for request: some NetworkRequest, mode: NetworkMode, staleTime: Duration) -> AsyncThrowingStream<CachedResponse, any Error> {
        let plan = Plan(request, engine: self)
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    guard plan.isCacheable else {
                        continuation.yield(try await self.uncached(plan, mode: mode))
                        continuation.finish()
                        return
                    }
                    let cached = self.lookup(plan)
                    var yielded = false
                    if let cached, !plan.skipsStored {
                        let fresh = self.isFresh(cached, staleTime: staleTime, now: self.now)
                        if fresh || self.mayServeStale(cached) {
                            continuation.yield(try self.answer(cached, plan: plan, isStale: !fresh))
                            yielded = true
                            if fresh, mode != .always {
                                continuation.finish()
                                return
                            }
                        }
                    }
                    if mode != .always { try await self.waitUntilOnline() }
                    continuation.yield(try await self.fetch(plan, cached: cached, staleIfError: !yielded, staleTime: staleTime))
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: Task.isCancelled ? NetworkError.cancelled : error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Deletes stored responses whose method and URL match (URLs as stored: without query values);
    /// returns how many.
    @discardableResult
    public func invalidate(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Int {
        cache.invalidate(where: predicate)
    }

    /// Waits until every background revalidation started so far has finished (for tests).
    public func waitForBackgroundRevalidations() async {
        await fetches.waitUntilIdle()
    }

    // MARK: - RequestSending


    /// `response(for:mode:staleTime:)` with `defaultMode` and `defaultStaleTime`, whatever the status.
    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let answer = try await response(for: request, mode: defaultMode, staleTime: defaultStaleTime)
        return (answer.data, answer.response)
    }

    // MARK: - Internals

    /// A request's properties read once, and what the cache makes of them.
    struct Plan: Sendable {
        let url: URL
        let method: HTTPMethod
        let headers: [String: String]
        let body: Data?
        let timeout: TimeInterval
        let maximumResponseBodySize: Int?
        let deadline: Duration?
        /// The cache key (method, URL, partition); nil when the request may not use the cache.
        let key: CacheDigest?
        /// The identity of a network fetch: the key and every request header (requests that
        /// differ in a header the response may vary on never share a fetch).
        let fetchKey: CacheDigest
        /// Request `Cache-Control: no-cache`: the stored response is not served without revalidation.
        let skipsStored: Bool
        /// Request `Cache-Control: no-store`: nothing is stored.
        let storesNothing: Bool

        var isCacheable: Bool { key != nil }

        init(_ request: some NetworkRequest, engine: CachedRequestEngine) {
            url = request.url
            method = request.method
            headers = request.headers
            body = request.body
            timeout = request.timeout
            maximumResponseBodySize = request.maximumResponseBodySize
            deadline = request.deadline
            let control = HTTPCachePolicy.cacheControl(headers)
            skipsStored = control.noCache
            storesNothing = control.noStore
            let readable = (method == .get || method == .head) && body == nil
            let allowed = !HTTPCachePolicy.carriesCredential(headers) || engine.partitionDigest != nil
            let keyText = method.rawValue + "\n" + url.absoluteString + "\n" + (engine.partitionDigest?.hex ?? "")
            key = readable && allowed ? CacheDigest(keyText) : nil
            let headerText = headers.map { $0.key.lowercased() + ":" + $0.value }.sorted().joined(separator: "\n")
            fetchKey = CacheDigest(keyText + "\n" + headerText)
        }
    }

    /// The request sent to the network: the caller's, plus validators when revalidating.
    private struct Outgoing: NetworkRequest {
        let url: URL
        let method: HTTPMethod
        let headers: [String: String]
        let body: Data?
        let timeout: TimeInterval
        let maximumResponseBodySize: Int?
        let deadline: Duration?

        init(_ plan: Plan, adding extra: [String: String] = [:]) {
            url = plan.url
            method = plan.method
            var merged = plan.headers
            for (name, value) in extra where !merged.keys.contains(where: { $0.caseInsensitiveCompare(name) == .orderedSame }) {
                merged[name] = value
            }
            headers = merged
            body = plan.body
            timeout = plan.timeout
            maximumResponseBodySize = plan.maximumResponseBodySize
            deadline = plan.deadline
        }
    }

    /// A request the cache cannot hold: other methods pass through (and invalidate the URL's
    /// stored reads on success); an uncacheable read still follows `mode`'s pause.
    private func uncached(_ plan: Plan, mode: NetworkMode) async throws -> CachedResponse {
        let readable = plan.method == .get || plan.method == .head
        if readable, mode != .always { try await waitUntilOnline() }
        let (data, response) = try await requestEngine.response(for: Outgoing(plan))
        if !plan.method.isSafe, (200...399).contains(response.statusCode) { invalidateReads(of: plan.url) }
        return CachedResponse(data: data, response: response, source: .network, isStale: false)
    }

    private func invalidateReads(of url: URL) {
        let suffix = "\n" + url.absoluteString + "\n" + (partitionDigest?.hex ?? "")
        cache.remove([CacheDigest("GET" + suffix), CacheDigest("HEAD" + suffix)])
    }

    /// The stored response for `plan`, if its `Vary` fields match the request's.
    private func lookup(_ plan: Plan) -> StoredResponse? {
        guard let key = plan.key, let stored = cache.response(for: key) else { return nil }
        guard stored.varyDigest == HTTPCachePolicy.varyDigest(names: stored.varyNames, requestHeaders: plan.headers) else { return nil }
        return stored
    }

    private func isFresh(_ stored: StoredResponse, staleTime: Duration, now: Date) -> Bool {
        let lifetime = HTTPCachePolicy.freshnessLifetime(headers: stored.headers, staleTime: staleTime)
        return HTTPCachePolicy.age(of: stored, initialAge: .zero, now: now) < lifetime
    }

    /// A stale response may be shown unless the server said `must-revalidate`.
    private func mayServeStale(_ stored: StoredResponse) -> Bool {
        !HTTPCachePolicy.cacheControl(stored.headers).mustRevalidate
    }

    /// A stored response as the caller sees it (its head rebuilt for the request's own URL).
    private func answer(_ stored: StoredResponse, plan: Plan, isStale: Bool) throws -> CachedResponse {
        guard let response = HTTPURLResponse(url: plan.url, statusCode: stored.statusCode, httpVersion: "HTTP/1.1", headerFields: stored.headers) else {
            throw NetworkError.invalidResponse
        }
        return CachedResponse(data: stored.body, response: response, source: .cache, isStale: isStale)
    }

    /// Waits while the monitor says offline; throws `.cancelled` if the caller is cancelled meanwhile.
    private func waitUntilOnline() async throws {
        if await reachabilityMonitor.isConnected { return }
        for await connected in await reachabilityMonitor.connectivity where connected { return }
        if Task.isCancelled { throw NetworkError.cancelled }
        throw NetworkError.noConnection  // the monitor stopped while offline
    }

    /// Asks the network (one request per `fetchKey` at a time, shared by every concurrent reader),
    /// revalidating `cached` if given, stores what may be stored, and answers.
    /// `staleTime` nil (mode `.always`): never answered from the store, not even fresh.
    private func fetch(_ plan: Plan, cached: StoredResponse?, staleIfError: Bool, staleTime: Duration? = nil) async throws -> CachedResponse {
        let outcome = await fetches.run(plan.fetchKey) { [self] in
            // A reader that found the store stale (or empty) while another exchange for this key
            // ran, and reaches here after it ended, starts an exchange of its own: the store may
            // hold a fresh answer by now, and that needs no second request.
            if let staleTime, !plan.skipsStored, let current = self.lookup(plan), self.isFresh(current, staleTime: staleTime, now: self.now) {
                return .foundFresh(current)
            }
            return await self.networkExchange(plan, cached: cached)
        }
        switch outcome {
        case .revalidated(let stored), .foundFresh(let stored):
            return try answer(stored, plan: plan, isStale: false)
        case .stored(let data, let response):
            return CachedResponse(data: data, response: response, source: .network, isStale: false)
        case .passed(let data, let response):
            let status = response.statusCode
            if staleIfError, let cached, mayServeStale(cached), [500, 502, 503, 504].contains(status) {
                return try answer(cached, plan: plan, isStale: true)
            }
            return CachedResponse(data: data, response: response, source: .network, isStale: false)
        case .failed(let error):
            if Task.isCancelled { throw NetworkError.cancelled }
            if staleIfError, let cached, mayServeStale(cached), Self.isConnectivityFailure(error) {
                return try answer(cached, plan: plan, isStale: true)
            }
            throw error
        }
    }

    /// What one network exchange produced, shared by every reader that joined it.
    enum Exchange: Sendable {
        /// A 304 confirmed the stored response (now refreshed with the 304's headers).
        case revalidated(StoredResponse)
        /// The store held a fresh response when the exchange began (another exchange had just
        /// refreshed it): nothing was sent.
        case foundFresh(StoredResponse)
        /// A response received and now stored (as received: every header, `Set-Cookie` included).
        case stored(Data, HTTPURLResponse)
        /// A response that was not stored (not storable, or an error status).
        case passed(Data, HTTPURLResponse)
        case failed(any Error)
    }

    private func networkExchange(_ plan: Plan, cached: StoredResponse?) async -> Exchange {
        let validators = cached.map(HTTPCachePolicy.conditionalHeaders(for:)) ?? [:]
        let data: Data
        let response: HTTPURLResponse
        do {
            (data, response) = try await requestEngine.response(for: Outgoing(plan, adding: validators))
        } catch {
            return .failed(error)
        }
        let received = now
        let headers = Self.headers(of: response)
        if response.statusCode == 304, let cached {
            let refreshed = HTTPCachePolicy.refreshed(cached, with: headers, now: received)
            cache.store(refreshed)
            return .revalidated(refreshed)
        }
        guard let key = plan.key, !plan.storesNothing, HTTPCachePolicy.storableStatuses.contains(response.statusCode),
              !HTTPCachePolicy.cacheControl(headers).noStore,
              let varyNames = HTTPCachePolicy.varyNames(headers)
        else { return .passed(data, response) }
        let initialAge = HTTPCachePolicy.value("Age", in: headers).flatMap(CacheControl.deltaSeconds) ?? 0
        let stored = StoredResponse(
            key: key,
            method: plan.method.rawValue,
            url: HTTPCachePolicy.storedURL(plan.url),
            partition: partitionDigest,
            storedAt: received.addingTimeInterval(-Double(initialAge)),
            statusCode: response.statusCode,
            headers: HTTPCachePolicy.storableHeaders(headers),
            varyNames: varyNames,
            varyDigest: HTTPCachePolicy.varyDigest(names: varyNames, requestHeaders: plan.headers),
            body: plan.method == .head ? Data() : data
        )
        cache.store(stored)
        return .stored(data, response)
    }

    private func revalidateInBackground(_ plan: Plan, cached: StoredResponse) {
        fetches.startInBackground(plan.fetchKey) { [self] in
            await self.networkExchange(plan, cached: cached)
        }
    }

    /// A stale response was shown offline: revalidate it once connectivity returns (one wait per
    /// key however often it is shown meanwhile). The wait holds the monitor, not the engine; an
    /// engine gone by then revalidates nothing, and a monitor that stops ends the wait.
    private func revalidateWhenOnline(_ plan: Plan, cached: StoredResponse) {
        guard revalidationsAwaitingConnectivity.withLock({ $0.insert(plan.fetchKey).inserted }) else { return }
        let monitor = reachabilityMonitor
        Task { [weak self] in
            var online = await monitor.isConnected
            if !online {
                for await connected in await monitor.connectivity where connected {
                    online = true
                    break
                }
            }
            guard let self else { return }
            self.revalidationsAwaitingConnectivity.withLock { _ = $0.remove(plan.fetchKey) }
            // What was stored meanwhile (another read online, a revalidation) may be fresh by now.
            guard online, let current = self.lookup(plan), current.storedAt <= cached.storedAt else { return }
            self.revalidateInBackground(plan, cached: current)
        }
    }

    private static func isConnectivityFailure(_ error: any Error) -> Bool {
        switch NetworkError(mapping: error) {
        case .noConnection, .timedOut: return true
        case .transport(let failure): return failure != .secureConnectionFailed
        default: return false
        }
    }

    private static func headers(of response: HTTPURLResponse) -> [String: String] {
        var headers: [String: String] = [:]
        for (name, value) in response.allHeaderFields {
            guard let name = name as? String else { continue }
            headers[name] = "\(value)"
        }
        return headers
    }
}

extension HTTPMethod {
    /// GET, HEAD and OPTIONS do not change the server's state (RFC 9110 §9.2.1).
    fileprivate var isSafe: Bool { self == .get || self == .head || self == .options }
}
