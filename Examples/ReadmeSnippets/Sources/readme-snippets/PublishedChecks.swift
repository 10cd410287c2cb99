import PublishedReadme
import ReadmeSnippets
import Resilience
import ResilienceTesting

/// Runs SwiftResilience's published README snippets and public API calls (module `PublishedReadme`,
/// built against the `Resilience` product) against `server`, and checks they mean what they meant
/// there — or, for the deliberate differences, what this README's migration table says.
@MainActor func runPublishedChecks(_ server: LoopbackHTTPServer, scratch: URL) async {
    SnippetContext.baseURL = server.baseURL
    do {
        try await runPublishedChecksThrowing(server, scratch: scratch)
    } catch {
        check("published: no unexpected error", false, "\(error)")
    }
    await runMigrationTableChecks(server, scratch: scratch)
}

@MainActor private func runPublishedChecksThrowing(_ server: LoopbackHTTPServer, scratch: URL) async throws {
    // Exponential Retry
    let policy = exponentialRetrySnippet()
    let delays = (0...3).map { policy.delay(forAttempt: $0) }
    check("published: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 1.0) waits 1, 2, 4 s, then stops", delays == [1, 2, 4, nil], "\(delays)")

    // Async Request Engine: a 200, then a 404 caught as httpError (not retried)
    server.route("/user", .ok("me"))
    try await asyncRequestEngineSnippet()
    server.route("/user", .status(404))
    try await asyncRequestEngineSnippet()
    check("published: the engine snippet sends, and catches a 404 without retrying", server.hits("/user") == 2, "\(server.hits("/user")) calls")
    server.route("/user", .ok("me"))

    // Request Deduplication: three concurrent sends, one network call
    server.route("/feed", LoopbackResponse.ok("feed").held())
    let sink = ConsoleSink()
    let dedupEngine = AsyncRequestEngine(eventSink: sink)
    let feeds = Task { try await requestDeduplicationSnippet(engine: dedupEngine) }
    await server.waitForHits("/feed", atLeast: 1)
    while await sink.seen.filter({ $0.hasPrefix("deduplicated") }).count < 2 { await Task.yield() }
    server.releaseHeld("/feed")
    let responses = try await feeds.value
    check(
        "published: three concurrent identical GETs make one network call",
        responses.count == 3
            && responses.allSatisfy { $0.1.statusCode == 200 && $0.0 == Data("feed".utf8) } && server.hits("/feed") == 1,
        "\(server.hits("/feed")) upstream call(s)")

    // Offline Queue: the default folder (here under XDG_DATA_HOME = scratch), sent or queued, then
    // delivered with the request's own Idempotency-Key
    server.route("/orders", .status(201))
    let (queue, monitor) = try await offlineQueueSnippet()
    let expectedFolder = scratch.appendingPathComponent("Resilience/OfflineQueue").standardizedFileURL.path
    check(
        "published: OfflineQueueEngine(reachabilityMonitor:) uses the default folder",
        (queue.store as? DiskQueueStore)?.directory.standardizedFileURL.path == expectedFolder, (queue.store as? DiskQueueStore)?.directory.path ?? "")
    if await queue.pendingCount() > 0 {
        // Queued (this machine's monitor said offline): drain it as the background drainer would.
        _ = await queue.flush(.ignoringReachability)
    }
    let order = server.requestLog.last { $0.path == "/orders" }
    let stillPending = await queue.pendingCount()
    check(
        "published: the order is delivered once, POST with Idempotency-Key: order-abc-123",
        server.hits("/orders") == 1 && order?.method == "POST" && order?.header("Idempotency-Key") == "order-abc-123"
            && order?.body == Data(#"{"item":"book","quantity":1}"#.utf8) && stillPending == 0,
        "\(server.hits("/orders")) call(s), key \(order?.header("Idempotency-Key") ?? "none")")
    do {
        _ = try OfflineQueueEngine(reachabilityMonitor: ManualReachabilityMonitor())
        check("published: a second queue on the default folder is refused", false, "it opened")
    } catch OfflineQueueError.folderInUse {
        check("published: a second queue on the default folder is refused", true, "folderInUse")
    }
    await queue.stop()
    await monitor.stop()

    // Concurrency Safety: an expired token, one refresh through the app's token endpoint, one retry
    SnippetContext.setKeychain(["access_token": "expired", "refresh_token": "r-1"])
    server.route("/token", .ok("fresh-token"))
    server.route("/profile") { request in
        request.header("Authorization") == "Bearer fresh-token" ? .ok("profile") : .status(401)
    }
    let (profile, authEngine) = try await concurrencySafetySnippet()
    check(
        "published: a 401 refreshes once and retries with the new token",
        profile == Data("profile".utf8)
            && server.hits("/token") == 1 && server.hits("/profile") == 2, "\(server.hits("/token")) refresh(es), \(server.hits("/profile")) calls")

    // …and a second 401 after the refresh is NetworkError.httpError(401, _): the login screen
    server.route("/profile", .status(401))
    try await sessionExpiredSnippet(engine: authEngine)
    check(
        "published: a 401 after the refresh reaches `catch NetworkError.httpError(401, _)`", SnippetContext.loginScreensShown == 1,
        "\(SnippetContext.loginScreensShown) login screen(s)")

    // Deliberate difference: a failed refresh is AuthError.refreshFailed(underlying:), matched as the table says
    SnippetContext.failRefresh(true)
    SnippetContext.setKeychain(["access_token": "expired-again", "refresh_token": "r-2"])
    let caught = await Migration.refreshFailure(engine: authEngine)
    check("difference: a failed refresh arrives wrapped; `catch AuthError.refreshFailed(let e as MyError)` matches", caught == "provider error", caught)
    SnippetContext.failRefresh(false)

    // Deliberate difference: no token refreshes before the first send (never sent without one)
    SnippetContext.setKeychain(["refresh_token": "r-3"])
    server.route("/profile") { request in
        request.header("Authorization") == "Bearer fresh-token" ? .ok("profile") : .status(401)
    }
    let profilesBefore = server.hits("/profile")
    let tokensBefore = server.hits("/token")
    _ = try await concurrencySafetySnippet()
    let unauthenticated = server.requestLog.filter { $0.path == "/profile" && $0.header("Authorization") == nil }.count
    check(
        "difference: a nil token refreshes first; nothing goes out without one",
        server.hits("/profile") == profilesBefore + 1
            && server.hits("/token") == tokensBefore + 1 && unauthenticated == 0,
        "\(server.hits("/profile") - profilesBefore) profile call(s), \(server.hits("/token") - tokensBefore) refresh(es)")

    // Advanced Observability: the snippet prints an empty snapshot; its engine then counts a request
    let (metrics, observedEngine) = await advancedObservabilitySnippet()
    try await observedEngine.send(FetchUser(url: server.url("/user")))
    let stats = await metrics.snapshot()
    check(
        "published: RequestMetricsCollector counts the engine's requests",
        stats.requestsStarted == 1 && stats.requestsSucceeded == 1
            && stats.successRate == 1, "started \(stats.requestsStarted), succeeded \(stats.requestsSucceeded)")
    Migration.recordDirectly(metrics)

    let logged = customSinkSnippet()
    let (_, loggedResponse) = try await logged.send(FetchUser(url: server.url("/user")))
    check("published: a custom RequestEventSink (RequestLogger) engine sends", loggedResponse.statusCode == 200, "\(loggedResponse.statusCode)")

    // The published public API beyond the README
    let store = try await PublishedAPI.diskQueueStore(in: scratch.appendingPathComponent("store"))
    check(
        "published: DiskQueueStore save / load (unexpired only) / count (expired too) / deleteExpired / delete",
        store.loadedIDs == [store.savedID] && store.countWithExpired == 2 && store.expiredDeleted == 1 && store.countAfterDelete == 0,
        "load \(store.loadedIDs.count), count \(store.countWithExpired), swept \(store.expiredDeleted), then \(store.countAfterDelete)")
    let entry = PublishedAPI.queueEntry()
    check(
        "published: QueueEntry(_:id:enqueuedAt:), isExpired, asURLRequest() with Idempotency-Key",
        entry.expired && !entry.freshExpired && entry.method == "POST" && entry.key == "order-entry-1" && entry.priority == 1, "\(entry)")
    let collected = try await PublishedAPI.metricsCollector(server.url("/user"))
    check("published: RequestMetricsCollector snapshot() and reset()", collected.before == 1 && collected.after == 0 && collected.successRate == 1, "\(collected)")
    let pending = try await PublishedAPI.offlineQueueEngine(in: scratch.appendingPathComponent("queue"))
    check("published: enqueue while offline, pendingCount(), cancel(id:)", pending.pendingAfterEnqueue == 1 && pending.pendingAfterCancel == 0, "\(pending)")

    // The table's other one-line changes
    let keys = Migration.idempotencyKeys()
    check("difference: the default key is fresh per request; `derivedIdempotencyKey` is stable", keys.derivedIsStable && keys.defaultIsFresh, "\(keys)")
    server.route("/queued", .ok())
    let offlineQueue = OfflineQueueEngine(
        reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
        store: try DiskQueueStore(directory: scratch.appendingPathComponent("offline"))
    )
    try await offlineQueue.enqueue(QueuedRequest(method: .post, url: server.url("/queued")))
    let respected = await offlineQueue.flush()
    let forced = await Migration.forcedFlush(queue: offlineQueue)
    check(
        "difference: flush() follows the monitor; flush(.ignoringReachability) sends anyway",
        respected.delivered.isEmpty && respected.endedOffline && forced == 1 && server.hits("/queued") == 1, "forced delivered \(forced)")
}

@MainActor func runMigrationTableChecks(_ server: LoopbackHTTPServer, scratch: URL) async {
    server.route("/busy", .status(503))
    server.route("/user", .ok("me"))
    do {
        let seen = try await Migration.otherChanges(scratch: scratch)
        check("difference: the table's other one-line changes compile and behave", seen.count == 5 && seen.values.allSatisfy { $0 }, "\(seen)")
    } catch {
        check("difference: the table's other one-line changes compile and behave", false, "\(error)")
    }
    do {
        let queue = try await Migration.secretsAndMonitors(folder: scratch.appendingPathComponent("replay"), key: "k-1", isUp: true)
        let report = await queue.flush()
        check("difference: a queue with replayHeaders and a forwarded monitor runs", !report.endedOffline, "\(report.remaining) left")
    } catch {
        check("difference: a queue with replayHeaders and a forwarded monitor runs", false, "\(error)")
    }
    check("difference: a dropped connection has its own case", Migration.describe(.transport(.connectionLost)) == "connection lost", "")
}

private struct FetchUser: NetworkRequest {
    let url: URL
    let method: HTTPMethod = .get
}
