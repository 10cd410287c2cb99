import Foundation
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Reads that keep working offline, over an HTTP cache that follows RFC 9111 as a browser's does:
/// GET and HEAD answered from a `DiskResponseCache` while fresh, revalidated with
/// `ETag`/`Last-Modified` when stale, paused while offline instead of failing, and served stale
/// when the network or the server fails (unless the server forbade it).
///
/// ```swift
/// let reads = CachedRequestEngine(requestEngine: AsyncRequestEngine(), cache: cache, reachabilityMonitor: monitor)
/// for try await feed in reads.responses(for: FeedRequest(), mode: .offlineFirst, staleTime: .seconds(60)) {
///     show(feed.data, stale: feed.isStale)        // the stored feed at once, then the network's
/// }
/// ```
///
/// It is itself a `RequestSending` (with `configuration.defaultMode` and `configuration.defaultStaleTime`, which follow HTTP by
/// default), so it composes: put `AuthenticatedRequestEngine` around it (with a `partition` for
/// the user) to cache authenticated reads, or give it to the offline queue. Other methods pass
/// straight through, and a successful one marks what is stored for its URL (and for the
/// same-origin `Location` and `Content-Location` it names) stale (RFC 9111 §4.4).
///
/// Rules (Sources/ResponseCache/ResponseCache.docc/ResponseCacheGuide.md has the tables and each RFC requirement with its test): which
/// responses are stored (§3), how long they are fresh (`StaleTime`, §4.2), how old they are
/// (`Age` and `Date`, §4.2.3; every response served from the store carries its `Age`), the
/// request's own `Cache-Control` (`no-cache`, `max-age`, `max-stale`, `min-fresh`, `no-store`,
/// `only-if-cached`), `Vary` with up to eight variants per URL, a `304` applied only to the
/// stored responses its validators select (§4.3.4), `HEAD` freshening a stored `GET` (§4.3.5),
/// `stale-while-revalidate` and `stale-if-error` (RFC 5861). A request the caller made
/// conditional or partial itself (`If-None-Match`, `Range`…) passes through untouched. `Set-Cookie`
/// is never stored; a request carrying `Authorization` or `Cookie` is stored and served only when
/// the engine has a `partition`, and every key then includes the partition's digest, never a
/// token. Concurrent reads of one key share one network request.
public final class CachedRequestEngine: RequestSending {
    /// Sends what the cache cannot answer.
    public let requestEngine: any RequestSending
    public let cache: DiskResponseCache
    public let reachabilityMonitor: any ReachabilityMonitoring
    /// The user's partition and what `send(_:)` and `response(for:)` use.
    public let configuration: Configuration

    /// What a cached engine is set to, beside what it is made of.
    public struct Configuration: Sendable {
        /// A stable identifier of the signed-in user (never a token), which separates users:
        /// requests that carry `Authorization` or `Cookie` are cached only with one, and every
        /// key then includes its digest. Clear the cache at log-out. Default `nil`.
        public var partition: String?
        /// The network mode of `send(_:)` and `response(for:)`, the `RequestSending`
        /// requirements. Default `.online`: served stale only when the network fails.
        public var defaultMode: NetworkMode
        /// Their freshness. Default `.http`: fresh as long as HTTP says, revalidated after.
        public var defaultStaleTime: StaleTime

        public init(partition: String? = nil, defaultMode: NetworkMode = .online, defaultStaleTime: StaleTime = .http) {
            self.partition = partition
            self.defaultMode = defaultMode
            self.defaultStaleTime = defaultStaleTime
        }
    }

    private let partitionDigest: CacheDigest?
    private let time: TimeSource
    private let wallClockOrigin: Date
    private let fetches = SharedFetches()
    /// Told of each exchange with the origin and asked before what it brings is stored
    /// (`observeExchanges(with:)`); nil: everything storable is stored.
    private let exchangeObserver = Locked<(any ExchangeObserver)?>(nil)
    /// Keys shown stale offline whose revalidation waits for connectivity.
    private let revalidationsAwaitingConnectivity = Locked<Set<CacheDigest>>([])

