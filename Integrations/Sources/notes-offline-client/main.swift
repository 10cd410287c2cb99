import Foundation
import NotesAPI
import OfflineQueue
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceOpenAPI

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// A notes app's process for the relaunch test (GeneratedClientTests): `enqueue` stores a
// `createNote` while offline, says `QUEUED <id>` and dies by SIGKILL (nothing closed, nothing
// flushed: what the queue kept is only what it made durable before answering); `drain`, the app
// relaunched online, replays the queue and says `DRAINED <delivered> REMAINING <pending>`.
//
//   notes-offline-client enqueue <queue folder> <server URL> <text>
//   notes-offline-client drain <queue folder> <server URL>

/// Writes `line` to standard output at once (a file, for the test: `print` would hold it back).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

let arguments = CommandLine.arguments.dropFirst()
guard arguments.count >= 3, let serverURL = URL(string: arguments[arguments.startIndex + 2]) else {
    FileHandle.standardError.write(Data("usage: notes-offline-client enqueue|drain <queue folder> <server URL> [text]\n".utf8))
    exit(2)
}
let mode = arguments[arguments.startIndex]
let folder = URL(fileURLWithPath: arguments[arguments.startIndex + 1])
let online = mode == "drain"
let queue = try OfflineQueueEngine(
    requestEngine: AsyncRequestEngine(session: AsyncHTTPClientSession()),
    reachabilityMonitor: ManualReachabilityMonitor(isConnected: online),
    store: DiskQueueStore(directory: folder)
)
switch mode {
case "enqueue":
    let text = arguments.dropFirst(3).joined(separator: " ")
    let offline = OfflineOperations(queue: queue) { Client(serverURL: serverURL, transport: $0) }
    let result = try await offline.enqueue { _ = try await $0.createNote(body: .json(.init(text: text))) }
    say("QUEUED \(result.queuedID?.uuidString ?? "none")")
    kill(getpid(), SIGKILL)
case "drain":
    let report = await queue.flush()
    say("DRAINED \(report.delivered.count) REMAINING \(await queue.pendingCount())")
    await queue.close()
default:
    FileHandle.standardError.write(Data("unknown mode \(mode)\n".utf8))
    exit(2)
}
