import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The two URLSession-based sessions the engine can use.
enum SessionKind: String, Sendable, CaseIterable, CustomTestStringConvertible {
    /// `URLSessionTransport`: sees the body while it arrives.
    case transport
    /// A plain `URLSession`: its body is collected by Foundation.
    case plainURLSession

    func make(_ configuration: URLSessionConfiguration = .ephemeral) -> any NetworkSession {
        switch self {
        case .transport: URLSessionTransport(configuration: configuration)
        case .plainURLSession: URLSession(configuration: configuration)
        }
    }

    var testDescription: String { rawValue }
}

/// Body limits, bodies cut short, upper-case schemes and mass cancellation, end-to-end through the
/// real URLSession to a real HTTP server on 127.0.0.1. "The server saw the connection close" is
/// how these tests know a transfer really stopped: the server counts the client's close.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("URLSessionTransport and URLSession against LoopbackHTTPServer", .timeLimit(.minutes(5)))
struct TransportIntegrationTests {
    let server: LoopbackHTTPServer
    let transport: URLSessionTransport

    init() throws {
        server = try LoopbackHTTPServer()
        transport = URLSessionTransport(configuration: .ephemeral)
    }

    // MARK: Body size limit

    @Test func anEndlessBodyStopsAtTheEnginesLimitAndIsNotRetried() async throws {
        // 16 KiB chunks, one per millisecond. Not "as fast as the client reads": on Linux every
        // URLSession of a process shares one work queue, and a flood there holds every other
        // test's requests (and this transfer's own cancel) until it stops (Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md).
        server.route("/endless", .endlessChunkedBody(chunk: Data(repeating: 0x65, count: 16 * 1024), interval: .milliseconds(1)))
        let engine = AsyncRequestEngine(session: transport, configuration: .init(retry: .init(policy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0)), maximumResponseBodySize: 256 * 1024))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/endless"))) }
        #expect(error?.caseName == "responseTooLarge(262144)")
        #expect(server.hits("/endless") == 1)
        await server.waitForOpenConnections(atMost: 0)  // the client closed it: the transfer stopped
    }

    @Test func anEndlessBodyStopsAtTheRequestsLimit() async throws {
        server.route("/ticks", .endlessChunkedBody(chunk: Data(repeating: 0x74, count: 4096), interval: .milliseconds(1)))
        let engine = AsyncRequestEngine(session: transport)  // 16 MiB: the request's 64 KiB replaces it
        var request = TestRequest(url: server.url("/ticks"))
        request.maximumResponseBodySize = 64 * 1024
        let error = await networkError { try await engine.send(request) }
        #expect(error?.caseName == "responseTooLarge(65536)")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func theDefaultEngineStopsAnEndlessBodyAt16MiB() async throws {
        server.route("/endless", .endlessChunkedBody(chunk: Data(repeating: 0x65, count: 64 * 1024), interval: .milliseconds(1)))
        let engine = AsyncRequestEngine()  // URLSessionTransport.shared, 16 MiB
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/endless"))) }
        #expect(error?.caseName == "responseTooLarge(16777216)")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aContentLengthOverTheLimitIsRejectedBeforeTheBodyIsRead() async throws {
        // The head announces 1 GB, 3 bytes follow, and the server keeps the connection open: a
        // client that waited for the body would wait for ever.
        server.route("/huge", LoopbackResponse(status: 200, headers: ["Content-Length": "1000000000"], body: Data("abc".utf8)))
        let engine = AsyncRequestEngine(session: transport, configuration: .init(maximumResponseBodySize: 1024 * 1024))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/huge"))) }
        #expect(error?.caseName == "responseTooLarge(1048576)")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test func aHEADResponsesContentLengthIsNotABody() async throws {
        server.route("/huge", LoopbackResponse(status: 200, headers: ["Content-Length": "1000000000"]))
        let engine = AsyncRequestEngine(session: transport, configuration: .init(maximumResponseBodySize: 1024))
        let (data, response) = try await engine.send(TestRequest(url: server.url("/huge"), method: .head))
        #expect(data.isEmpty)
        #expect(response.expectedContentLength == 1_000_000_000)
    }

    @Test(arguments: SessionKind.allCases)
    func aBodyWithinTheLimitArrivesWhole(kind: SessionKind) async throws {
        let payload = Data((0..<(3 * 1024 * 1024 + 17)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        server.route("/blob", LoopbackResponse(status: 200, body: payload))
        let engine = AsyncRequestEngine(session: kind.make(), configuration: .init(maximumResponseBodySize: payload.count))
        #expect(try await engine.send(TestRequest(url: server.url("/blob"))).0 == payload)
    }

    @Test func aPlainURLSessionChecksTheLimitOnceTheBodyHasArrived() async throws {
        server.route("/blob", LoopbackResponse(status: 200, body: Data(count: 64 * 1024)))
        let engine = AsyncRequestEngine(session: URLSession(configuration: .ephemeral), configuration: .init(maximumResponseBodySize: 1024))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/blob"))) }
        #expect(error?.caseName == "responseTooLarge(1024)")
    }

    @Test func redirectsAreFollowedByTheTransport() async throws {
        server.route("/old", .status(302, headers: ["Location": "/new"]))
        server.route("/new", .ok("moved here"))
        let (data, response) = try await AsyncRequestEngine(session: transport).send(TestRequest(url: server.url("/old")))
        #expect(String(decoding: data, as: UTF8.self) == "moved here")
        #expect(response.url?.path == "/new")
    }

    // MARK: Timeouts and cancellation stop the transfer

    /// A body sent as fast as the client reads it, with no size limit: the timeout answers the
    /// caller, and memory stays flat while the server pushes another 1.5 GiB (or until the
    /// connection closes, if the cancel lands first). With Foundation's own `data(for:)` the
    /// abandoned transfer grew by gigabytes. The bound is generous: what libcurl reads until the
    /// cancel lands waits in Foundation's delegate queue, and on a loaded two-core machine that
    /// was 223 MiB once (under 64 MiB alone).
    ///
    /// It does not wait for the connection to close: on Linux, a cancel waits its turn on
    /// corelibs-foundation's one shared work queue, and while a same-machine server keeps the
    /// socket full, libcurl's back-to-back reads hold that queue and the turn can take as long as
    /// the flood lasts (the child hung until its time limit in about half the runs beside the
    /// transport suites). Sources/RequestEngine/RequestEngine.docc/RequestEngineGuide.md says so; paced endless bodies (the tests below)
    /// and AsyncHTTPClientSession do see the connection close. In a child process of its own: such
    /// a flood holds every URLSession of its process, so it must not run beside other tests.
    @Test func aTimeoutDuringAFullSpeedEndlessBodyStopsMemoryGrowing() async throws {
        #if os(Linux)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let server = try LoopbackHTTPServer()
                server.route("/flood", .endlessChunkedBody(chunk: Data(repeating: 0x66, count: 64 * 1024)))
                let engine = AsyncRequestEngine(configuration: .init(maximumResponseBodySize: nil))
                let error = await networkError { try await engine.send(TestRequest(url: server.url("/flood"), timeout: 0.3)) }
                #expect(error?.caseName == "timedOut")
                // From here the peak counts afresh (writing 5 to clear_refs resets VmHWM).
                try "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
                let atAnswer = try #require(Self.memory("VmRSS"))
                let sentAtAnswer = server.bytesSent
                await server.waitForBytesSent(atLeast: sentAtAnswer + (1536 << 20), orOpenConnectionsAtMost: 0)
                let peak = try #require(Self.memory("VmHWM"))
                let flooded = (server.bytesSent - sentAtAnswer) >> 20
                #expect(peak - atAnswer < 512 << 20, "grew \((peak - atAnswer) >> 20) MiB while \(flooded) MiB more arrived after the timeout answered")
                server.shutdown()
            }
        }
        #endif
    }

    @Test(.enabled(if: TransportIntegrationTests.isLinux, "corelibs-foundation only"))
    func onLinuxTheTransportsSessionHasNoURLCacheAndTheCallersConfigurationIsLeftAlone() {
        let configuration = URLSessionConfiguration.default
        let cache = configuration.urlCache
        let transport = URLSessionTransport(configuration: configuration)
        #expect(transport.session.configuration.urlCache == nil)
        #expect(URLSessionTransport.shared.session.configuration.urlCache == nil)
        #expect(configuration.urlCache === cache)
    }

    /// 10 000 requests started and cancelled at once through a transport made from `.default`,
    /// then the transport released, in a child process. Two crashes lived here: with the session's
    /// `URLCache` (corelibs-foundation traps in `TaskRegistry` when a task is cancelled just after it
    /// starts: 1 run in 6 of 3 000 rounds), and at the release ("Session invalidated": a cancelled
    /// request's task made on a pool thread after the transport's deinit invalidated its session).
    /// Without either fix this failed 4 runs in 6.
    @Test(.enabled(if: TransportIntegrationTests.isLinux, "corelibs-foundation only"))
    func requestsCancelledAsTheyStartNeverCrashTheProcess() async throws {
        #if os(Linux)
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) {
                let server = try LoopbackHTTPServer()
                server.route("/x", .ok("x"))
                let transport = URLSessionTransport(configuration: .default)
                let request = URLRequest(url: server.url("/x"))
                for round in 0..<10_000 {
                    let task = Task { _ = try? await transport.data(for: request, maximumBodySize: nil) }
                    if round % 2 == 0 { await Task.yield() }
                    task.cancel()
                    await task.value
                }
                server.shutdown()
            }
        }
        #endif
    }

    /// A transport released while a cancelled request's task is still to be made (on Linux the
    /// make runs later, on a pool thread) must stay alive until it is made: its deinit invalidates
    /// the session, and `dataTask(with:)` on an invalidated session traps. The make is held here
    /// until the test has let go of the transport.
    @Test(.enabled(if: TransportIntegrationTests.isLinux, "the task is made on a pool thread on Linux only"))
    func aPendingTaskMakeKeepsItsTransportAlive() async throws {
        let entered = DispatchSemaphore(value: 0)
        let proceed = DispatchSemaphore(value: 0)
        var transport: URLSessionTransport? = URLSessionTransport(configuration: .ephemeral) { session, request in
            entered.signal()
            proceed.wait()  // on the pool's thread, never the cooperative pool's
            return session.dataTask(with: request)
        }
        weak let released = transport
        let request = URLRequest(url: server.url("/x"))
        let caller = Task { [transport] in try await transport?.data(for: request, maximumBodySize: nil) }
        await withCheckedContinuation { continuation in
            Thread {
                entered.wait(); continuation.resume()
            }.start()  // not a cooperative thread
        }
        caller.cancel()
        _ = await caller.result  // answered at once, the make still pending
        transport = nil
        #expect(released != nil)  // the pending make holds it
        proceed.signal()
    }

    static var isLinux: Bool {
        #if os(Linux)
        true
        #else
        false
        #endif
    }

    /// A figure from /proc/self/status ("VmRSS", "VmHWM"), in bytes.
    static func memory(_ field: String) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            return line.split(separator: " ").dropFirst().first.flatMap { Int($0) }.map { $0 * 1024 }
        }
        return nil
    }

    @Test func aTimeoutDuringAnEndlessTrickleEndsTheTransfer() async throws {
        server.route("/trickle", .endlessChunkedBody(chunk: Data("tick\n".utf8), interval: .milliseconds(5)))
        let engine = AsyncRequestEngine(session: transport, configuration: .init(maximumResponseBodySize: nil))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/trickle"), timeout: 0.3)) }
        #expect(error?.caseName == "timedOut")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test(arguments: SessionKind.allCases)
    func aCallerCancelledDuringAnEndlessBodyIsAnsweredAndTheTransferEnds(kind: SessionKind) async throws {
        server.route("/endless", .endlessChunkedBody(chunk: Data(repeating: 0x63, count: 1024), interval: .milliseconds(2)))
        let engine = AsyncRequestEngine(session: kind.make(), configuration: .init(maximumResponseBodySize: nil))
        let task = Task { await networkError { try await engine.send(TestRequest(url: server.url("/endless"))) } }
        await server.waitForHits("/endless", atLeast: 1)
        task.cancel()
        #expect(await task.value?.caseName == "cancelled")
        await server.waitForOpenConnections(atMost: 0)
    }

    @Test(arguments: SessionKind.allCases)
    func cancellingManyInFlightRequestsAnswersEveryCallerAndClosesEveryConnection(kind: SessionKind) async throws {
        let count = 200
        server.route("/held/*", LoopbackResponse.ok().held())
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = count
        let engine = AsyncRequestEngine(session: kind.make(configuration))
        let callers = (0..<count).map { index in
            Task { await networkError { try await engine.send(TestRequest(url: server.url("/held/\(index)"))) } }
        }
        await server.waitForHits("/held/*", atLeast: count)  // every request is on the wire, held
        for caller in callers { caller.cancel() }
        var answers: [String] = []
        for caller in callers { answers.append(await caller.value?.caseName ?? "success") }
        #expect(answers == Array(repeating: "cancelled", count: count))
        await server.waitForOpenConnections(atMost: 0)
        #expect(server.heldCount() == 0)
    }

    // MARK: Bodies cut short, schemes in upper case

    @Test(arguments: SessionKind.allCases)
    func aBodyShorterThanItsContentLengthIsARetriedConnectionLoss(kind: SessionKind) async throws {
        server.route("/short", [.partialBodyThenClose(body: Data(repeating: 0x78, count: 1000)), .ok("whole")])
        let engine = AsyncRequestEngine(session: kind.make(), retryPolicy: FixedIntervalRetryPolicy(maxRetries: 1, interval: 0))
        let (data, _) = try await engine.send(TestRequest(url: server.url("/short")))
        #expect(String(decoding: data, as: UTF8.self) == "whole")
        #expect(server.hits("/short") == 2)
    }

    @Test(arguments: SessionKind.allCases)
    func aChunkedBodyWithoutItsLastChunkIsAConnectionLoss(kind: SessionKind) async throws {
        server.route("/cut", .raw(Data("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".utf8)))
        let engine = AsyncRequestEngine(session: kind.make())
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/cut"))) }
        #expect(error?.caseName == "transport(connectionLost)")
    }

    // MARK: Redirect loops and oversized headers

    @Test(arguments: SessionKind.allCases)
    func aRedirectLoopIsTooManyRedirectsAndNotRetried(kind: SessionKind) async throws {
        server.route("/loop", .status(302, headers: ["Location": "/loop"]))
        let engine = AsyncRequestEngine(session: kind.make(), retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/loop"))) }
        #expect(error?.caseName == "tooManyRedirects")
        #expect(error?.isRetryable == false)
        let followed = server.hits("/loop")
        #expect(followed > 1 && followed <= 51)  // one attempt, followed round the loop to the transport's limit
    }

    @Test(.enabled(if: runsOnCorelibsFoundation, "libcurl's header limits; Apple's URLSession has its own"), arguments: SessionKind.allCases)
    func aHeaderLineLargerThanTheTransportAcceptsIsResponseHeadersTooLarge(kind: SessionKind) async throws {
        server.route("/huge-header", .status(200, headers: ["X-Huge": String(repeating: "a", count: 200_000)], body: "x"))
        let engine = AsyncRequestEngine(session: kind.make(), retryPolicy: FixedIntervalRetryPolicy(maxRetries: 2, interval: 0))
        let error = await networkError { try await engine.send(TestRequest(url: server.url("/huge-header"))) }
        #expect(error?.caseName == "responseHeadersTooLarge")
        #expect(server.hits("/huge-header") == 1)  // not retried
    }

    @Test(.enabled(if: runsOnCorelibsFoundation, "libcurl's header limits; Apple's URLSession has its own"), arguments: SessionKind.allCases)
    func aHeaderBlockLargerThanTheTransportAcceptsIsResponseHeadersTooLarge(kind: SessionKind) async throws {
        let headers = Dictionary(uniqueKeysWithValues: (0..<7_000).map { ("X-Header-\($0)", String(repeating: "b", count: 40)) })
        server.route("/many-headers", .status(200, headers: headers, body: "x"))
        let error = await networkError { try await AsyncRequestEngine(session: kind.make()).send(TestRequest(url: server.url("/many-headers"))) }
        #expect(error?.caseName == "responseHeadersTooLarge")
    }

    @Test(arguments: SessionKind.allCases)
    func anUpperCaseSchemeReachesTheServer(kind: SessionKind) async throws {
        server.route("/upper", .ok("found"))
        let url = try #require(URL(string: "HTTP://127.0.0.1:\(server.port)/upper"))
        let (data, response) = try await AsyncRequestEngine(session: kind.make()).send(TestRequest(url: url))
        #expect(String(decoding: data, as: UTF8.self) == "found")
        #expect(response.statusCode == 200)
        #expect(server.hits("/upper") == 1)
    }
}