    /// - Parameters:
    ///   - requestEngine: sends requests the cache does not answer (any `RequestSending`).
    ///   - cache: where responses are stored.
    ///   - reachabilityMonitor: says when to pause (`.online`) and when to revalidate (`.offlineFirst`).
    ///   - configuration: the user's partition (required for caching requests that carry
    ///     `Authorization` or `Cookie`), and the mode and freshness `send(_:)` uses.
    ///   - clock: the clock ages are measured on (a `ManualClock` in tests).
    public init(
        requestEngine: some RequestSending = AsyncRequestEngine(),
        cache: DiskResponseCache,
        reachabilityMonitor: any ReachabilityMonitoring,
        configuration: Configuration = Configuration(),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.requestEngine = requestEngine
        self.cache = cache
        self.reachabilityMonitor = reachabilityMonitor
        self.configuration = configuration
        self.partitionDigest = configuration.partition.map { CacheDigest("partition\n" + $0) }
        self.time = TimeSource(clock)
        self.wallClockOrigin = SimulationPoints.date()  // Date() but under a simulation
    }

    /// The wall-clock time as the engine sees it (the moment it was made plus the time elapsed on
    /// its clock, so a `ManualClock` ages stored responses in tests).
    public var now: Date { wallClockOrigin.addingTimeInterval(time.now().seconds) }

    // MARK: - Reads

    /// One response for `request`, following `mode` (see `NetworkMode`) and the request's own
    /// `Cache-Control`. With `only-if-cached` and nothing usable stored, the answer is a `504`
    /// made by the cache (RFC 9111 §5.2.1.7), at once, without the network.
    ///
    /// - Throws: `NetworkError` when no response can be had (`.cancelled` when the caller is
    ///   cancelled, also while paused offline); what the underlying engine throws otherwise.
    public func response(for request: some NetworkRequest, mode: NetworkMode, staleTime: StaleTime) async throws -> CachedResponse {
        let plan = Plan(request, partition: partitionDigest, added: requestEngine.credentialHeaders(for: request.url))
        guard plan.isCacheable else { return try await uncached(plan, mode: mode) }
        let cached = lookup(plan)
        let reuse = cached.map { HTTPCachePolicy.reuse($0, request: plan.directives, staleTime: staleTime, now: now) }
        switch Self.decide(cached: reuse, mode: mode, request: plan.directives) {
        case .serve(let isStale, let revalidates):
            guard let cached else { throw NetworkError.invalidResponse }  // decide serves only what it was given
            if revalidates { await revalidate(plan, cached: cached) }
            return try answer(cached, plan: plan, isStale: isStale, validated: false)
        case .gatewayTimeout:
            return try gatewayTimeout(plan)
        case .network(let waits):
            if waits { try await waitUntilOnline() }
            // With nothing stored when the read began, another read may have stored something by
            // the time this exchange fails: that is served, if its own directives let it be.
            let staleIfError = mode != .always && (reuse?.mayServeOnError ?? true)
            return try await fetch(plan, cached: cached, staleIfError: staleIfError, staleTime: mode == .always ? nil : staleTime)
        }
    }

