import AsyncHTTPClient
import Foundation
import NIOCore
import NIOPosix
import RequestEngine
import ResilienceAsyncHTTPClient

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

// Issue 26's overload benchmark: the engine over AsyncHTTPClient in front of an upstream of known
// capacity in its own process, under open-loop Poisson load at 0.5x, 1x, 2x and 4x that capacity
// and through a halving of it, with no limit, static limits (a sweep), and the adaptive limits at
// their defaults. README.md, "Adaptive limits under overload", has the figures and how to plot them.
//
//   swift run -c release overload-benchmark [--quick] [--out DIR] [--seed N]
//   swift run -c release overload-benchmark upstream --workers N --service-ms S --queue-ms Q

let arguments = Array(CommandLine.arguments.dropFirst())

func value(of flag: String, in arguments: [String]) -> String? {
    guard let index = arguments.firstIndex(of: flag), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}

if arguments.first == "upstream" {
    let workers = Int(value(of: "--workers", in: arguments) ?? "") ?? 10
    let serviceMilliseconds = Int64(value(of: "--service-ms", in: arguments) ?? "") ?? 25
    let queueMilliseconds = Int64(value(of: "--queue-ms", in: arguments) ?? "") ?? 100
    try Upstream.run(workers: workers, serviceTime: .milliseconds(serviceMilliseconds), queueTime: .milliseconds(queueMilliseconds))
    exit(0)
}

let quick = arguments.contains("--quick")
let outputFolder = URL(fileURLWithPath: value(of: "--out", in: arguments) ?? "overload-results", isDirectory: true)
let seed = UInt64(value(of: "--seed", in: arguments) ?? "") ?? 26
let plan = BenchmarkPlan(quick: quick)
try FileManager.default.createDirectory(at: outputFolder, withIntermediateDirectories: true)

// The upstream, in its own process.
let upstreamProcess = Process()
upstreamProcess.executableURL = Bundle.main.executableURL
upstreamProcess.arguments = [
    "upstream", "--workers", String(plan.workers),
    "--service-ms", String(plan.serviceMilliseconds), "--queue-ms", String(plan.queueMilliseconds),
]
let upstreamOutput = Pipe()
let upstreamInput = Pipe()
upstreamProcess.standardOutput = upstreamOutput
upstreamProcess.standardInput = upstreamInput
try upstreamProcess.run()
var firstLine = Data()
while !firstLine.contains(UInt8(ascii: "\n")) {
    let chunk = upstreamOutput.fileHandleForReading.availableData
    if chunk.isEmpty { break }
    firstLine.append(chunk)
}
let portLine = String(decoding: firstLine, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
guard portLine.hasPrefix("PORT "), let port = Int(portLine.dropFirst(5)), port > 0 else {
    upstreamProcess.terminate()
    throw OverloadBenchmarkFailure.upstreamDidNotStart(portLine)
}
let upstream = URL(string: "http://127.0.0.1:\(port)")!

// The client: AHC as AsyncHTTPClientSession recommends it, with a pool large enough that "no
// limit" means none (AHC's default of 8 connections per host would be a static limit of its own).
let clientGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
var clientConfiguration = AsyncHTTPClientSession.recommendedConfiguration
clientConfiguration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 4_096
let client = HTTPClient(eventLoopGroup: clientGroup, configuration: clientConfiguration)
let session = AsyncHTTPClientSession(client: client)

let report = try await plan.run(upstream: upstream, session: session, seed: seed, outputFolder: outputFolder)
print(report)
try Data(report.utf8).write(to: outputFolder.appendingPathComponent("report.md"))

try await client.shutdown() as Void
try await clientGroup.shutdownGracefully()
upstreamInput.fileHandleForWriting.closeFile()
upstreamProcess.terminate()
upstreamProcess.waitUntilExit()
