#if canImport(CURLHandleRepair)
import CURLHandleRepair
import Foundation
import ResilienceTesting
import Testing

@testable import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// corelibs-foundation releases the URL parts libcurl parsed for every transfer with `curl_free`,
/// which leaks them (Benchmarks/Repro/README.md). A `URLSessionTransport` points
/// FoundationNetworking's own entries at CURLHandleRepair's wrappers, which release them in full.
/// Other suites send through URLSession meanwhile, so each test counts only the handles whose URL
/// has its own server's port (`curl_handle_repair_watch_port`); serialized, since one port is
/// watched at a time.
@Suite(
    "The repair of URLSession's per-transfer leak on Linux",
    .serialized,
    .timeLimit(.minutes(1)),
    .enabled(if: curl_handle_repair_is_possible() == 1, "FoundationNetworking is linked statically: there is no entry to repair")
)
struct FoundationLeakRepairTests {
    @Test func eachTransferThroughTheTransportReleasesTheHandleFoundationWouldLeak() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        let transport = URLSessionTransport(configuration: .ephemeral)
        #expect(curl_handle_repair_is_in_place() == 1)  // installed by the transport (this only reads)
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
        _ = URLSessionTransport(configuration: .ephemeral)
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
}
#endif
