import Foundation
import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

#if canImport(Glibc)
import Glibc
#endif

@Suite("BlockingIOPool: threads for work that blocks")
struct BlockingIOPoolTests {
    @Test func aPoolRunsItsJobsAndReturnsTheirResults() async throws {
        let pool = BlockingIOPool(maxThreads: 2, name: "test.pool")
        let results = try await withThrowingTaskGroup(of: Int.self) { group in
            for n in 0..<8 { group.addTask { try await pool.run { n * n } } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.sorted() == (0..<8).map { $0 * $0 })
    }

    #if os(Linux)
    /// The deletions of delivered entries run on `background`, whose threads run at `nice` 10, so
    /// they take a busy CPU from a replay's request threads only when those leave some; the
    /// caller's thread and the shared pool's keep their priority.
    @Test func backgroundThreadsRunAtALowerPriorityThanTheCallersAndTheSharedPools() async throws {
        @Sendable func nice() -> Int32 {
            errno = 0
            return getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        }
        let mine = nice()
        let background = try await BlockingIOPool(maxThreads: 1, name: "test.background", yieldsToOtherWork: true).run { nice() }
        let shared = try await BlockingIOPool.shared.run { nice() }
        #expect(background == min(mine + 10, 19))
        #expect(shared == mine)
        #expect(nice() == mine)
    }
    #endif
}