    /// The stored response at once (fresh or stale), then the network's answer when it comes —
    /// what keeps a screen useful offline. With a stored response usable without validation (and
    /// a mode other than `.always`) the stream ends after it; otherwise the network part follows
    /// `mode` (it waits while offline unless `.always`). A network failure after a stored response
    /// was yielded ends the stream with the error; the screen keeps what it has. With
    /// `only-if-cached` the network is never asked: the stored response, or a `504`.
    public func responses(for request: some NetworkRequest, mode: NetworkMode, staleTime: StaleTime) -> AsyncThrowingStream<CachedResponse, any Error> {
        let plan = Plan(request, partition: partitionDigest, added: requestEngine.credentialHeaders(for: request.url))
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    guard plan.isCacheable else {
                        continuation.yield(try await self.uncached(plan, mode: mode))
                        continuation.finish()
                        return
                    }
                    let cached = self.lookup(plan)
                    let reuse = cached.map { HTTPCachePolicy.reuse($0, request: plan.directives, staleTime: staleTime, now: self.now) }
                    if plan.directives.onlyIfCached {  // never the network: as response(for:) answers
                        switch Self.decide(cached: reuse, mode: mode, request: plan.directives) {
                        case .serve(let isStale, _):
                            if let cached { continuation.yield(try self.answer(cached, plan: plan, isStale: isStale, validated: false)) }
                        case .gatewayTimeout, .network:
                            continuation.yield(try self.gatewayTimeout(plan))
                        }
                        continuation.finish()
                        return
                    }
                    if let cached, let reuse, reuse.isUsable || reuse.mayServeStale {
                        continuation.yield(try self.answer(cached, plan: plan, isStale: !(reuse.isUsable && reuse.isFresh), validated: false))
                        if reuse.isUsable, mode != .always {
                            continuation.finish()
                            return
                        }
                    }
                    if mode != .always { try await self.waitUntilOnline() }
                    // Nothing is served stale on a failure: what the store had was yielded already
                    // (the screen keeps it), or may not be shown at all.
                    continuation.yield(try await self.fetch(plan, cached: cached, staleIfError: false, staleTime: mode == .always ? nil : staleTime))
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: Task.isCancelled ? NetworkError.cancelled : error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// What the store holds for `request` now, as `response(for:mode:staleTime:)` would serve it
    /// without the network: fresh, or stale (`isStale`) when it may be shown stale; `nil` when
    /// nothing usable is stored or the request cannot use the cache. Never sends anything and
    /// starts no revalidation.
    public func storedResponse(for request: some NetworkRequest, staleTime: StaleTime) -> CachedResponse? {
        let plan = Plan(request, partition: partitionDigest, added: requestEngine.credentialHeaders(for: request.url))
        guard plan.isCacheable, let cached = lookup(plan) else { return nil }
        let reuse = HTTPCachePolicy.reuse(cached, request: plan.directives, staleTime: staleTime, now: now)
        guard reuse.isUsable || reuse.mayServeStale else { return nil }
        return try? answer(cached, plan: plan, isStale: !(reuse.isUsable && reuse.isFresh), validated: false)
    }

    /// The validators (`ETag`, `Last-Modified`) of the response stored for `request`, fresh or
    /// stale alike: the version a screen showed, which an edit of it is based on (OfflineFirst's
    /// `mutate(_:editing:)`). `nil` when nothing is stored or it has neither. Never sends anything.
    package func storedValidators(for request: some NetworkRequest) -> (etag: String?, lastModified: String?)? {
        let plan = Plan(request, partition: partitionDigest, added: requestEngine.credentialHeaders(for: request.url))
        guard plan.isCacheable, let stored = lookup(plan, counting: false) else { return nil }
        let etag = stored.header("ETag"), lastModified = stored.header("Last-Modified")
        return etag == nil && lastModified == nil ? nil : (etag, lastModified)
    }

    /// Deletes stored responses whose method and URL match (URLs as stored: without query values);
    /// returns how many.
    @discardableResult
    public func invalidate(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Int {
        cache.invalidate(where: predicate)
    }

    /// Marks stale what is stored for `request` (its URL's GET and HEAD responses, every variant,
    /// this engine's partition) — and makes sure that no exchange with the origin that began
    /// before this call answers a read made after it, nor is stored as fresh: what the server
    /// sends from now on is what such a read gets. For a read that must reflect a write the
    /// server has just taken.
    public func markStale(for request: some NetworkRequest) {
        let url = request.url
        cache.markStale([HTTPMethod.get, .head].map { Plan.primaryKey(method: $0, url: url, partition: partitionDigest) })
    }

    /// Marks stale (RFC 9111 §4.4 invalidation) the stored responses whose method and URL match
    /// (URLs as stored: without query values): kept, shown offline, revalidated before they are
    /// served online. Returns how many.
    @discardableResult
    public func markStale(where predicate: (_ method: HTTPMethod, _ url: URL) -> Bool) -> Int {
        cache.markStale(where: predicate)
    }

    /// `markStale(where:)` for rules the cache answers from its index of stored paths (a path, or
    /// everything under one), without running code once per stored URL: `CacheURLPattern`.
    @discardableResult
    public func markStale(matching patterns: [CacheURLPattern]) -> Int {
        cache.markStale(matching: patterns)
    }

    /// Waits until every background revalidation started so far has finished: before a test
    /// reads what the cache holds, or before an app lets the process be suspended.
    public func waitForBackgroundRevalidations() async {
        await fetches.waitUntilIdle()
    }

    // MARK: - RequestSending

    /// `response(for:mode:staleTime:)` with `configuration.defaultMode` and `configuration.defaultStaleTime`, whatever the status.
    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let answer = try await response(for: request, mode: configuration.defaultMode, staleTime: configuration.defaultStaleTime)
        return (answer.data, answer.response)
    }

    // MARK: - Deciding

    /// What a read does with what is stored.
    enum Decision: Equatable {
        /// Answer from the store; `revalidate`: refresh it in the background (now when online,
        /// else once connectivity returns).
        case serve(isStale: Bool, revalidate: Bool)
        /// `only-if-cached` with nothing usable: the cache's own `504`.
        case gatewayTimeout
        /// Ask the network (revalidating what is stored, if anything); `waits`: pause while offline.
        case network(waits: Bool)
    }

    /// The modes' tables (Sources/ResponseCache/ResponseCache.docc/ResponseCacheGuide.md) as one function of what the stored response is
    /// worth to this request.
    static func decide(cached reuse: HTTPCachePolicy.Reuse?, mode: NetworkMode, request: CacheControl) -> Decision {
        if let reuse, reuse.isUsable, mode != .always || request.onlyIfCached {
            // Usable although stale (max-stale): offline-first refreshes it as it does any stale one.
            return .serve(isStale: !reuse.isFresh, revalidate: mode == .offlineFirst && !reuse.isFresh && !request.onlyIfCached)
        }
        if request.onlyIfCached {
            if mode == .offlineFirst, let reuse, reuse.mayServeStale { return .serve(isStale: true, revalidate: false) }
            return .gatewayTimeout
        }
        switch mode {
        case .always:
            return .network(waits: false)
        case .online:
            if let reuse, reuse.withinStaleWhileRevalidate { return .serve(isStale: true, revalidate: true) }
            return .network(waits: true)
        case .offlineFirst:
            if let reuse, reuse.mayServeStale { return .serve(isStale: true, revalidate: true) }
            return .network(waits: true)
        }
    }

    /// What the engine it sends through adds (`RequestSending.credentialHeaders(for:)`).
    public func credentialHeaders(for url: URL) -> [String: String] {
        requestEngine.credentialHeaders(for: url)
    }

    // MARK: - For the layers above (package)

    /// Tells `observer` of every exchange with the origin from now on, and asks it before what an
    /// exchange brings is stored (replacing an observer installed before).
    package func observeExchanges(with observer: any ExchangeObserver) {
        exchangeObserver.withLock { $0 = observer }
    }

    /// Stops telling `observer` (if it is still the one installed).
    package func stopObservingExchanges(by observer: AnyObject) {
        exchangeObserver.withLock { current in
            if let installed = current as AnyObject?, installed === observer { current = nil }
        }
    }

    /// Changes the note of every stored GET response whose URL (as stored: without query values)
    /// matches `predicate`, in every partition and variant, and marks it stale (as
    /// `markStale(where:)` does, exchanges in flight included); returns once those files are
    /// written. A response whose file cannot be written with its new note (a full disk, a note
    /// past the file format's limits) is removed instead — the layer above relies on the note
    /// being there after a relaunch whenever the response is — and counted in the result.
    @discardableResult
    package func annotateStored(where predicate: (_ url: URL) -> Bool, _ change: (Data) -> Data) async -> Int {
        await cache.annotate(where: { method, url in method == .get && predicate(url) }, change)
    }

    // MARK: - Internals

    /// A request's properties read once, and what the cache makes of them.
    struct Plan: Sendable {
        /// The caller's request, read once; what goes to the network is this, with validators
        /// added when revalidating.
        let request: PreparedRequest
        /// The request's `Cache-Control` (or `Pragma: no-cache`).
        let directives: CacheControl
        /// Whether the cache may answer and store this request: a GET or HEAD without a body,
        /// not made conditional or partial by the caller, not `no-store` (§5.2.1.5: nothing of
        /// it is stored, and it is not answered from the store either) nor `cacheable == false`
        /// (the same, said by the caller), and without credentials unless the engine has a partition.
        let isCacheable: Bool
        /// The primary keys (method, URL, partition) under which its answers are stored: the
        /// request's own method's first (where a response to it is stored); a HEAD also reads
        /// what a GET stored.
        let keys: [CacheDigest]
        /// The identity of a network fetch: the key and every request header as sent (requests
        /// that differ in a header the response may vary on never share a fetch).
        let fetchKey: CacheDigest
        /// The request's headers as they are sent: its own, and the credentials the sender adds
        /// on its own (a transport's `Cookie`); what `Vary` is matched on and credentials are
        /// looked for in. Never sent from here (the sender adds them itself), never stored.
        let sentHeaders: [String: String]

        var primaryKey: CacheDigest { keys[0] }

        /// - Parameter added: the credential headers the sender adds (`RequestSending.credentialHeaders(for:)`);
        ///   a field the request sets itself is sent as the request says.
        init(_ request: some NetworkRequest, partition: CacheDigest?, added: [String: String] = [:]) {
            let request = PreparedRequest(request)
            self.request = request
            let (url, method, body) = (request.url, request.method, request.body)
            var headers = request.headers
            for (name, value) in added where HTTPCachePolicy.value(name, in: headers) == nil { headers[name] = value }
            sentHeaders = headers
            directives = HTTPCachePolicy.requestDirectives(headers)
            let readable = (method == .get || method == .head) && body == nil
            let allowed = !HTTPCachePolicy.carriesCredential(headers) || partition != nil
            isCacheable =
                readable && allowed && request.cacheable != false && !directives.noStore
                && !HTTPCachePolicy.isConditionalOrPartial(headers)
            let ownKey = Self.primaryKey(method: method, url: url, partition: partition)
            keys = method == .head ? [ownKey, Self.primaryKey(method: .get, url: url, partition: partition)] : [ownKey]
            let headerText = headers.map { $0.key.lowercased() + ":" + $0.value }.sorted().joined(separator: "\n")
            fetchKey = CacheDigest(ownKey.hex + "\n" + headerText)
        }

        /// The digest every variant of `method` `url` in `partition` is stored under.
        static func primaryKey(method: HTTPMethod, url: URL, partition: CacheDigest?) -> CacheDigest {
            CacheDigest(method.rawValue + "\n" + url.absoluteString + "\n" + (partition?.hex ?? ""))
        }
    }

    /// A request the cache cannot hold: other methods pass through (and on success mark the
    /// stored reads of their URL stale, §4.4); an uncacheable read still follows `mode`'s pause,
    /// and with `only-if-cached` is answered `504`.
    private func uncached(_ plan: Plan, mode: NetworkMode) async throws -> CachedResponse {
        let readable = plan.request.method == .get || plan.request.method == .head
        if readable, plan.directives.onlyIfCached { return try gatewayTimeout(plan) }
        if readable, mode != .always { try await waitUntilOnline() }
        let (data, response) = try await requestEngine.response(for: plan.request)
        if !plan.request.method.isSafe, (200...399).contains(response.statusCode) {
            invalidateReads(after: plan, response: Self.headers(of: response))
        }
        return CachedResponse(data: data, response: response, source: .network, isStale: false)
    }

    /// RFC 9111 §4.4: after a successful unsafe request, its URL's stored GET and HEAD responses
    /// (every variant, this engine's partition) are marked stale, and so are those of the URLs in
    /// `Location` and `Content-Location` when they share the request's origin. Marked, not
    /// deleted: a screen offline still shows them, and the next read online revalidates them.
    private func invalidateReads(after plan: Plan, response headers: [String: String]) {
        var urls = [plan.request.url]
        for name in ["Location", "Content-Location"] {
            guard let value = HTTPCachePolicy.value(name, in: headers), let target = URL(string: value, relativeTo: plan.request.url)?.absoluteURL,
                Self.sameOrigin(target, plan.request.url)
            else { continue }
            urls.append(target)
        }
        cache.markStale(
            urls.flatMap { url in
                [HTTPMethod.get, .head].map { Plan.primaryKey(method: $0, url: url, partition: partitionDigest) }
            })
    }

    /// RFC 6454 origins: scheme, host and port, a default port counting as written or not.
    private static func sameOrigin(_ a: URL, _ b: URL) -> Bool {
        func port(_ url: URL) -> Int? { url.port ?? ["http": 80, "https": 443][url.scheme?.lowercased() ?? ""] }
        return a.scheme?.lowercased() == b.scheme?.lowercased() && a.host?.lowercased() == b.host?.lowercased() && port(a) == port(b)
    }

    /// The stored response that answers `plan`: the most recent variant whose `Vary` fields match.
    private func lookup(_ plan: Plan, counting: Bool = true) -> StoredResponse? {
        HTTPCachePolicy.select(from: cache.variants(for: plan.keys, counting: counting), requestHeaders: plan.sentHeaders)
    }

    /// A stored response as the caller sees it: its head rebuilt for the request's own URL, with
    /// its current `Age` (RFC 9111 §4), without the fields a qualified `no-cache` names unless it
    /// was just validated, and without a body for HEAD.
    private func answer(_ stored: StoredResponse, plan: Plan, isStale: Bool, validated: Bool, extraHeaders: [String: String] = [:]) throws -> CachedResponse {
        var headers = stored.headers
        if !validated, let control = HTTPCachePolicy.value("Cache-Control", in: headers), control.lowercased().contains("no-cache") {
            let withheld = CacheControl(control).noCacheFields
            if !withheld.isEmpty { headers = headers.filter { !withheld.contains($0.key.lowercased()) } }
        }
        headers["Age"] = String(Int(HTTPCachePolicy.currentAge(of: stored, now: now).seconds))
        headers.merge(extraHeaders) { _, extra in extra }
        guard let response = HTTPURLResponse(url: plan.request.url, statusCode: stored.statusCode, httpVersion: "HTTP/1.1", headerFields: headers) else {
            throw NetworkError.invalidResponse
        }
        return CachedResponse(data: plan.request.method == .head ? Data() : stored.body, response: response, source: .cache, isStale: isStale, note: stored.note)
    }

    /// The cache's answer to `only-if-cached` with nothing usable stored (RFC 9111 §5.2.1.7).
    private func gatewayTimeout(_ plan: Plan) throws -> CachedResponse {
        let headers = ["Date": HTTPDate.format(now), "Content-Length": "0"]
        guard let response = HTTPURLResponse(url: plan.request.url, statusCode: 504, httpVersion: "HTTP/1.1", headerFields: headers) else {
            throw NetworkError.invalidResponse
        }
        return CachedResponse(data: Data(), response: response, source: .cache, isStale: false)
    }

    /// Waits while the monitor says offline; throws `.cancelled` if the caller is cancelled meanwhile.
    private func waitUntilOnline() async throws {
        if await reachabilityMonitor.isConnected { return }
        for await connected in await reachabilityMonitor.connectivity where connected { return }
        if Task.isCancelled { throw NetworkError.cancelled }
        throw NetworkError.noConnection  // the monitor stopped while offline
    }

    /// Asks the network (one request per `fetchKey` at a time, shared by every concurrent reader),
    /// revalidating `cached` if given, stores what may be stored, and answers. `staleIfError`:
    /// a connectivity failure or a 500/502/503/504 serves what is stored now (or `cached`), stale
    /// (`servableOnError`).
    /// `staleTime` nil (mode `.always`): never answered from the store, not even fresh.
    private func fetch(_ plan: Plan, cached: StoredResponse?, staleIfError: Bool, staleTime: StaleTime?) async throws -> CachedResponse {
        // A read made after the URL was marked stale never joins an exchange begun before.
        let epoch = cache.staleEpoch(of: plan.primaryKey)
        let outcome = await fetches.run(Self.flightKey(plan, epoch: epoch)) { [self] in
            // A reader that found the store stale (or empty) while another exchange for this key
            // ran, and reaches here after it ended, starts an exchange of its own: the store may
            // hold a usable answer by now, and that needs no second request.
            if let staleTime, let current = self.lookup(plan, counting: false),
                HTTPCachePolicy.reuse(current, request: plan.directives, staleTime: staleTime, now: self.now).isUsable
            {
                return .foundFresh(current)
            }
            return await self.networkExchange(plan, cached: cached, epoch: epoch)
        }
        switch outcome {
        case .revalidated(var stored, let cookies):
            // The note as it is now: a write delivered while the exchange ran is recorded there.
            if let current = lookup(plan, counting: false), current.key == stored.key { stored.note = current.note }
            return try answer(stored, plan: plan, isStale: false, validated: true, extraHeaders: cookies)
        case .foundFresh(let stored):
            return try answer(stored, plan: plan, isStale: false, validated: false)
        case .stored(let data, let response):
            return CachedResponse(data: data, response: response, source: .network, isStale: false)
        case .passed(let data, let response):
            if staleIfError, Self.serverFailures.contains(response.statusCode), let stale = servableOnError(plan, else: cached) {
                return try answer(stale, plan: plan, isStale: true, validated: false)
            }
            return CachedResponse(data: data, response: response, source: .network, isStale: false)
        case .failed(let error):
            if Task.isCancelled { throw NetworkError.cancelled }
            if staleIfError, Self.isConnectivityFailure(error), let stale = servableOnError(plan, else: cached) {
                return try answer(stale, plan: plan, isStale: true, validated: false)
            }
            throw error
        }
    }

    /// What to serve stale after an exchange failed: the response stored for `plan` now — it
    /// carries what changed while the exchange ran (a note, another read's revalidation) — when it
    /// may be served on an error; else `fallback`, what was stored when the read began (which the
    /// caller checked may be), if nothing is stored now.
    private func servableOnError(_ plan: Plan, else fallback: StoredResponse?) -> StoredResponse? {
        guard let current = lookup(plan, counting: false) else { return fallback }
        return HTTPCachePolicy.reuse(current, request: plan.directives, staleTime: .http, now: now).mayServeOnError ? current : nil
    }

    /// What one network exchange produced, shared by every reader that joined it.
    enum Exchange: Sendable {
        /// A 304 confirmed the stored response (now refreshed with the 304's headers); the 304's
        /// `Set-Cookie` fields, never stored, go to the caller with it.
        case revalidated(StoredResponse, cookies: [String: String])
        /// The store held a usable response when the exchange began (another exchange had just
        /// refreshed it): nothing was sent.
        case foundFresh(StoredResponse)
        /// A response received and now stored (as received: every header, `Set-Cookie` included).
        case stored(Data, HTTPURLResponse)
        /// A response that was not stored (not storable, or an error status).
        case passed(Data, HTTPURLResponse)
        case failed(any Error)
    }

    /// One exchange with the network for `plan`, conditional on `cached`'s validators when given.
    /// A `304` updates the stored responses its validators select (RFC 9111 §4.3.4); when that
    /// is not `cached`, the request is sent once more without validators. A `200` to `HEAD`
    /// freshens (or marks stale) the stored GET responses it describes (§4.3.5).
    private func networkExchange(_ plan: Plan, cached: StoredResponse?, epoch: UInt64) async -> Exchange {
        // Registered until it has stored what it brings: a `markStale(where:)` meanwhile reaches it.
        cache.exchangeBegan(plan.primaryKey, method: plan.request.method.rawValue, url: HTTPCachePolicy.storedURL(plan.request.url))
        defer { cache.exchangeEnded(plan.primaryKey) }
        let observer = exchangeObserver.withLock { $0 }
        var token: UInt64?
        if let observer {
            token = await observer.exchangeBegins(url: plan.request.url, storedNote: cached?.note ?? Data())
            if token == nil { return .failed(NetworkError.cancelled) }
        }
        defer { if let observer, let token { observer.exchangeEnded(token) } }
        let requestTime = now
        let data: Data
        let response: HTTPURLResponse
        do {
            var outgoing = plan.request.settingHeaders(cached.map(HTTPCachePolicy.validators(for:)) ?? [:])
            // Past a marking stale, a call for the same request begun before it (which the engine
            // would let this one share) may carry the state from before whatever made it stale.
            if epoch != 0 { outgoing.sharesCallsInFlight = false }
            (data, response) = try await requestEngine.response(for: outgoing)
        } catch {
            return .failed(error)
        }
        let responseTime = now
        let headers = Self.headers(of: response)
        if response.statusCode == 304, let cached {
            // The stored variants now, with the validated one as it was sent (another exchange
            // may have replaced it meanwhile: then it is answered, not stored again).
            let variants = cache.variants(for: [cached.primaryKey], counting: false).filter { $0.key != cached.key } + [cached]
            let selected = HTTPCachePolicy.selectedBy304(headers, among: variants, nominated: cached)
            // Marked stale while this exchange ran: the 304 may predate what made it stale.
            let overtaken = cache.staleEpoch(of: plan.primaryKey) != epoch
            // A 304 whose `Vary` names other fields than a stored response's changes which
            // requests that response answers, so its key: the request's own response is stored
            // again under the key the new names give this request; another variant, whose request
            // values are kept only as a digest, cannot be re-keyed and is dropped.
            let newVaryNames = HTTPCachePolicy.value("Vary", in: headers).map { _ in HTTPCachePolicy.varyNames(headers) }
            for stored in selected {
                if let newVaryNames, newVaryNames != stored.varyNames {
                    cache.remove([stored.key])
                    guard stored.key == cached.key, let names = newVaryNames else { continue }
                    var refreshed = HTTPCachePolicy.refreshed(stored, with: headers, requestTime: requestTime, responseTime: responseTime)
                    refreshed.varyNames = names
                    refreshed.varyDigest = HTTPCachePolicy.varyDigest(names: names, requestHeaders: plan.sentHeaders)
                    refreshed.key = StoredResponse.variantKey(primary: stored.primaryKey, varyNames: names, varyDigest: refreshed.varyDigest)
                    refreshed.isInvalidated = overtaken
                    cache.store(refreshed)
                    continue
                }
                cache.update(stored.key) { current in
                    var refreshed = HTTPCachePolicy.refreshed(current, with: headers, requestTime: requestTime, responseTime: responseTime)
                    refreshed.isInvalidated = overtaken
                    return refreshed
                }
            }
            if selected.contains(where: { $0.key == cached.key }) {
                let revalidated = HTTPCachePolicy.refreshed(cached, with: headers, requestTime: requestTime, responseTime: responseTime)
                return .revalidated(revalidated, cookies: headers.filter { $0.key.lowercased().hasPrefix("set-cookie") })
            }
            // The 304 is not about the response the validators came from: it must not be
            // applied to it, and the caller asked for the resource, not for a 304.
            return await networkExchange(plan, cached: nil, epoch: epoch)
        }
        if plan.request.method == .head, response.statusCode == 200 {
            freshenStoredGET(plan, headHeaders: headers, requestTime: requestTime, responseTime: responseTime)
        }
        // A server error never replaces what is stored for the request (it is passed on, and the
        // stored response may answer it stale): a cache may always decline to store (§3).
        if cached != nil, Self.serverFailures.contains(response.statusCode) { return .passed(data, response) }
        let control = HTTPCachePolicy.cacheControl(headers)
        guard !plan.directives.noStore, HTTPCachePolicy.mayStore(status: response.statusCode, headers: headers, control: control),
            let varyNames = HTTPCachePolicy.varyNames(headers)
        else { return .passed(data, response) }
        let varyDigest = HTTPCachePolicy.varyDigest(names: varyNames, requestHeaders: plan.sentHeaders)
        var stored = StoredResponse(
            key: StoredResponse.variantKey(primary: plan.primaryKey, varyNames: varyNames, varyDigest: varyDigest),
            primaryKey: plan.primaryKey,
            method: plan.request.method.rawValue,
            url: HTTPCachePolicy.storedURL(plan.request.url),
            partition: partitionDigest,
            storedAt: responseTime,
            initialAge: HTTPCachePolicy.correctedInitialAge(headers, requestTime: requestTime, responseTime: responseTime),
            statusCode: response.statusCode,
            headers: HTTPCachePolicy.withDate(HTTPCachePolicy.storableHeaders(headers), receivedAt: responseTime),
            varyNames: varyNames,
            varyDigest: varyDigest,
            body: plan.request.method == .head ? Data() : data
        )
        // Marked stale while this exchange ran: stored, but stale (it may predate the change).
        stored.isInvalidated = cache.staleEpoch(of: plan.primaryKey) != epoch
        // The layer above may know the response can hold a write whose fate is not settled yet
        // (OfflineFirst): the caller gets it; the store keeps what it had.
        if let observer, let token, !observer.mayStore(token) { return .passed(data, response) }
        // The new response replaces every stored variant this request would have selected.
        let superseded = cache.variants(for: [plan.primaryKey], counting: false)
            .filter { $0.key != stored.key && HTTPCachePolicy.matches($0, requestHeaders: plan.sentHeaders) }
            .map(\.key)
        cache.remove(superseded)
        cache.store(stored)
        return .stored(data, response)
    }

    /// RFC 9111 §4.3.5: each stored GET response this HEAD could have chosen is updated with the
    /// HEAD response's headers when they describe it, and marked stale when they do not.
    private func freshenStoredGET(_ plan: Plan, headHeaders: [String: String], requestTime: Date, responseTime: Date) {
        let getKey = Plan.primaryKey(method: .get, url: plan.request.url, partition: partitionDigest)
        for stored in cache.variants(for: [getKey], counting: false) where HTTPCachePolicy.matches(stored, requestHeaders: plan.sentHeaders) {
            cache.update(stored.key) { current in
                if HTTPCachePolicy.headResponse(headHeaders, describes: current) {
                    return HTTPCachePolicy.refreshed(current, with: headHeaders, requestTime: requestTime, responseTime: responseTime)
                }
                var invalidated = current
                invalidated.isInvalidated = true
                return invalidated
            }
        }
    }

    /// Refreshes a stale response served from the store: at once when online, otherwise once
    /// connectivity returns.
    private func revalidate(_ plan: Plan, cached: StoredResponse) async {
        if await reachabilityMonitor.isConnected {
            revalidateInBackground(plan, cached: cached)
        } else {
            revalidateWhenOnline(plan, cached: cached)
        }
    }

    private func revalidateInBackground(_ plan: Plan, cached: StoredResponse) {
        let epoch = cache.staleEpoch(of: plan.primaryKey)
        fetches.startInBackground(Self.flightKey(plan, epoch: epoch)) { [self] in
            await self.networkExchange(plan, cached: cached, epoch: epoch)
        }
    }

    /// The key concurrent readers share an exchange under: the request's, within one stale epoch.
    private static func flightKey(_ plan: Plan, epoch: UInt64) -> CacheDigest {
        epoch == 0 ? plan.fetchKey : CacheDigest(plan.fetchKey.hex + "\nepoch \(epoch)")
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
            guard online, let current = self.lookup(plan, counting: false), current.storedAt <= cached.storedAt else { return }
            self.revalidateInBackground(plan, cached: current)
        }
    }

    /// Statuses that say the server is failing, not that the resource changed.
    private static let serverFailures: Set<Int> = [500, 502, 503, 504]

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
