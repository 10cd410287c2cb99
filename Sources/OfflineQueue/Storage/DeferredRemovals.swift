import Foundation
import ResilienceCore

/// Deletes the files of entries whose work is done (delivered, failed for good, expired,
/// superseded) on a pool thread, so a replay pass sends its next entry while the last one's
/// `unlink` runs (about a third of a replayed entry's CPU on ext4).
///
/// Why deferring is safe: those deletions were never durable (the folder is not fsynced after
/// an `unlink`), so a crash could already bring such a file back, to be replayed once more with
/// its `Idempotency-Key` (at-least-once). Deferring only widens that window; the store's index
/// forgot the entry before its removal is queued here, so this process never sees it again.
///
/// While a replay pass runs (`startBatching()` … `stopBatching()`), deletions go to the pool
/// thread `batchSize` at a time: waking that thread for each entry cost more than the `unlink`
/// itself (about four more context switches an entry; a replay of 10 000 entries took 1.24–1.39×
/// the direct sends that way, 1.06–1.12× batched). The pass finishes what is left when it ends.
/// Outside a pass every deletion starts at once, so a lone delivery's file does not linger.
/// Batching bounds how many deletions wait for the thread, not for how long: in a pass of slow
/// sends a delivered file may stay until 15 more are delivered or the pass ends.
///
/// Two rules keep a deferred deletion from touching anything else:
/// - a write of the same path first runs (or waits for) the deletion queued for it
///   (`settle(_:)`), so the deletion can never remove the file written after it;
/// - the store runs every queued deletion before it gives up its folder (`finish()`), and a
///   replay pass before it returns, so a pass's delivered files are gone when `flush()` returns.
final class DeferredRemovals: Sendable {
    private struct State {
        /// Queued and not yet started.
        var pending: Set<String> = []
        /// Taken by the worker and being deleted now (`removing` is held meanwhile).
        var inProgress: Set<String> = []
        var workerRunning = false
        /// Replay passes batching their deletions now (`startBatching()`).
        var batching = 0
        /// Deletions that failed (a full or read-only disk), with their error: `finish()` tries
        /// them again.
        var failed: [String: OfflineQueueError] = [:]

        /// Whether the caller is to start the worker (and it is marked running): there is work,
        /// none runs, and no pass is gathering a batch, or the batch is full.
        mutating func shouldStartWorker() -> Bool {
            guard !workerRunning, !pending.isEmpty, batching == 0 || pending.count >= DeferredRemovals.batchSize else { return false }
            workerRunning = true
            return true
        }
    }

    private let state = Locked(State())
    /// Held by whoever deletes a batch, so `settle` and `finish` can wait for one in progress.
    private let removing = NSLock()
    private let pool: BlockingIOPool

    /// Deletions a replay pass gathers before it wakes the pool thread. A process killed during a
    /// pass leaves up to this many delivered entries' files behind, plus those the thread has not
    /// got to yet, which the next open replays with their `Idempotency-Key`.
    static let batchSize = 16

    init(pool: BlockingIOPool = .shared) {
        self.pool = pool
    }

    /// From now until `stopBatching()`, deletions wait until `batchSize` of them are queued.
    func startBatching() {
        state.withLock { $0.batching += 1 }
    }

    /// Ends a `startBatching()`; deletions still queued start at once when no other pass batches.
    func stopBatching() {
        let startWorker = state.withLock { state -> Bool in
            precondition(state.batching > 0, "stopBatching() without its startBatching()")
            state.batching -= 1
            return state.shouldStartWorker()
        }
        if startWorker { pool.submit { [self] in work() } }
    }

    /// Queues `path` for deletion. A deletion that fails is kept and tried again by `finish()`;
    /// left for good, the next open would replay the file (with its `Idempotency-Key`).
    func remove(_ path: String) {
        let startWorker = state.withLock { state -> Bool in
            state.pending.insert(path)
            return state.shouldStartWorker()
        }
        if startWorker { pool.submit { [self] in work() } }
    }

    /// Before `path` is written again: its queued deletion runs now, here, or — if the worker has
    /// already taken it — this waits for the worker's batch to end. Cheap when `path` has none.
    func settle(_ path: String) {
        let (queued, taken) = state.withLock { state in
            (state.pending.remove(path) != nil, state.inProgress.contains(path))
        }
        if queued { delete(path) }
        if taken {
            removing.lock()
            removing.unlock()
        }
        state.withLock { _ = $0.failed.removeValue(forKey: path) }  // the write replaces that file
    }

    /// Deletes `path` now, here; a failure is kept for `finish()` to try again.
    func removeNow(_ path: String) {
        delete(path)
    }

    private func delete(_ path: String) {
        do {
            try DurableFiles.removeFile(path)
        } catch {
            let failure = error as? OfflineQueueError ?? .storage(operation: "unlink", path: path, errno: EIO)
            state.withLock { $0.failed[path] = failure }
        }
    }

    /// Runs every queued deletion now, tries the failed ones again, and waits for the worker's
    /// batch in progress. Returns the error of a deletion that still fails, if any.
    @discardableResult
    func finish() -> OfflineQueueError? {
        removing.lock()
        defer { removing.unlock() }
        let batch = state.withLock { state -> [String] in
            defer {
                state.pending.removeAll()
                state.failed.removeAll()
            }
            return (state.pending.union(state.failed.keys)).sorted()
        }
        for path in batch { delete(path) }
        return state.withLock { state in state.failed.sorted { $0.key < $1.key }.first?.value }
    }

    /// Deletions queued and not yet done (for tests).
    var outstanding: Int { state.withLock { $0.pending.count + $0.inProgress.count } }

    private func work() {
        while true {
            removing.lock()
            let batch = state.withLock { state -> Set<String> in
                state.inProgress = state.pending
                state.pending.removeAll()
                if state.inProgress.isEmpty { state.workerRunning = false }
                return state.inProgress
            }
            for path in batch.sorted() { delete(path) }
            state.withLock { $0.inProgress.removeAll() }
            removing.unlock()
            if batch.isEmpty { return }
        }
    }
}
