import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Swift Testing (6.3) waits for an exit test's child by reading its pipes synchronously on a
/// thread of the cooperative pool, for as long as the child lives: one thread for the child's back
/// channel, one more when its standard output is observed. A two-core machine has two such
/// threads, so two exit tests at once (or one that observes its output) stopped every other test
/// of the process for the children's lifetime — timeouts missed, requests never sent. One at a
/// time, never observing output (a child writes what the parent must read to a file instead),
/// holds one thread at most.
///
/// The price is the wait: a test here waits for every exit test queued before it, over a minute
/// in a full run on two cores (CI once saw two tests of one-minute suites time out in this line).
/// A suite that holds an exit test therefore has a time limit of five minutes or more.
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
