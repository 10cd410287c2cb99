import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Retry
import ResilienceCore

/// For this package's own tests (package access): a fresh folder under the system temp directory,
/// removed when the value is deinitialised.
package final class TemporaryDirectory: Sendable {
    package let url: URL

    package init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-test-\(UUID().uuidString)", isDirectory: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    /// Names of files directly in the folder (no subfolders), sorted.
    package var fileNames: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []).filter { name in
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path, isDirectory: &isDirectory)
            return !isDirectory.boolValue
        }.sorted()
    }
}

/// For this package's own tests (package access): collects an async stream's elements and lets a
/// test wait for a number of them.
package final class StreamCollector<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        /// Tagged with the number of elements they wait for.
        var waiters = WaiterList<Void, Int>()
        var finished = false
    }

    private let state = Locked(State())
    private let task: Task<Void, Never>

    package init(_ stream: AsyncStream<Element>) {
        let state = self.state
        task = Task {
            for await item in stream {
                let ready = state.withLock { state in
                    state.items.append(item)
                    let count = state.items.count
                    return state.waiters.takeAll { $0 <= count }
                }
                for waiter in ready { waiter.resume(returning: ()) }
            }
            // The stream ended: nobody waits for more.
            let waiting = state.withLock { state in
                state.finished = true
                return state.waiters.takeAll()
            }
            for waiter in waiting { waiter.resume(returning: ()) }
        }
    }

    deinit { task.cancel() }

    /// The elements so far, in arrival order.
    package var items: [Element] { state.withLock { $0.items } }

    /// Suspends until `count` elements arrived, the stream ended, or the waiting task is cancelled.
    package func wait(for count: Int) async {
        await state.wait(on: \.waiters, tag: count, cancelled: ()) { state in
            state.items.count >= count || state.finished ? () : nil
        }
    }
}

/// A size-limited tmpfs mounted for one test (Linux, root only).
package struct SmallFileSystem {
    package let path: String

    /// Whether a tmpfs can be mounted here (tried once, on a scratch folder).
    package static let isAvailable: Bool = {
        let probe = TemporaryDirectory()
        guard (try? FileManager.default.createDirectory(at: probe.url, withIntermediateDirectories: true)) != nil,
              let mounted = SmallFileSystem(at: probe.url.path, kilobytes: 16) else { return false }
        mounted.unmount()
        return true
    }()

    package init?(at path: String, kilobytes: Int) {
        #if os(Linux)
        guard geteuid() == 0, mount("tmpfs", path, "tmpfs", 0, "size=\(kilobytes)k,mode=0700") == 0 else { return nil }
        self.path = path
        #else
        return nil
        #endif
    }

    /// Makes the file system read-only (or writable again); every write then fails with EROFS.
    package func remount(readOnly: Bool) -> Bool {
        #if os(Linux)
        let flags = UInt(MS_REMOUNT) | (readOnly ? UInt(MS_RDONLY) : 0)
        return mount("tmpfs", path, "tmpfs", flags, nil) == 0
        #else
        return false
        #endif
    }

    /// Fills the file system with one file until a write fails with ENOSPC; returns its path.
    package func fill() -> String {
        let filler = path + "/filler"
        let fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { return filler }
        let chunk = [UInt8](repeating: 0x20, count: 512)
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
        close(fd)
        return filler
    }

    package func unmount() {
        #if os(Linux)
        umount2(path, 2)  // MNT_DETACH
        #endif
    }
}

/// For this package's own tests (package access): runs exit tests (`#expect(processExitsWith:)`)
/// one at a time.
///
/// Swift Testing (6.3) waits for an exit test's child by reading its pipes synchronously on a
/// thread of the cooperative pool, for as long as the child lives: one thread for the child's back
/// channel, one more when its standard output is observed. A two-core machine has two such
/// threads, so two exit tests at once (or one that observes its output) stopped every other test
/// of the process for the children's lifetime — timeouts missed, requests never sent. One at a
/// time, never observing output (a child writes what the parent must read to a file instead),
/// holds one thread at most.
package enum ExitTests {
    private static let line = AdmissionGate(limit: 1)

    /// Runs `body`, which holds one exit test, after every exit test started earlier has ended.
    @discardableResult
    package static func oneAtATime<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await line.enter()
        defer { line.leave() }
        return try await body()
    }

    /// Appends `text` to the file at `path` with a single `write` (no buffering in this process):
    /// once it returns, a parent reads it even if this process is killed at once.
    package static func append(_ text: String, toFileAt path: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
