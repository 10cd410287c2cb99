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
/// FoundationNetworking's two entries at CURLHandleRepair's wrappers, which release them in full.
/// Only a transport installs the repair, so a count that grows shows the transport installed it.
/// The count is process-wide and other suites send meanwhile, so each test asks for at least its
/// own transfers' handles, never an exact figure.
@Suite("The repair of URLSession's per-transfer leak on Linux", .timeLimit(.minutes(1)))
struct FoundationLeakRepairTests {
    @Test func eachTransferThroughTheTransportReleasesTheHandleFoundationWouldLeak() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        let transport = URLSessionTransport(configuration: .ephemeral)
        let before = curl_handle_repair_released_count()
        for _ in 0..<20 {
            let (body, response) = try await transport.data(for: URLRequest(url: server.url("/ok")))
            #expect((response as? HTTPURLResponse)?.statusCode == 200)
            #expect(body == Data("ok".utf8))
        }
        #expect(curl_handle_repair_released_count() - before >= 20)
    }

    @Test func onceInstalledItAlsoCoversAPlainURLSession() async throws {
        let server = try LoopbackHTTPServer()
        server.route("/ok", LoopbackResponse(status: 200, body: Data("ok".utf8)))
        _ = URLSessionTransport(configuration: .ephemeral)
        let session = URLSession(configuration: .ephemeral)
        defer { session.finishTasksAndInvalidate() }
        let before = curl_handle_repair_released_count()
        for _ in 0..<10 {
            let (_, response) = try await session.data(for: URLRequest(url: server.url("/ok")))
            #expect((response as? HTTPURLResponse)?.statusCode == 200)
        }
        #expect(curl_handle_repair_released_count() - before >= 10)
    }
}
#endif
