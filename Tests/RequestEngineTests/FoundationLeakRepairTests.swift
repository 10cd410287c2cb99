#if canImport(CURLHandleRepair)
import CURLHandleRepair
import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// corelibs-foundation releases the URL parts libcurl parsed for every transfer with `curl_free`,
/// which leaks them (Benchmarks/Repro/README.md). `URLSessionTransport.installFoundationLeakRepair()`
/// points FoundationNetworking's own entries at CURLHandleRepair's wrappers, which release them in
/// full; nothing installs it unasked.
/// Other suites send through URLSession meanwhile, so each test counts only the handles whose URL
/// has its own server's port (`curl_handle_repair_watch_port`); serialized, since one port is
/// watched at a time.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite(
    "The repair of URLSession's per-transfer leak on Linux",
    .serialized,
    .timeLimit(.minutes(5)),
    .enabled(if: curl_handle_repair_is_possible() == 1, "FoundationNetworking is linked statically: there is no entry to repair")
)
struct FoundationLeakRepairTests {
    @Test func eachTransferThroughTheTransportReleasesTheHandleFoundationWouldLeak() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        let transport = URLSessionTransport(configuration: .ephemeral)
        #expect(URLSessionTransport.installFoundationLeakRepair())
        #expect(curl_handle_repair_is_in_place() == 1)
        curl_handle_repair_watch_port(Int32(server.port))
        defer { curl_handle_repair_watch_port(0) }
        for _ in 0..<20 {
            let (body, response) = try await transport.data(for: URLRequest(url: server.url("/ok")))
            #expect((response as? HTTPURLResponse)?.statusCode == 200)
            #expect(body == Data("ok".utf8))
        }
        #expect(curl_handle_repair_watched_count() >= 20)
    }

    @Test func onceInstalledItAlsoCoversAPlainURLSession() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        #expect(URLSessionTransport.installFoundationLeakRepair())
        let session = URLSession(configuration: .ephemeral)
        defer { session.finishTasksAndInvalidate() }
        curl_handle_repair_watch_port(Int32(server.port))
        defer { curl_handle_repair_watch_port(0) }
        for _ in 0..<10 {
            let (_, response) = try await session.data(for: URLRequest(url: server.url("/ok")))
            #expect((response as? HTTPURLResponse)?.statusCode == 200)
        }
        #expect(curl_handle_repair_watched_count() >= 10)
    }

    /// A library adopted one layer at a time patches nothing in the process unless asked: a
    /// fresh process that makes transports (the shared one included) and sends through them
    /// leaves FoundationNetworking's entries as they were.
    @Test func makingAndUsingTransportsLeavesFoundationAsItWas() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        let url = server.url("/ok").absoluteString
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [url = url as String] in
                let request = URLRequest(url: try #require(URL(string: url)))
                _ = try await URLSessionTransport(configuration: .ephemeral).data(for: request)
                _ = try await URLSessionTransport.shared.data(for: request)
                _ = try await AsyncRequestEngine().send(TestRequest(url: try #require(URL(string: url))))
                #expect(curl_handle_repair_is_in_place() == 0)
            }
        }
    }
}
#endif
