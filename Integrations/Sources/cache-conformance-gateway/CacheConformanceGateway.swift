// Puts `CachedRequestEngine` in front of an HTTP origin so that an HTTP-caching conformance suite
// can measure it the way it measures proxies: the suite's client talks HTTP/1.1 to this gateway on
// 127.0.0.1, the gateway answers every request with what the engine answers (its default mode and
// stale time, no retries), and the engine's own requests go to the origin over AsyncHTTPClient
// with redirects and decompression off, so the cache sees every status and every byte itself.
//
//   cache-conformance-gateway --upstream http://127.0.0.1:8000 --port 8001 [--cache-dir PATH]
//
// Without --cache-dir the responses are stored in a new folder under the temporary directory.
// Integrations/Scripts/cache-conformance.sh runs the whole measurement and prints the summary.

import AsyncHTTPClient
import Foundation
import Reachability
import RequestEngine
import ResilienceAsyncHTTPClient
import ResponseCache

@main
struct CacheConformanceGateway {
    static func main() async {
        let arguments: GatewayArguments
        do {
            arguments = try GatewayArguments(parsing: CommandLine.arguments.dropFirst())
        } catch {
            printError("\(error)\n\(GatewayArguments.usage)")
            exit(64)
        }

        var configuration = AsyncHTTPClientSession.recommendedConfiguration
        configuration.redirectConfiguration = .disallow  // a cache must see a 3xx itself
        configuration.decompression = .disabled  // and the bytes the origin sent
        // The suite runs 50 tests at once; a small pool would queue them and age their responses.
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 64
        // Node's server closes a connection idle for 5 s; reusing one it is closing would fail the
        // request (the engine does not retry here), so idle connections are dropped well before.
        configuration.connectionPool.idleTimeout = .seconds(2)
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)

        do {
            let folder =
                arguments.cacheDirectory
                ?? FileManager.default.temporaryDirectory.appendingPathComponent("cache-conformance-\(UUID().uuidString)")
            // One user, as a browser profile is: requests with cookies or credentials are cached
            // under this partition, as an app with a signed-in user configures it.
            let engine = CachedRequestEngine(
                requestEngine: AsyncRequestEngine(session: AsyncHTTPClientSession(client: client)),
                cache: try DiskResponseCache(directory: folder, maxBytes: 256 << 20),
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
                configuration: .init(partition: "conformance-user")
            )
            let gateway = CacheGateway(upstream: arguments.upstream, engine: engine)
            try await gateway.run(host: "127.0.0.1", port: arguments.port) { port in
                // Unbuffered, so a script waiting for this line sees it at once.
                let line = "cache-conformance-gateway: listening on http://127.0.0.1:\(port)/, cache in \(folder.path)\n"
                FileHandle.standardOutput.write(Data(line.utf8))
            }
        } catch {
            printError("cache-conformance-gateway: \(error)")
        }
        try? await client.shutdown()
        exit(1)
    }

    private static func printError(_ message: String) {
        FileHandle.standardError.write(Data((message + "\n").utf8))
    }
}

/// The command line: where the origin is, which port to serve, where to keep the cache.
struct GatewayArguments {
    static let usage = "usage: cache-conformance-gateway --upstream http://HOST:PORT --port N [--cache-dir PATH]"

    enum Failure: Error, CustomStringConvertible {
        case missing(flag: String)
        case invalid(flag: String, value: String)
        case unknown(argument: String)

        var description: String {
            switch self {
            case .missing(let flag): return "\(flag) is required"
            case .invalid(let flag, let value): return "\(flag) does not take '\(value)'"
            case .unknown(let argument): return "unknown argument '\(argument)'"
            }
        }
    }

    /// The origin's `http` URL, without a path: request targets are appended to it.
    let upstream: URL
    let port: Int
    let cacheDirectory: URL?

    init(parsing arguments: some Sequence<String>) throws(Failure) {
        var values: [String: String] = [:]
        var iterator = arguments.makeIterator()
        while let flag = iterator.next() {
            guard ["--upstream", "--port", "--cache-dir"].contains(flag) else { throw .unknown(argument: flag) }
            guard let value = iterator.next() else { throw .missing(flag: flag) }
            values[flag] = value
        }
        guard let upstreamText = values["--upstream"] else { throw .missing(flag: "--upstream") }
        let trimmed = upstreamText.hasSuffix("/") ? String(upstreamText.dropLast()) : upstreamText
        guard let upstream = URL(string: trimmed), upstream.scheme == "http", upstream.host != nil, upstream.path.isEmpty else {
            throw .invalid(flag: "--upstream", value: upstreamText)
        }
        guard let portText = values["--port"] else { throw .missing(flag: "--port") }
        guard let port = Int(portText), (0...65_535).contains(port) else { throw .invalid(flag: "--port", value: portText) }
        self.upstream = upstream
        self.port = port
        self.cacheDirectory = values["--cache-dir"].map { URL(fileURLWithPath: $0, isDirectory: true) }
    }
}
