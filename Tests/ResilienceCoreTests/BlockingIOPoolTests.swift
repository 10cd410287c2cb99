import Dispatch
import Foundation
import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
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
    /// The calling thread's nice value.
    private static func nice() -> Int32 {
        #if canImport(Glibc)
        return getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        #else
        return getpriority(PRIO_PROCESS, 0)
        #endif
    }

    /// What `job` returns on one of `pool`'s threads. Waited for with a semaphore, on purpose not
    /// with a continuation: one resumed from a lower-priority thread could make libdispatch start a
    /// worker there, which would inherit its priority (why `run` refuses such a pool).
    private static func onAThreadOf(_ pool: BlockingIOPool, _ job: @escaping @Sendable () -> Int32) -> Int32 {
        let done = DispatchSemaphore(value: 0)
        let result = Locked<Int32>(0)
        pool.submit {
            let value = job()
            result.withLock { $0 = value }
            done.signal()
        }
        done.wait()
        return result.withLock { $0 }
    }

    /// The deletions of delivered entries run on `background`-like pools, whose threads run 10
    /// nice steps below the process (at most 19), so they take a busy CPU from a replay's request
    /// threads only when those leave some; the caller's thread and the shared pool's keep theirs.
    @Test func lowerPriorityPoolThreadsRunTenNiceStepsBelowTheCallerAndTheSharedPoolsDoNot() {
        let mine = Self.nice()
        let lower = Self.onAThreadOf(BlockingIOPool(maxThreads: 1, name: "test.background", yieldsToOtherWork: true)) { Self.nice() }
        let shared = Self.onAThreadOf(BlockingIOPool(maxThreads: 1, name: "test.normal")) { Self.nice() }
        #expect(lower == min(mine + 10, 19))
        #expect(shared == mine)
        #expect(Self.nice() == mine)
    }
    #endif
}
