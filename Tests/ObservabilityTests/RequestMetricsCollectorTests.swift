import Foundation
import RequestEngine
import ResilienceTesting
import Testing

@testable import Observability

@Suite("RequestMetricsCollector: counting, derived values, reset, bounded memory")
struct RequestMetricsCollectorTests {
    let api = url("https://api.example.com/v1/users/42")

    @Test func aRequestWithAnOperationIsCountedUnderItsOperationNotItsPath() async {
        let collector = RequestMetricsCollector()
        let created = UUID()
        await collector.record(.started(traceID: created, url: url("https://api.example.com/v1/notes"), method: .post), operation: "createNote")
        collector.record(.succeeded(traceID: created, statusCode: 201, duration: 0.1, attempt: 0))
        collector.record(.started(traceID: UUID(), url: url("https://api.example.com/v1/notes"), method: .post))
        await collector.record(.deduplicated(traceID: UUID(), url: api, method: .get), operation: "getUser")
        let stats = await collector.snapshot()
        #expect(stats.endpoint("POST", "createNote")?.requestsStarted == 1)
        #expect(stats.endpoint("POST", "createNote")?.requestsSucceeded == 1)
        #expect(stats.endpoint("POST", "/v1/notes")?.requestsStarted == 1)  // the same path, no operation
        #expect(stats.endpoint("GET", "getUser")?.deduplicationsHit == 1)
    }

    @Test func eachEventKindIncrementsItsCounterForItsEndpoint() async {
        let collector = RequestMetricsCollector()
        let first = UUID(), second = UUID()
        collector.record(.started(traceID: first, url: api, method: .get))
        collector.record(.retryScheduled(traceID: first, attempt: 0, delay: 0.5))
        collector.record(.succeeded(traceID: first, statusCode: 200, duration: 0.6, attempt: 1))
        collector.record(.started(traceID: second, url: url("https://api.example.com/v1/orders"), method: .post))
        collector.record(.failed(traceID: second, error: .noConnection, attempt: 0))
        collector.record(.deduplicated(traceID: UUID(), url: api, method: .get))

        let stats = await collector.snapshot()
        #expect(stats.requestsStarted == 2)
        #expect(stats.requestsSucceeded == 1)
        #expect(stats.requestsFailed == 1)
        #expect(stats.retriesScheduled == 1)
        #expect(stats.deduplicationsHit == 1)
        #expect(stats.requestsInFlight == 0)

        let users = stats.endpoint("GET", "/v1/users/{id}")
        #expect(users?.requestsStarted == 1)
        #expect(users?.retriesScheduled == 1)
        #expect(users?.requestsSucceeded == 1)
        #expect(users?.deduplicationsHit == 1)
        #expect(users?.statusCodes == [200: 1])
        let orders = stats.endpoint("POST", "/v1/orders")
        #expect(orders?.requestsFailed == 1)
        #expect(orders?.failureReasons == ["no_connection": 1])
        #expect(stats.endpoints.count == 2)
    }

    @Test func derivedValuesFollowThePublishedSemantics() async {
        let collector = RequestMetricsCollector()
        var stats = await collector.snapshot()
        #expect(stats.averageSuccessDuration == nil)
        #expect(stats.successRate == nil)

        collector.record(.started(traceID: UUID(), url: api, method: .get))  // in flight: not in the rate
        collector.record(.deduplicated(traceID: UUID(), url: api, method: .get))  // not a completion
        stats = await collector.snapshot()
        #expect(stats.successRate == nil)

        for duration in [1.0, 3.0, 0.42] {
            collector.record(.succeeded(traceID: UUID(), statusCode: 200, duration: duration, attempt: 0))
        }
        collector.record(.failed(traceID: UUID(), error: .timedOut, attempt: 0))
        stats = await collector.snapshot()
        #expect(abs((stats.averageSuccessDuration ?? 0) - 4.42 / 3) < 1e-9)
        #expect(abs((stats.successRate ?? 0) - 0.75) < 1e-9)
        #expect(stats.requestsInFlight == 1)
    }

