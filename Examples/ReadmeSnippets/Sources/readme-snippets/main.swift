import Foundation
import ReadmeSnippets
import ResilienceTesting

// Runs the README snippets against a real HTTP server on 127.0.0.1 and checks what they observe.
let server = try LoopbackHTTPServer()
defer { server.shutdown() }
var failures = 0
@MainActor func check(_ name: String, _ condition: Bool, _ detail: String) {
    print("\(condition ? "PASS" : "FAIL")  \(name): \(detail)")
    if !condition { failures += 1 }
}

server.route("/ok", .ok("hello"))
let ok = await Snippets.fetch(server.url("/ok"))
check("200 returns data", ok == .ok(status: 200, bytes: 5), "\(ok)")

server.route("/flaky", [.status(503), .status(503), .ok("third")])
let flaky = await Snippets.fetch(server.url("/flaky"), baseDelay: 0.01)
check("503 → 503 → 200 is retried", flaky == .ok(status: 200, bytes: 5) && server.hits("/flaky") == 3, "\(flaky), \(server.hits("/flaky")) calls")

server.route("/missing", .status(404))
let missing = await Snippets.fetch(server.url("/missing"))
check("404 is thrown as httpError without retry", missing == .httpError(statusCode: 404) && server.hits("/missing") == 1, "\(missing)")

let guarded = await Snippets.fetchGuarded(server.url("/ok"))
check("the engine with deadline, hedging, per-host breakers and limit answers", guarded == .ok(status: 200, bytes: 5), "\(guarded)")

let service = await Snippets.fetchAsAService(server.url("/ok"))
check("the service engine with adaptive limits and retry throttling answers", service == .ok(status: 200, bytes: 5), "\(service)")

let sink = ConsoleSink()
let observed = await Snippets.fetchObserved(server.url("/ok"), sink: sink)
let seen = await sink.seen
check("eventSink sees started → succeeded", observed == .ok(status: 200, bytes: 5) && seen.count == 2
      && seen[0].hasPrefix("started") && seen[1].hasPrefix("succeeded"), "\(seen.count) events")

server.route("/shared", LoopbackResponse.ok("shared").held())
let dedupSink = ConsoleSink()
let sharedURL = server.url("/shared")
let storm = Task { await Snippets.fetchConcurrently(sharedURL, callers: 50, sink: dedupSink) }
await server.waitForHits("/shared", atLeast: 1)
while await dedupSink.seen.filter({ $0.hasPrefix("deduplicated") }).count < 49 { await Task.yield() }
server.releaseHeld("/shared")
let shared = await storm.value
check("50 concurrent identical GETs share one call", shared.allSatisfy { $0 == .ok(status: 200, bytes: 6) } && server.hits("/shared") == 1,
      "\(server.hits("/shared")) upstream call(s)")

// SwiftResilience's published README and public API, built against the `Resilience` product. The
// default queue folder goes to a scratch data folder, not into the user's home.
let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("readme-snippets-\(UUID().uuidString)", isDirectory: true)
setenv("XDG_DATA_HOME", scratch.path, 1)
await runPublishedChecks(server, scratch: scratch)
await runOfflineReadsChecks(server, scratch: scratch)
try? FileManager.default.removeItem(at: scratch)

print(failures == 0 ? "all snippet checks passed" : "\(failures) snippet check(s) failed")
exit(failures == 0 ? 0 : 1)
