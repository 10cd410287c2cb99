import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// One network exchange per key at a time, shared by every reader that asks while it runs (so a
/// thousand readers of one stale key cause one revalidation). The exchange runs in its own task and
/// always finishes — it updates the cache for the next reader — while a reader whose task is
/// cancelled is answered `.cancelled` at once.
final class SharedFetches: Sendable {
    typealias Exchange = CachedRequestEngine.Exchange

    private struct State: Sendable {
        /// Keys with an exchange running.
        var flights: Set<CacheDigest> = []
        /// Readers of a running exchange, tagged with its key: resumed with its result, or
        /// `.failed(.cancelled)` when the reader is cancelled.
        var readers = WaiterList<Exchange, CacheDigest>()
        var idleWatchers = WaiterList<Void, Void>()
    }

    private let state = Locked(State())

    /// Joins the exchange running for `key`, or starts `work` as it; returns its result.
    func run(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) async -> Exchange {
        let (ticket, start) = state.withLock { state in
            (state.readers.issue(key), state.flights.insert(key).inserted)
        }
        if start { launch(key, work) }
        return await suspendCancellably { continuation in
            state.withLock { state -> Exchange? in
                if let result = state.readers.claim(ticket) { return result }
                state.readers.park(ticket, continuation)
                return nil
            }
        } onCancel: {
            let cancelled = Exchange.failed(NetworkError.cancelled)
            state.withLock { $0.readers.cancel(ticket, with: cancelled) }?.resume(returning: cancelled)
        }
    }

    /// Starts `work` for `key` unless an exchange for it is already running; nobody waits for it.
    func startInBackground(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) {
        if state.withLock({ $0.flights.insert(key).inserted }) { launch(key, work) }
    }

    /// Returns once no exchange is running, or the waiting task is cancelled.
    func waitUntilIdle() async {
        await state.wait(on: \.idleWatchers, tag: (), cancelled: ()) { $0.flights.isEmpty ? () : nil }
    }

    /// Readers joined or waiting on `key` (for tests).
    func readers(_ key: CacheDigest) -> Int {
        state.withLock { state in state.readers.tags.count { $0 == key } }
    }

    private func launch(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) {
        Task {
            let result = await work()
            let (readers, idle) = state.withLock { state in
                state.flights.remove(key)
                // Readers on their way to suspend are handed the result and take it as they do.
                let readers = state.readers.resumeAll(where: { $0 == key }, with: result)
                return (readers, state.flights.isEmpty ? state.idleWatchers.takeAll() : [])
            }
            for reader in readers { reader.resume(returning: result) }
            for watcher in idle { watcher.resume(returning: ()) }
        }
    }
}