    @Test func failedRequestsAreCountedByFinalStatusOrReason() async {
        let collector = RequestMetricsCollector()
        let errors: [NetworkError] = [
            .httpError(statusCode: 503, data: nil), .httpError(statusCode: 503, data: Data("x".utf8)),
            .httpError(statusCode: 404, data: nil), .timedOut, .cancelled, .transport(.cannotConnectToHost),
            .transport(.connectionLost), .transport(.dnsFailure), .transport(.secureConnectionFailed),
            .invalidResponse, .circuitOpen, .invalidRequest(reason: "bad"), .underlying(CocoaError(.fileNoSuchFile)),
        ]
        for (index, error) in errors.enumerated() {
            let id = traceID(0, index)
            collector.record(.started(traceID: id, url: api, method: .get))
            collector.record(.failed(traceID: id, error: error, attempt: 0))
        }
        let endpoint = collector.currentSnapshot().endpoint("GET", "/v1/users/{id}")
        #expect(endpoint?.statusCodes == [503: 2, 404: 1])
        #expect(
            endpoint?.failureReasons == [
                "timed_out": 1, "cancelled": 1, "cannot_connect": 1, "connection_lost": 1, "dns_failure": 1,
                "tls_failure": 1, "invalid_response": 1, "circuit_open": 1, "invalid_request": 1, "other": 1,
            ])
        #expect(endpoint?.requestsFailed == errors.count)
    }

    @Test func exactCountsWithEightTasksOfOneHundredThousandEventsEach() async {
        let collector = RequestMetricsCollector()
        let tasks = 8
        let eventsPerTask = 100_000
        let urls = (0..<10).map { url("https://api.example.com/items/\($0 * 1_000 + 7)?page=\($0)") }
        // Each task records whole requests of five events: started, retry, retry, succeeded or failed, dedup.
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<tasks {
                group.addTask {
                    for request in 0..<eventsPerTask / 5 {
                        let id = traceID(task, request)
                        let target = urls[request % urls.count]
                        collector.record(.started(traceID: id, url: target, method: .get))
                        collector.record(.retryScheduled(traceID: id, attempt: 0, delay: 0.01))
                        collector.record(.retryScheduled(traceID: id, attempt: 1, delay: 0.02))
                        if request % 4 == 0 {
                            collector.record(.failed(traceID: id, error: .httpError(statusCode: 503, data: nil), attempt: 2))
                        } else {
                            collector.record(.succeeded(traceID: id, statusCode: 200, duration: 0.001 * Double(request % 100 + 1), attempt: 2))
                        }
                        collector.record(.deduplicated(traceID: id, url: target, method: .get))
                    }
                }
            }
        }
        let requests = tasks * eventsPerTask / 5
        let stats = await collector.snapshot()
        #expect(stats.requestsStarted == requests)
        #expect(stats.retriesScheduled == 2 * requests)
        #expect(stats.requestsFailed == requests / 4)
        #expect(stats.requestsSucceeded == requests - requests / 4)
        #expect(stats.deduplicationsHit == requests)
        #expect(stats.statusCodes == [200: requests - requests / 4, 503: requests / 4])
        #expect(stats.requestsInFlight == 0)
        #expect(stats.evictedRequests == 0)
        #expect(stats.endpoints.map(\.template) == ["/items/{id}"])
        #expect(stats.successDuration?.count == requests - requests / 4)
        #expect(stats.endpoint("UNKNOWN", RequestMetricsCollector.unknownEndpoint) == nil)
    }

    @Test func terminalEventsOfUnknownTracesAreCountedUnderUnknown() async {
        let collector = RequestMetricsCollector()
        collector.record(.retryScheduled(traceID: UUID(), attempt: 0, delay: 1))
        collector.record(.succeeded(traceID: UUID(), statusCode: 201, duration: 0.1, attempt: 0))
        collector.record(.failed(traceID: UUID(), error: .timedOut, attempt: 0))
        let stats = await collector.snapshot()
        let unknown = stats.endpoint("UNKNOWN", "__unknown__")
        #expect(unknown?.retriesScheduled == 1)
        #expect(unknown?.requestsSucceeded == 1)
        #expect(unknown?.requestsFailed == 1)
        #expect(stats.requestsSucceeded == 1 && stats.requestsFailed == 1 && stats.retriesScheduled == 1)
    }

    @Test func traceTableStaysBoundedWhenTerminalEventsNeverArrive() async {
        let collector = RequestMetricsCollector(configuration: .init(maximumTrackedRequests: 64))
        for index in 0..<10_000 {
            collector.record(.started(traceID: traceID(1, index), url: api, method: .get))
        }
        var stats = await collector.snapshot()
        #expect(stats.requestsStarted == 10_000)
        #expect(stats.requestsInFlight <= 64)
        #expect(stats.requestsInFlight + stats.evictedRequests == 10_000)

        // The most recent request is still tracked; the first one was evicted long ago.
        collector.record(.succeeded(traceID: traceID(1, 9_999), statusCode: 200, duration: 0.1, attempt: 0))
        collector.record(.succeeded(traceID: traceID(1, 0), statusCode: 200, duration: 0.1, attempt: 0))
        stats = await collector.snapshot()
        #expect(stats.endpoint("GET", "/v1/users/{id}")?.requestsSucceeded == 1)
        #expect(stats.endpoint("UNKNOWN", "__unknown__")?.requestsSucceeded == 1)
    }

    @Test func resetZeroesCountsButARequestInFlightKeepsItsEndpoint() async {
        let collector = RequestMetricsCollector()
        let before = UUID(), inFlight = UUID()
        collector.record(.started(traceID: before, url: api, method: .get))
        collector.record(.succeeded(traceID: before, statusCode: 200, duration: 2.0, attempt: 0))
        collector.record(.started(traceID: inFlight, url: api, method: .get))
        collector.record(.deduplicated(traceID: UUID(), url: api, method: .get))

        await collector.reset()
        var stats = await collector.snapshot()
        #expect(stats.requestsStarted == 0 && stats.requestsSucceeded == 0 && stats.deduplicationsHit == 0)
        #expect(stats.endpoints.isEmpty)
        #expect(stats.successDuration == nil)
        #expect(stats.requestsInFlight == 1)

        collector.record(.succeeded(traceID: inFlight, statusCode: 200, duration: 0.5, attempt: 0))
        stats = await collector.snapshot()
        #expect(stats.requestsSucceeded == 1)
        #expect(stats.endpoint("GET", "/v1/users/{id}")?.requestsSucceeded == 1)
        #expect(stats.averageSuccessDuration == 0.5)
    }

    @Test func endpointsPastTheCapShareAnOverflowRowPerMethod() async {
        let collector = RequestMetricsCollector(configuration: .init(maximumEndpoints: 3))
        for index in 0..<10 {
            collector.record(.started(traceID: UUID(), url: url("https://api.example.com/resource\(index)"), method: .get))
        }
        collector.record(.started(traceID: UUID(), url: url("https://api.example.com/resource0"), method: .get))
        collector.record(.started(traceID: UUID(), url: url("https://api.example.com/other"), method: .delete))
        collector.record(.deduplicated(traceID: UUID(), url: url("https://api.example.com/resource9"), method: .get))

        let stats = await collector.snapshot()
        #expect(stats.endpoints.count == 5)  // 3 registered + GET overflow + DELETE overflow
        #expect(stats.endpoint("GET", "/resource0")?.requestsStarted == 2)
        #expect(stats.endpoint("GET", "/resource2")?.requestsStarted == 1)
        #expect(stats.endpoint("GET", "/resource3") == nil)
        #expect(stats.endpoint("GET", "__other__")?.requestsStarted == 7)
        #expect(stats.endpoint("GET", "__other__")?.deduplicationsHit == 1)
        #expect(stats.endpoint("DELETE", "__other__")?.requestsStarted == 1)
        #expect(stats.requestsStarted == 12)
    }

    @Test func aCustomTemplateFunctionDecidesTheEndpoint() async {
        let template = PathTemplate.custom { path in
            path.hasPrefix("/profiles/") ? "/profiles/{name}" : PathTemplate.collapsingIdentifiers.template(forPath: path)
        }
        let collector = RequestMetricsCollector(configuration: .init(pathTemplate: template))
        for name in ["alice", "bob", "carol"] {
            collector.record(.started(traceID: UUID(), url: url("https://x.test/profiles/\(name)?session=s3cr3t"), method: .get))
        }
        collector.record(.started(traceID: UUID(), url: url("https://x.test/orders/77"), method: .get))
        let stats = await collector.snapshot()
        #expect(stats.endpoint("GET", "/profiles/{name}")?.requestsStarted == 3)
        #expect(stats.endpoint("GET", "/orders/{id}")?.requestsStarted == 1)
    }

    @Test func endpointPercentilesAreWithinOnePercentOfTheExactOnes() async {
        let collector = RequestMetricsCollector()
        var generator = SplitMix64(seed: 7)
        var durations: [Double] = []
        for index in 0..<20_000 {
            let duration = exp(Double.random(in: log(0.002)...log(4.0), using: &generator))
            durations.append(duration)
            let id = traceID(2, index)
            collector.record(.started(traceID: id, url: api, method: .get))
            collector.record(.succeeded(traceID: id, statusCode: 200, duration: duration, attempt: 0))
        }
        durations.sort()
        func exact(_ fraction: Double) -> Double {
            durations[Int((fraction * Double(durations.count)).rounded(.up)) - 1]
        }
        let summary = collector.currentSnapshot().endpoint("GET", "/v1/users/{id}")?.successDuration
        #expect(summary?.count == 20_000)
        #expect(relativeError(summary?.p50 ?? 0, exact(0.50)) <= 0.01)
        #expect(relativeError(summary?.p95 ?? 0, exact(0.95)) <= 0.01)
        #expect(relativeError(summary?.p99 ?? 0, exact(0.99)) <= 0.01)
        #expect(abs((summary?.minimum ?? 0) - durations[0]) < 1e-9)
        #expect(abs((summary?.maximum ?? 0) - durations[durations.count - 1]) < 1e-9)
    }

    @Test func snapshotRoundTripsThroughJSONWithDerivedValues() async throws {
        let collector = RequestMetricsCollector()
        let id = UUID()
        collector.record(.started(traceID: id, url: api, method: .get))
        collector.record(.succeeded(traceID: id, statusCode: 200, duration: 0.25, attempt: 0))
        collector.record(.failed(traceID: UUID(), error: .timedOut, attempt: 0))
        let stats = await collector.snapshot()

        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let json = try encoder.encode(stats)
        let object = try #require(try JSONSerialization.jsonObject(with: json) as? [String: Any])
        #expect(object["successRate"] as? Double == 0.5)
        #expect(object["averageSuccessDuration"] as? Double == 0.25)
        let endpoints = try #require(object["endpoints"] as? [[String: Any]])
        #expect(endpoints.first { $0["template"] as? String == "/v1/users/{id}" }?["statusCodes"] as? [String: Int] == ["200": 1])

        let decoded = try JSONDecoder().decode(RequestMetrics.self, from: json)
        #expect(decoded == stats)
    }

    @Test func aSnapshotIsAValueThatLaterEventsDoNotChange() async {
        let collector = RequestMetricsCollector()
        collector.record(.started(traceID: UUID(), url: api, method: .get))
        let first = await collector.snapshot()
        collector.record(.started(traceID: UUID(), url: api, method: .get))
        #expect(first.requestsStarted == 1)
        #expect(collector.currentSnapshot().requestsStarted == 2)
    }
}
