import Foundation
import Logging
import Resilience
import ResilienceTesting

// Runs the snippet's `Upstream` once against a loopback server, so CI sees it work, not only compile.
let logger = Logger(label: "integrations-example")
let server = try LoopbackHTTPServer()
server.route("/profiles/*", .json(#"{"name":"Ada"}"#))
let upstream = Upstream(logger: logger)
struct Local: NetworkRequest {
    let url: URL
    var method: HTTPMethod { .get }
}
let (data, response) = try await upstream.client.send(Local(url: server.url("/profiles/42")))
print("integrations-example: HTTP \(response.statusCode), \(String(decoding: data, as: UTF8.self))")
_ = Profile(id: 42).url
server.shutdown()
try await runOutboxRecipe(logger: logger)
