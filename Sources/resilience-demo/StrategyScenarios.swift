import Foundation
import Resilience
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The strategies beyond retry: total deadline, hedging, per-host concurrency limit, breakers per
/// host, fault injection. Each against the loopback server, through URLSession.
extension Demo {
    static func totalDeadline(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/sluggish", [.status(503), LoopbackResponse.ok("too late").held()])
        let events = EventLog()
        let engine = AsyncRequestEngine(configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 5, interval: 0.05)), deadline: .milliseconds(300), eventSink: events))
        let start = ContinuousClock.now
        var error: NetworkError?
        do {
            _ = try await engine.send(DemoRequest(url: server.url("/sluggish")))
        } catch let failure as NetworkError {
            error = failure
        }
        let elapsed = ContinuousClock.now - start
        server.releaseHeld("/sluggish")
        for line in events.lines { print("    \(line)") }
        var exceeded = false
        if case .deadlineExceeded = error { exceeded = true }
        return Outcome(
            passed: exceeded && elapsed < .seconds(2) && server.hits("/sluggish") == 2,
            detail: "a 503, a retry, then a stuck attempt: deadlineExceeded after \(format(elapsed)) (deadline 300 ms, attempt timeout 10 s)"
        )
    }

    static func hedging(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/tail", [LoopbackResponse.ok("slow copy").held(), .ok("hedged copy")])
        let hedges = HedgeLog()
        let engine = AsyncRequestEngine(configuration: .init(hedging: HedgingPolicy(delay: .milliseconds(50), maxAttempts: 2), eventSink: hedges))
        let start = ContinuousClock.now
        let (data, _) = try await engine.send(DemoRequest(url: server.url("/tail")))
        let elapsed = ContinuousClock.now - start
        await server.waitForOpenConnections(atMost: 1)  // the slow copy's connection closed: it was cancelled
        let body = String(decoding: data, as: UTF8.self)
        print("    first copy held by the server; hedge sent after \(hedges.afterMilliseconds.map { "\($0) ms" } ?? "—")")
        return Outcome(
            passed: body == "hedged copy" && server.hits("/tail") == 2 && hedges.count == 1,
            detail: "answered by the hedge in \(format(elapsed)); the held copy was cancelled"
        )
    }

    static func hostLimit(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/job/*", LoopbackResponse.ok("done").held())
        let engine = AsyncRequestEngine(configuration: .init(limits: .init(concurrencyPerHost: 2, waitingPerHost: 2)))
        let base = server.url("/job")
        let (refused, completed) = await withTaskGroup(of: NetworkError?.self) { group -> (Int, Int) in
            for index in 0..<6 {
                group.addTask {
                    do {
                        _ = try await engine.send(DemoRequest(url: base.appendingPathComponent("\(index)"), method: .post))
                        return nil
                    } catch let error as NetworkError {
                        return error
                    } catch {
                        return .underlying(error)
                    }
                }
            }
            // Two run, two wait; the other two are refused at once (the only answers before a release).
            var refused = 0
            for _ in 0..<2 {
                if case .limited? = await group.next() ?? nil { refused += 1 }
            }
            print("    refused at once: \(refused) of 6")
            await server.waitForHits("/job/*", atLeast: 2)
            server.releaseHeld("/job/*")
            await server.waitForHits("/job/*", atLeast: 4)  // the two in line got the places
            server.releaseHeld("/job/*")
            var completed = 0
            for await result in group where result == nil { completed += 1 }
            return (refused, completed)
        }
        return Outcome(
            passed: refused == 2 && completed == 4 && server.hits("/job/*") == 4,
            detail: "limit 2 per host, line of 2: 4 served in turn, 2 refused with NetworkError.limited"
        )
    }

    static func breakersPerHost(_ server: LoopbackHTTPServer) async throws -> Outcome {
        let other = try LoopbackHTTPServer()
        defer { other.shutdown() }
        server.route("/failing-host", .status(503))
        other.route("/up", .ok("up"))
        let registry = CircuitBreakerRegistry(configuration: .init(windowSize: 4, minimumCalls: 4, failureRateThreshold: 0.5))
        let engine = AsyncRequestEngine(configuration: .init(circuitBreaker: .perHost(registry)))
        var fastFailures = 0
        for _ in 0..<10 {
            do {
                _ = try await engine.send(DemoRequest(url: server.url("/failing-host")))
            } catch NetworkError.circuitOpen {
                fastFailures += 1
            } catch {}
        }
        let up = try await engine.send(DemoRequest(url: other.url("/up"))).1.statusCode
        let otherHost = CircuitBreakerRegistry.authority(of: other.baseURL) ?? ""
        registry.isolate(host: otherHost)
        var isolated = false
        do {
            _ = try await engine.send(DemoRequest(url: other.url("/up")))
        } catch NetworkError.circuitOpen {
            isolated = true
        }
        registry.reset(host: otherHost)
        let afterReset = try await engine.send(DemoRequest(url: other.url("/up"))).1.statusCode
        let states = registry.states.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        print("    breakers: \(states); the failing host saw \(server.hits("/failing-host")) calls, \(fastFailures) failed fast; isolated: \(isolated)")
        return Outcome(
            passed: server.hits("/failing-host") == 4 && fastFailures == 6 && up == 200 && isolated && afterReset == 200,
            detail: "failing host open after 4 calls (6 failed fast); the other host kept answering, failed fast while isolated by hand, answered after reset"
        )
    }

    static func faultInjection(_ server: LoopbackHTTPServer) async throws -> Outcome {
        server.route("/steady", .ok("steady"))
        let faults = FaultInjectingSession(
            wrapping: URLSessionTransport.shared,
            faults: [.latency(.milliseconds(20), rate: 0.2), .status(503, rate: 0.3)],
            seed: 2026
        )
        let engine = AsyncRequestEngine(
            session: faults,
            retryPolicy: ExponentialRetryPolicy(maxRetries: 6, baseDelay: 0.005, maxDelay: 0.05, jitter: .full)
        )
        var succeeded = 0
        for _ in 0..<20 {
            if (try? await engine.send(DemoRequest(url: server.url("/steady")))) != nil { succeeded += 1 }
        }
        let reached = server.hits("/steady")
        faults.isEnabled = false
        let plain = try await engine.send(DemoRequest(url: server.url("/steady"))).1.statusCode
        print("    20 requests under injected 503s (30 %) and 20 ms stalls (20 %): \(succeeded) succeeded; the server saw \(reached) calls")
        return Outcome(
            passed: succeeded == 20 && reached == 20 && plain == 200,
            detail: "retries rode out the rehearsed outage; faults switched off at run time"
        )
    }
}

/// Counts hedges (and ignores the other events).
final class HedgeLog: HedgingEventSink {
    private let state = Locked<[HedgeEvent]>([])
    func record(_ event: RequestEvent) async {}
    func recordHedge(_ event: HedgeEvent) async { state.withLock { $0.append(event) } }
    var count: Int { state.withLock { $0.count } }
    var afterMilliseconds: Int? { state.withLock { $0.first.map { Int(($0.after * 1000).rounded()) } } }
}
