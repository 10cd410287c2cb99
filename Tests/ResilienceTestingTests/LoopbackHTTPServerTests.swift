import Foundation
import ResilienceTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// Integration tests for LoopbackHTTPServer, through the real URLSession (swift-corelibs-foundation
// over libcurl on Linux) and, where URLSession cannot express the scenario (1000 connections,
// pipelining, malformed input), through plain blocking POSIX sockets run off the cooperative pool.
// Nothing waits on the wall clock: synchronisation goes through waitForHits, held responses and
// waitForOpenConnections.

@Suite("LoopbackHTTPServer", .timeLimit(.minutes(2)))
struct LoopbackHTTPServerTests {

    // MARK: Normal responses through URLSession

    @Test func getReturnsStatusBodyAndHeaders() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/hello", .status(201, headers: ["X-Test": "yes"], body: "hi there"))

        let (data, response) = try await fetch(server.url("/hello"))

        #expect(response.statusCode == 201)
        #expect(String(decoding: data, as: UTF8.self) == "hi there")
        #expect(response.value(forHTTPHeaderField: "X-Test") == "yes")
        #expect(response.value(forHTTPHeaderField: "Content-Length") == "8")
        #expect(response.value(forHTTPHeaderField: "Date")?.hasSuffix(" GMT") == true)
        #expect(server.hits("/hello") == 1)
        #expect(server.requestLog.first?.method == "GET")
    }

    @Test func scriptedSequenceServesInOrderThenRepeatsLast() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/flaky", [.status(503), .status(503), .ok("finally")])
        let session = makeSession()
        defer { session.finishTasksAndInvalidate() }

        var statuses: [Int] = []
        var lastBody = ""
        for _ in 0..<5 {
            let (data, response) = try await fetch(server.url("/flaky"), session: session)
            statuses.append(response.statusCode)
            lastBody = String(decoding: data, as: UTF8.self)
        }

        #expect(statuses == [503, 503, 200, 200, 200])
        #expect(lastBody == "finally")
        #expect(server.hits("/flaky") == 5)
        #expect(server.totalHits == 5)
    }

    @Test func prefixRouteHandlerSeesMethodQueryHeadersAndBody() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/items/*") { request in
            let summary = [
                request.method, request.path, request.query ?? "-",
                request.header("X-CUSTOM") ?? "-", String(decoding: request.body, as: UTF8.self),
            ].joined(separator: "|")
            return .json("{\"echo\":\"\(summary)\"}", status: 202)
        }

        let (data, response) = try await fetch(
            server.url("/items/42?expand=true&x=1"), method: "PUT",
            headers: ["X-Custom": "abc", "Content-Type": "text/plain"], body: Data("payload".utf8)
        )

        #expect(response.statusCode == 202)
        #expect(response.value(forHTTPHeaderField: "Content-Type") == "application/json")
        #expect(String(decoding: data, as: UTF8.self) == "{\"echo\":\"PUT|/items/42|expand=true&x=1|abc|payload\"}")
        let logged = try #require(server.requestLog.first)
        #expect(logged.target == "/items/42?expand=true&x=1")
        #expect(logged.headers["x-custom"] == "abc")
        #expect(logged.header("content-type") == "text/plain")
        #expect(server.hits("/items/42") == 1)
        #expect(server.hits("/items/*") == 1)
        #expect(server.hits("/items") == 0)
    }

    @Test func exactRouteWinsOverPrefixAndLongestPrefixWins() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/*", .ok("root prefix"))
        server.route("/a/*", .ok("a prefix"))
        server.route("/a/b/*", .ok("a/b prefix"))
        server.route("/a/b/exact", .ok("exact"))
        let session = makeSession()
        defer { session.finishTasksAndInvalidate() }

        func body(_ path: String) async throws -> String {
            String(decoding: try await fetch(server.url(path), session: session).0, as: UTF8.self)
        }
        #expect(try await body("/a/b/exact") == "exact")
        #expect(try await body("/a/b/exact?q=1") == "exact")
        #expect(try await body("/a/b/other") == "a/b prefix")
        #expect(try await body("/a/x") == "a prefix")
        #expect(try await body("/zzz") == "root prefix")

        server.removeRoute("/a/b/exact")
        #expect(try await body("/a/b/exact") == "a/b prefix")
    }

    @Test(arguments: [11, 100_000])
    func postBodyByContentLengthArrivesIntact(size: Int) async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/upload") { request in .ok("\(request.body.count)") }
        let payload = Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })

        let (data, response) = try await fetch(server.url("/upload"), method: "POST", body: payload)

        #expect(response.statusCode == 200)
        #expect(String(decoding: data, as: UTF8.self) == "\(size)")
        let logged = try #require(server.requestLog.first)
        #expect(logged.body == payload)
        #expect(logged.header("Content-Length") == "\(size)")
    }

    @Test func sequentialRequestsReuseOneKeepAliveConnection() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/ping", .ok("pong"))
        let session = makeSession()
        defer { session.finishTasksAndInvalidate() }

        _ = try await fetch(server.url("/ping"), session: session)
        _ = try await fetch(server.url("/ping"), session: session)

        let log = server.requestLog
        #expect(log.count == 2)
        #expect(log[0].connectionID == log[1].connectionID)
        #expect(server.acceptedConnections == 1)
    }

    @Test func theRequestLogKeepsOnlyTheNewestRequestsWhileTheCountsKeepCountingAll() async throws {
        let server = try LoopbackHTTPServer(requestLogLimit: 3)
        defer { server.shutdown() }
        server.route("/n/*", .ok("ok"))
        let session = makeSession()
        defer { session.finishTasksAndInvalidate() }
        for index in 0..<8 { _ = try await fetch(server.url("/n/\(index)"), session: session) }
        #expect(server.requestLogLimit == 3)
        #expect(server.requestLog.map(\.path) == ["/n/5", "/n/6", "/n/7"])
        #expect(server.totalHits == 8)
        #expect(server.hits("/n/*") == 8)
    }

    /// `resilience-demo stress queue` keeps every request (`requestLogLimit: .max`); its first
    /// request used to trap on `2 × logLimit` overflowing.
    @Test func theLargestRequestLogLimitKeepsEveryRequestWithoutOverflowing() async throws {
        let server = try LoopbackHTTPServer(requestLogLimit: .max)
        defer { server.shutdown() }
        server.route("/n/*", .ok("ok"))
        let session = makeSession()
        defer { session.finishTasksAndInvalidate() }
        for index in 0..<5 { _ = try await fetch(server.url("/n/\(index)"), session: session) }
        #expect(server.requestLogLimit == .max)
        #expect(server.requestLog.map(\.path) == (0..<5).map { "/n/\($0)" })
    }

    @Test func theDefaultRequestLogIsBoundedAndAZeroLimitKeepsOne() throws {
        #expect(try LoopbackHTTPServer().requestLogLimit == LoopbackHTTPServer.defaultRequestLogLimit)
        #expect(try LoopbackHTTPServer(requestLogLimit: 0).requestLogLimit == 1)
    }

    @Test func retryAfterHeaderIsDelivered() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/limited", .status(429, headers: ["Retry-After": "7"], body: "slow down"))

        let (data, response) = try await fetch(server.url("/limited"))

        #expect(response.statusCode == 429)
        #expect(response.value(forHTTPHeaderField: "Retry-After") == "7")
        #expect(String(decoding: data, as: UTF8.self) == "slow down")
    }

    @Test func unknownPathGets404WithEmptyBody() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/known", .ok("yes"))

        let (data, response) = try await fetch(server.url("/unknown"))

        #expect(response.statusCode == 404)
        #expect(data.isEmpty)
        #expect(server.hits("/unknown") == 1)
    }

    @Test func delayedResponseIsWrittenNoEarlierThanItsDelay() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/slow", LoopbackResponse.ok("late").delayed(by: .milliseconds(150)))

        let clock = ContinuousClock()
        let start = clock.now
        let (data, _) = try await fetch(server.url("/slow"))

        #expect(clock.now - start >= .milliseconds(150))
        #expect(String(decoding: data, as: UTF8.self) == "late")
    }

    // MARK: Held responses

    @Test func heldResponseIsWrittenOnlyAfterReleaseAndHitIsVisibleBefore() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/gate", LoopbackResponse.ok("released").held())

        let client = Task { try await fetch(server.url("/gate")) }
        await server.waitForHits("/gate", atLeast: 1)

        #expect(server.heldCount() == 1)
        #expect(server.heldCount("/gate") == 1)
        #expect(server.heldCount("/other") == 0)
        server.releaseHeld("/gate")
        #expect(server.heldCount() == 0)

        let (data, response) = try await client.value
        #expect(response.statusCode == 200)
        #expect(String(decoding: data, as: UTF8.self) == "released")
    }

    @Test func releaseHeldReleasesOnlyResponsesHeldAtThatMoment() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/gate", LoopbackResponse.ok().held())

        let first = Task { try await fetch(server.url("/gate")) }
        await server.waitForHits("/gate", atLeast: 1)
        server.releaseHeld()
        _ = try await first.value

        let second = Task { try await fetch(server.url("/gate")) }
        await server.waitForHits("/gate", atLeast: 2)
        #expect(server.heldCount("/gate") == 1)
        server.releaseHeld("/gate")
        #expect(try await second.value.1.statusCode == 200)
    }

    @Test func heldThenDelayedResponseWaitsForReleaseThenDelay() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/gate", LoopbackResponse.ok("x").held().delayed(by: .milliseconds(100)))

        let client = Task { try await fetch(server.url("/gate")) }
        await server.waitForHits("/gate", atLeast: 1)
        let clock = ContinuousClock()
        let releasedAt = clock.now
        server.releaseHeld()
        _ = try await client.value
        #expect(clock.now - releasedAt >= .milliseconds(100))
    }

    @Test func cancellingURLSessionTaskWhileHeldClosesConnectionAndDropsHeldEntry() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/gate", LoopbackResponse.ok().held())
        server.route("/after", .ok("still serving"))

        let client = Task { try await fetch(server.url("/gate")) }
        await server.waitForHits("/gate", atLeast: 1)
        #expect(server.heldCount() == 1)
        client.cancel()
        let result = await client.result
        #expect(throws: (any Error).self) { try result.get() }

        await server.waitForOpenConnections(atMost: 0)
        #expect(server.heldCount() == 0)
        #expect(server.hits("/gate") == 1)
        let (data, _) = try await fetch(server.url("/after"))
        #expect(String(decoding: data, as: UTF8.self) == "still serving")
    }

    @Test func rawClientDisconnectWhileHeldDropsHeldEntryWithoutLeakingConnection() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/gate", LoopbackResponse.ok().held())
        server.route("/delayed", LoopbackResponse.ok().delayed(by: .seconds(30)))

        let client = try RawHTTPClient(port: server.port)
        try client.send("GET /gate HTTP/1.1\r\nHost: x\r\n\r\nGET /delayed HTTP/1.1\r\nHost: x\r\n\r\n")
        await server.waitForHits("/delayed", atLeast: 1)
        #expect(server.heldCount() == 1)
        #expect(server.openConnections == 1)
        client.close()

        await server.waitForOpenConnections(atMost: 0)
        #expect(server.heldCount() == 0)
        server.releaseHeld()  // releasing a dropped entry is harmless
        #expect(server.hits("/gate") == 1)
    }

    @Test func waitForHitsReturnsPromptlyWhenCancelled() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }

        let waiter = Task { await server.waitForHits("/never", atLeast: 1) }
        waiter.cancel()
        await waiter.value
        #expect(server.hits("/never") == 0)

        // Already satisfied: returns at once.
        await server.waitForHits(nil, atLeast: 0)
    }

    @Test func shutdownWakesPendingWaiters() async throws {
        let server = try LoopbackHTTPServer()
        let waiter = Task { await server.waitForHits("/never", atLeast: 1) }
        server.shutdown()
        await waiter.value
        #expect(server.hits("/never") == 0)
    }

    // MARK: Faults

    enum Fault: String, CaseIterable, Sendable {
        case closeWithoutResponse, reset, rawGarbage, partialBody

        var response: LoopbackResponse {
            switch self {
            case .closeWithoutResponse: .closeWithoutResponse
            case .reset: .reset
            case .rawGarbage: .raw(Data("this is not HTTP at all\r\n\r\n".utf8))
            case .partialBody: .partialBodyThenClose(body: Data(repeating: 65, count: 1000))
            }
        }
    }

    @Test(arguments: Fault.allCases)
    func faultMakesURLSessionThrowURLError(fault: Fault) async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/fault", fault.response)

        do {
            let (_, response) = try await fetch(server.url("/fault"))
            Issue.record("expected URLSession to throw for \(fault), got status \(response.statusCode)")
        } catch let error as URLError {
            print("LoopbackHTTPServerTests: \(fault) -> URLError code \(error.code.rawValue) (\(error.code))")
        } catch {
            Issue.record("expected a URLError for \(fault), got \(error)")
        }
        #expect(server.hits("/fault") >= 1)
    }

    // MARK: Raw HTTP/1.1 behaviour

    @Test func pipelinedRequestsAreAnsweredInOrderBehindADelayedOne() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/slow", LoopbackResponse.ok("slow").delayed(by: .milliseconds(100)))
        server.route("/fast", .ok("fast"))

        let bodies = try await onBackgroundThread { () -> [String] in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
            return try [client.readResponse(), client.readResponse()].map { String(decoding: $0.body, as: UTF8.self) }
        }

        #expect(bodies == ["slow", "fast"])
        let log = server.requestLog
        #expect(log.map(\.path) == ["/slow", "/fast"])
        #expect(log[0].connectionID == log[1].connectionID)
    }

    @Test(arguments: [Duration.zero, .milliseconds(1)])
    func anEndlessChunkedBodyFlowsUntilTheClientCloses(interval: Duration) async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/endless", .endlessChunkedBody(chunk: Data("0123456789".utf8), interval: interval))

        let (response, body) = try await onBackgroundThread { () -> (RawHTTPResponse, Data) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            return (try client.readResponse(), try client.read(exactly: 15 * 50))  // 50 chunks
        }

        #expect(response.status == 200)
        #expect(response.headers["transfer-encoding"] == "chunked")
        #expect(response.headers["content-length"] == nil)
        #expect(body == Data(String(repeating: "a\r\n0123456789\r\n", count: 50).utf8))
        await server.waitForOpenConnections(atMost: 0)  // the client closed: the server stopped writing
        #expect(server.hits("/endless") == 1)
    }

    @Test func anEndlessBodyAnswersHEADWithTheHeadAlone() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/endless", .endlessChunkedBody())

        let (head, rest) = try await onBackgroundThread { () -> (RawHTTPResponse, Data) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("HEAD /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            return (try client.readResponse(isHEAD: true), try client.readToEnd())
        }

        #expect(head.status == 200)
        #expect(head.headers["transfer-encoding"] == "chunked")
        #expect(rest.isEmpty)
    }

    @Test func headResponseCarriesContentLengthButNoBody() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/doc", .ok("hello"))

        let (head, get) = try await onBackgroundThread { () -> (RawHTTPResponse, RawHTTPResponse) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("HEAD /doc HTTP/1.1\r\nHost: x\r\n\r\nGET /doc HTTP/1.1\r\nHost: x\r\n\r\n")
            return (try client.readResponse(isHEAD: true), try client.readResponse())
        }

        #expect(head.status == 200)
        #expect(head.headers["content-length"] == "5")
        #expect(head.body.isEmpty)
        #expect(get.status == 200)
        #expect(String(decoding: get.body, as: UTF8.self) == "hello")
    }

    @Test func expect100ContinueGetsInterimResponseBeforeBodyIsRead() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/upload") { request in .ok("got \(request.body.count)") }

        let (interim, final) = try await onBackgroundThread { () -> (RawHTTPResponse, RawHTTPResponse) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            let interim = try client.readResponse()
            try client.send("abcde")
            return (interim, try client.readResponse())
        }

        #expect(interim.status == 100)
        #expect(final.status == 200)
        #expect(String(decoding: final.body, as: UTF8.self) == "got 5")
        #expect(server.requestLog.first?.body == Data("abcde".utf8))
    }

    @Test func chunkedRequestBodyIsDecoded() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/chunks", .ok())

        let status = try await onBackgroundThread { () -> Int in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send(
                "POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
            )
            return try client.readResponse().status
        }

        #expect(status == 200)
        #expect(server.requestLog.first?.body == Data("hello, world".utf8))
    }

    @Test func malformedRequestLineGets400AndConnectionCloses() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }

        let (response, rest) = try await onBackgroundThread { () -> (RawHTTPResponse, Data) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("THIS IS NOT A REQUEST\r\n\r\n")
            return (try client.readResponse(), try client.readToEnd())
        }

        #expect(response.status == 400)
        #expect(response.headers["connection"] == "close")
        #expect(rest.isEmpty)
        #expect(server.totalHits == 0)
    }

    @Test func oversizedHeadersGet431AndConnectionCloses() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/big", .ok())

        let response = try await onBackgroundThread { () -> RawHTTPResponse in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            let filler = String(repeating: "a", count: 70 * 1024)
            try client.send("GET /big HTTP/1.1\r\nHost: x\r\nX-Filler: \(filler)\r\n\r\n")
            let response = try client.readResponse()
            _ = try client.readToEnd()
            return response
        }

        #expect(response.status == 431)
        #expect(response.headers["connection"] == "close")
        #expect(server.totalHits == 0)
    }

    @Test(arguments: [
        "GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /c HTTP/1.0\r\n\r\n",
    ])
    func requestAskingToCloseGetsConnectionCloseThenEOF(request: String) async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/c", .ok("bye"))

        let (response, rest) = try await onBackgroundThread { () -> (RawHTTPResponse, Data) in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send(request)
            return (try client.readResponse(), try client.readToEnd())
        }

        #expect(response.status == 200)
        #expect(response.headers["connection"] == "close")
        #expect(String(decoding: response.body, as: UTF8.self) == "bye")
        #expect(rest.isEmpty)
    }

    @Test func http10KeepAliveRequestKeepsConnection() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/k", .ok("k"))

        let responses = try await onBackgroundThread { () -> [RawHTTPResponse] in
            let client = try RawHTTPClient(port: server.port)
            defer { client.close() }
            try client.send("GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            let first = try client.readResponse()
            try client.send("GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            return [first, try client.readResponse()]
        }

        #expect(responses.map(\.status) == [200, 200])
        #expect(responses[0].headers["connection"] == "keep-alive")
        #expect(server.acceptedConnections == 1)
    }

    // MARK: Scale and lifecycle

    @Test func thousandConcurrentHeldConnectionsAreAllAnsweredAfterRelease() async throws {
        let connectionCount = 1000
        // Each connection costs two descriptors in this process (client and server side).
        try raiseOpenFileLimit(atLeast: 2 * connectionCount + 512)
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/held", LoopbackResponse.ok("done").held())
        let clock = ContinuousClock()
        let start = clock.now

        // Open every connection and send one request on it, from 4 threads.
        let clients = try await onBackgroundThread { () -> [RawHTTPClient] in
            try concurrentMap(count: connectionCount, threads: 4) { _ in
                let client = try RawHTTPClient(port: server.port)
                try client.send("GET /held HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                return client
            }
        }
        defer { clients.forEach { $0.close() } }

        await server.waitForHits("/held", atLeast: connectionCount)
        #expect(server.openConnections >= connectionCount)
        #expect(server.peakOpenConnections >= connectionCount)
        #expect(server.acceptedConnections == connectionCount)
        #expect(server.heldCount() == connectionCount)
        #expect(Set(server.requestLog.map(\.connectionID)).count == connectionCount)

        server.releaseHeld()
        let responses = try await onBackgroundThread { () -> [RawHTTPResponse] in
            try concurrentMap(count: connectionCount, threads: 4) { try clients[$0].readResponse() }
        }

        #expect(responses.count == connectionCount)
        #expect(responses.allSatisfy { $0.status == 200 && $0.body == Data("done".utf8) })
        #expect(server.heldCount() == 0)
        print("LoopbackHTTPServerTests: \(connectionCount) held connections round trip took \(clock.now - start)")

        // Every server-side socket is closed once its client goes away.
        clients.forEach { $0.close() }
        await server.waitForOpenConnections(atMost: 0)
        #expect(server.openConnections == 0)
        #expect(server.peakOpenConnections >= connectionCount)
    }

    @Test func shutdownIsIdempotentAndLaterConnectsAreRefused() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/held", LoopbackResponse.ok().held())
        let client = try RawHTTPClient(port: server.port)
        defer { client.close() }
        try client.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        await server.waitForHits("/held", atLeast: 1)

        server.shutdown()
        server.shutdown()

        #expect(server.openConnections == 0)
        #expect(server.heldCount() == 0)
        #expect(try client.readToEnd().isEmpty)  // the held response was never written
        #expect {
            _ = try RawHTTPClient(port: server.port)
        } throws: { error in
            (error as? RawHTTPClient.Failure)?.errno == ECONNREFUSED
        }
    }

    @Test func releasingLastReferenceShutsServerDown() async throws {
        var server: LoopbackHTTPServer? = try LoopbackHTTPServer()
        let reference = WeakReference(server)
        let port = try #require(server?.port)
        server = nil

        #expect(reference.object == nil)
        #expect {
            _ = try RawHTTPClient(port: port)
        } throws: { error in
            (error as? RawHTTPClient.Failure)?.errno == ECONNREFUSED
        }
    }

    @Test func heldResponseFromHandlerIsCountedBeforeWaitForHitsReturns() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/dynamic") { [weak server] request in
            // The request is already recorded when the handler runs.
            .ok("hits=\(server?.hits(request.path) ?? -1)").held()
        }

        let client = Task { try await fetch(server.url("/dynamic")) }
        await server.waitForHits("/dynamic", atLeast: 1)
        #expect(server.heldCount("/dynamic") == 1)
        #expect(server.heldCount("/dyn*") == 1)
        server.releaseHeld("/dyn*")
        #expect(server.heldCount() == 0)

        let (data, _) = try await client.value
        #expect(String(decoding: data, as: UTF8.self) == "hits=1")
    }

    @Test func urlEncodesPathAndKeepsQuery() throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        #expect(server.baseURL.absoluteString == "http://127.0.0.1:\(server.port)")
        #expect(server.url("/a?b=1").absoluteString == "http://127.0.0.1:\(server.port)/a?b=1")
        #expect(server.url("a").absoluteString == "http://127.0.0.1:\(server.port)/a")
        #expect(server.port > 0)
    }
}

// MARK: - URLSession helpers

private final class WeakReference<Object: AnyObject> {
    weak var object: Object?
    init(_ object: Object?) { self.object = object }
}

private func makeSession() -> URLSession {
    let configuration = URLSessionConfiguration.ephemeral
    configuration.timeoutIntervalForRequest = 30
    return URLSession(configuration: configuration)
}

/// One request through a real URLSession; a fresh session (so a fresh connection) unless given one.
private func fetch(
    _ url: URL, session: URLSession? = nil, method: String = "GET",
    headers: [String: String] = [:], body: Data? = nil
) async throws -> (Data, HTTPURLResponse) {
    let ownSession = session == nil ? makeSession() : nil
    defer { ownSession?.finishTasksAndInvalidate() }
    guard let activeSession = session ?? ownSession else { throw URLError(.unknown) }
    var request = URLRequest(url: url)
    request.httpMethod = method
    for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
    request.httpBody = body
    let (data, response) = try await activeSession.data(for: request)
    guard let http = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
    return (data, http)
}

// MARK: - Raw socket helpers

/// Raises this process's soft descriptor limit to at least `minimum` (bounded by the hard limit),
/// since common defaults (1024 on Linux, 256 on macOS) are below what 1000 connections need.
private func raiseOpenFileLimit(atLeast minimum: Int) throws {
    #if canImport(Glibc)
    let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    #else
    let resource = RLIMIT_NOFILE
    #endif
    var limit = rlimit()
    guard getrlimit(resource, &limit) == 0 else { throw RawHTTPClient.Failure(call: "getrlimit", errno: errno) }
    guard limit.rlim_cur < rlim_t(minimum) else { return }
    // macOS refuses soft limits above OPEN_MAX (10240) even when the hard limit is unlimited.
    limit.rlim_cur = min(limit.rlim_max, rlim_t(max(minimum, 10240)))
    guard setrlimit(resource, &limit) == 0 else { throw RawHTTPClient.Failure(call: "setrlimit", errno: errno) }
}

/// Runs blocking socket work on a Dispatch thread so it never blocks the cooperative pool.
private func onBackgroundThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async {
            continuation.resume(with: Result { try work() })
        }
    }
}

/// `transform(0..<count)` spread over `threads` threads; rethrows the first error.
private func concurrentMap<T: Sendable>(count: Int, threads: Int, _ transform: @Sendable (Int) throws -> T) throws -> [T] {
    let collector = ResultCollector<T>(count: count)
    let perThread = (count + threads - 1) / threads
    DispatchQueue.concurrentPerform(iterations: threads) { thread in
        for index in (thread * perThread)..<min(count, (thread + 1) * perThread) {
            do {
                collector.store(try transform(index), at: index)
            } catch {
                collector.fail(error)
                return
            }
        }
    }
    return try collector.results()
}

/// Results gathered from several threads. `@unchecked Sendable`: both stored vars are only
/// touched while holding `lock`.
private final class ResultCollector<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [T?]
    private var firstError: (any Error)?

    init(count: Int) { values = Array(repeating: nil, count: count) }

    func store(_ value: T, at index: Int) { lock.withLock { values[index] = value } }

    func fail(_ error: any Error) { lock.withLock { firstError = firstError ?? error } }

    func results() throws -> [T] {
        try lock.withLock {
            if let firstError { throw firstError }
            return values.compactMap { $0 }
        }
    }
}

private struct RawHTTPResponse: Sendable {
    var status: Int
    /// Lower-cased names.
    var headers: [String: String]
    var body: Data
}

/// A blocking HTTP/1.1 client on a plain POSIX socket (10 s receive timeout), for what URLSession
/// cannot do: many connections, pipelining, malformed requests, reading to EOF.
///
/// `@unchecked Sendable`: each test uses an instance from one thread at a time (handing it over
/// through `await`, which orders the accesses); the buffer is never touched concurrently.
private final class RawHTTPClient: @unchecked Sendable {
    struct Failure: Error {
        var call: String
        var errno: Int32
    }

    private var fd: Int32
    private var buffer: [UInt8] = []

    init(port: Int) throws {
        #if canImport(Glibc)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
        let fd = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Failure(call: "socket", errno: errno) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        #if canImport(Darwin)
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        var address = sockaddr_in()
        #if canImport(Darwin)
        address.sin_len = UInt8(MemoryLayout<sockaddr_in>.size)
        #endif
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        _ = inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            _ = posixClose(fd)
            throw Failure(call: "connect", errno: code)
        }
        self.fd = fd
    }

    func send(_ text: String) throws {
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            #if canImport(Darwin)
            let flags: Int32 = 0
            #else
            let flags = Int32(MSG_NOSIGNAL)
            #endif
            let sent = bytes.withUnsafeBytes { raw in
                posixSend(fd, raw.baseAddress! + offset, bytes.count - offset, flags)
            }
            if sent < 0 {
                if errno == EINTR { continue }
                throw Failure(call: "send", errno: errno)
            }
            offset += sent
        }
    }

    /// Reads more bytes into the buffer; false at EOF.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffer.append(contentsOf: chunk[0..<count])
                return true
            }
            if count == 0 { return false }
            if errno == EINTR { continue }
            throw Failure(call: "recv", errno: errno)
        }
    }

    /// Reads one response: status line, headers, and a `Content-Length` body (none for HEAD).
    func readResponse(isHEAD: Bool = false) throws -> RawHTTPResponse {
        let terminator: [UInt8] = Array("\r\n\r\n".utf8)
        var headEnd: Int?
        while headEnd == nil {
            headEnd = buffer.indices.dropLast(3).first { Array(buffer[$0..<($0 + 4)]) == terminator }
            if headEnd == nil, try !fill() { throw Failure(call: "readResponse (EOF in head)", errno: 0) }
        }
        let end = headEnd!
        let lines = String(decoding: buffer[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
        buffer.removeFirst(end + 4)
        let statusParts = lines[0].split(separator: " ")
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else {
            throw Failure(call: "readResponse (status line: \(lines[0]))", errno: 0)
        }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = (isHEAD || status < 200) ? 0 : Int(headers["content-length"] ?? "0") ?? 0
        while buffer.count < length {
            if try !fill() { throw Failure(call: "readResponse (EOF in body)", errno: 0) }
        }
        let body = Data(buffer[0..<length])
        buffer.removeFirst(length)
        return RawHTTPResponse(status: status, headers: headers, body: body)
    }

    /// The next `count` bytes (after a response's head), waiting for them; throws at EOF.
    func read(exactly count: Int) throws -> Data {
        while buffer.count < count {
            if try !fill() { throw Failure(call: "read (EOF after \(buffer.count) bytes)", errno: 0) }
        }
        defer { buffer.removeFirst(count) }
        return Data(buffer[0..<count])
    }

    /// Everything until the server closes the connection.
    func readToEnd() throws -> Data {
        while try fill() {}
        defer { buffer.removeAll() }
        return Data(buffer)
    }

    func close() {
        guard fd >= 0 else { return }
        _ = posixClose(fd)
        fd = -1
    }

    deinit { close() }
}

private func posixSend(_ fd: Int32, _ pointer: UnsafeRawPointer, _ count: Int, _ flags: Int32) -> Int {
    #if canImport(Darwin)
    Darwin.send(fd, pointer, count, flags)
    #elseif canImport(Glibc)
    Glibc.send(fd, pointer, count, flags)
    #else
    Musl.send(fd, pointer, count, flags)
    #endif
}

private func posixClose(_ fd: Int32) -> Int32 {
    #if canImport(Darwin)
    Darwin.close(fd)
    #elseif canImport(Glibc)
    Glibc.close(fd)
    #else
    Musl.close(fd)
    #endif
}
