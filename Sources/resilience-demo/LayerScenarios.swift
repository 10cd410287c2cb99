import Foundation
import Resilience
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The scenarios for the layers above the engine: Auth, OfflineQueue, Observability.
extension Demo {
    /// 500 concurrent requests with an expired token: one refresh, every request succeeds.
    static func authStorm(_ server: LoopbackHTTPServer) async throws -> Outcome {
        let valid = ValidTokenBox("token-2")
        server.route(
            "/account/*",
            handler: { request in
                request.header("authorization") == "Bearer " + valid.value ? .ok("{}") : .status(401)
            })
        let provider = StressTokenProvider(current: "token-1-expired", refreshed: valid.value)
        let api = AuthenticatedRequestEngine(
            requestEngine: AsyncRequestEngine(),
            coordinator: TokenRefreshCoordinator(provider: provider)
        )
        let callers = 500
        let succeeded = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<callers {
                let url = server.url("/account/\(index)")
                group.addTask { (try? await api.send(DemoRequest(url: url))) != nil }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        let refreshes = provider.refreshCount
        print("    \(callers) callers, expired token → \(server.hits("/account/*")) requests reached the server, \(refreshes) refresh")
        return Outcome(passed: refreshes == 1 && succeeded == callers, detail: "\(succeeded)/\(callers) succeeded with \(refreshes) token refresh")
    }

    /// Offline → queued durably → "restart" (a second engine on the same folder) → reconnect →
    /// drained, each replay carrying the key of its first attempt.
    static func offlineQueue(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/comments", .status(201))
        server.route("/likes", [.status(503), .status(201)])
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-demo-queue-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: folder) }

        var keys: [String] = []
        do {
            let monitor = ManualReachabilityMonitor(isConnected: true)
            let queue = OfflineQueueEngine(reachabilityMonitor: monitor, store: try DiskQueueStore(directory: folder))
            var like = QueuedRequest(method: .post, url: server.url("/likes"), body: Data("{\"post\":7}".utf8))
            like.idempotencyKey = "like-7"
            let first = try await queue.enqueue(like)  // 503: kept with a backoff
            print("    online, POST /likes → 503 → \(first)")
            await monitor.setConnected(false)
            print("    network lost")
            for index in 1...3 {
                var comment = QueuedRequest(method: .post, url: server.url("/comments"), body: Data("{\"text\":\"#\(index)\"}".utf8), priority: .high)
                comment.idempotencyKey = "comment-\(index)"
                _ = try await queue.enqueue(comment)
            }
            keys = await queue.items.map(\.idempotencyKey)
            print("    queued durably: \(keys.joined(separator: ", ")) (replay order)")
        }
        print("    process \"restarts\": a new engine opens the same folder")
        let store = try DiskQueueStore(directory: folder)
        let monitor = ManualReachabilityMonitor(isConnected: false)
        let queue = OfflineQueueEngine(
            reachabilityMonitor: monitor, store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 0))
        )
        print("    reopened \(store.openReport.loaded) entries (quarantined: \(store.openReport.quarantined.count))")
        let results = await queue.results
        await queue.start()
        await monitor.setConnected(true)
        print("    network back: the queue drains by itself (the 503'd like waits out its backoff)")
        // Wait for four deliveries, or give up after 15 s.
        let delivered =
            await within(.seconds(15)) { () -> Int? in
                var delivered = 0
                for await result in results {
                    print("      \(result)")
                    if case .delivered = result { delivered += 1 }
                    if delivered == 4 { break }
                }
                return delivered
            } ?? 0
        await queue.stop()
        let sentKeys = server.requestLog.filter { $0.path == "/comments" || $0.path == "/likes" }.compactMap { $0.header("idempotency-key") }
        let likeKeys = sentKeys.filter { $0 == "like-7" }.count
        let pending = await queue.pendingCount()
        let ok = delivered == 4 && Set(sentKeys) == Set(keys) && likeKeys == 2 && pending == 0
        return Outcome(passed: ok, detail: "4 entries survived the restart and were delivered; the 503'd like was replayed with its first key")
    }

    /// A mixed workload through an engine recording into the metrics collector; prints the table
    /// and the Prometheus text.
    static func metrics(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/api/users/*", .ok("{\"name\":\"ada\"}"))
        server.route("/api/orders/*", [.status(503), .ok("{}")])
        server.route("/api/missing", .status(404))
        let metrics = RequestMetricsCollector()
        let engine = AsyncRequestEngine(retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0.005), eventSink: metrics)
        for index in 0..<120 {
            let path: String
            switch index % 6 {
            case 0, 1, 2: path = "/api/users/\(index)?session=secret-\(index)"
            case 3, 4: path = "/api/orders/\(UUID().uuidString)"
            default: path = "/api/missing"
            }
            _ = try? await engine.send(DemoRequest(url: server.url(path), method: index % 6 >= 3 && index % 6 < 5 ? .put : .get))
        }
        let snapshot = await metrics.snapshot()
        print(
            "    " + "ENDPOINT".padding(toLength: 24, withPad: " ", startingAt: 0)
                + ["REQUESTS", "OK", "FAILED", "RETRIES", "p50 ms", "p95 ms", "p99 ms"].map { $0.padding(toLength: 12, withPad: " ", startingAt: 0) }.joined())
        for endpoint in snapshot.endpoints.sorted(by: { $0.template < $1.template }) {
            let summary = endpoint.successDuration
            let cells = [
                "\(endpoint.method) \(endpoint.template)".padding(toLength: 24, withPad: " ", startingAt: 0),
                "\(endpoint.requestsStarted)", "\(endpoint.requestsSucceeded)", "\(endpoint.requestsFailed)", "\(endpoint.retriesScheduled)",
                summary.map { String(format: "%.2f", $0.p50 * 1000) } ?? "-",
                summary.map { String(format: "%.2f", $0.p95 * 1000) } ?? "-",
                summary.map { String(format: "%.2f", $0.p99 * 1000) } ?? "-",
            ]
            print("    " + cells[0] + cells.dropFirst().map { $0.padding(toLength: 12, withPad: " ", startingAt: 0) }.joined())
        }
        let text = metrics.prometheusText()
        print("    Prometheus text (first lines of \(text.split(separator: "\n").count)):")
        for line in text.split(separator: "\n").prefix(12) { print("      \(line)") }
        let noSecrets = !text.contains("secret-")
        let ok =
            snapshot.requestsStarted == 120 && snapshot.requestsSucceeded == 100 && snapshot.requestsFailed == 20 && noSecrets
            && snapshot.endpoints.contains { $0.template == "/api/users/{id}" } && snapshot.endpoints.contains { $0.template == "/api/orders/{id}" }
        return Outcome(passed: ok, detail: "120 requests over 3 endpoint templates; p50/p95/p99 per endpoint; no query value in any label")
    }
}
