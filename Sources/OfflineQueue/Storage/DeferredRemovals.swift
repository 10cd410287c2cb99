import Foundation
@_spi(ResilienceCore) import ResilienceCore

/// Deletes the files of entries whose work is done (delivered, failed for good, expired,
/// superseded) on a pool thread of lower priority (`BlockingIOPool.background`), so a replay
/// pass sends its next entry while the last one's `unlink` runs (about a third of the queue's own
/// CPU for a replayed entry on ext4).
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
/// Three rules keep a deletion from touching anything else:
/// - the store registers an entry's deletion (`remove(_:)`, `register(_:)`) under its own lock,
///   in the same step that takes the entry out of its index, so no later write of that id can
///   begin before the deletion is known here;
/// - a write of the same path first runs (or waits for) the deletion registered for it
///   (`settle(_:)`), and every deletion — the worker's, or one run by a caller (`runNow(_:)`,
///   `removeNow(_:)`) — is marked in progress while its `unlink` runs, so the deletion can never
///   remove the file written after it;
/// - the store runs every queued deletion before it gives up its folder (`finish()`), and a
///   replay pass before it returns, so a pass's delivered files are gone when `flush()` returns.
final class DeferredRemovals: Sendable {
    private struct State {
        /// Queued for the worker and not yet started.
        var pending: Set<String> = []
        /// Registered for a caller to run (`register`): the worker leaves them, so the caller
        /// learns whether its deletion worked (`runNow`).
        var reserved: Set<String> = []
        /// Being deleted now, by the worker or a caller.
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
    /// Signalled whenever deletions in progress end, for those waiting on one (`settle`, `finish`).
    private let ended = NSCondition()
    private let pool: BlockingIOPool

    /// Deletions a replay pass gathers before it wakes the pool thread. A process killed during a
    /// pass leaves up to this many delivered entries' files behind, plus those the thread has not
    /// got to yet, which the next open replays with their `Idempotency-Key`.
    static let batchSize = 16

    init(pool: BlockingIOPool = .background) {
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

    /// Queues `path` for deletion by the worker. A deletion that fails is kept and tried again by
    /// `finish()`; left for good, the next open would replay the file (with its `Idempotency-Key`).
    func remove(_ path: String) {
        let startWorker = state.withLock { state -> Bool in
            state.reserved.remove(path)  // registered for a caller, and now the worker's
            state.pending.insert(path)
            return state.shouldStartWorker()
        }
        if startWorker { pool.submit { [self] in work() } }
    }

    /// Registers `path`'s deletion without starting it: the caller runs it (`runNow`,
    /// `removeNow`), or a write of the path runs it first (`settle`), or `finish()` does.
    func register(_ path: String) {
        state.withLock { _ = $0.reserved.insert(path) }
    }

    /// Before `path` is written again: its registered deletion runs now, here, or — if another
    /// thread is deleting it — this waits for that. Cheap when `path` has none.
    func settle(_ path: String) {
        if let failure = take(path, onlyIfRegistered: true) { record(failure, for: path) }
        state.withLock { _ = $0.failed.removeValue(forKey: path) }  // the write replaces that file
    }

    /// Runs `path`'s registered deletion now, here (or waits for the thread deleting it); a
    /// failure is kept for `finish()` to try again. Nothing when a write of the path has run it
    /// already (`settle`): the file there now is that write's.
    func removeNow(_ path: String) {
        if let failure = take(path, onlyIfRegistered: true) { record(failure, for: path) }
    }

    /// `removeNow(_:)`, throwing the failure (which is then not kept: the caller keeps the entry
    /// instead).
    func runNow(_ path: String) throws(OfflineQueueError) {
        if let failure = take(path, onlyIfRegistered: true) { throw failure }
    }

    /// Deletes `path` now, registered or not, for a caller that knows no write of it can begin
    /// meanwhile: the one writing it (holding the id's turn), whose write does not stand, or the
    /// store's open. A failure is kept for `finish()` to try again.
    func deleteNow(_ path: String) {
        if let failure = take(path, onlyIfRegistered: false) { record(failure, for: path) }
    }

    /// Takes `path`'s registered deletion (`onlyIfRegistered: false`: a deletion of it, registered
    /// or not) and runs it, marked in progress, after any other thread's deletion of it has
    /// ended. Returns the failure, if any. Checking and claiming are one step under `ended`'s
    /// lock, and the worker claims under it too, so no deletion can start unseen in between.
    private func take(_ path: String, onlyIfRegistered: Bool) -> OfflineQueueError? {
        ended.lock()
        defer { ended.unlock() }
        while true {
            let step = state.withLock { state -> Bool? in
                if state.inProgress.contains(path) { return nil }  // wait for it
                let queued = state.pending.remove(path) != nil
                let reserved = state.reserved.remove(path) != nil
                let registered = queued || reserved
                guard registered || !onlyIfRegistered else { return false }
                state.inProgress.insert(path)
                return true
            }
            guard let mine = step else {
                ended.wait()
                continue
            }
            guard mine else { return nil }
            break
        }
        ended.unlock()
        let failure = delete(path)
        ended.lock()
        state.withLock { _ = $0.inProgress.remove(path) }
        ended.broadcast()
        return failure
    }

    private func delete(_ path: String) -> OfflineQueueError? {
        do {
            try DurableFiles.removeFile(path)
            return nil
        } catch {
            return error as? OfflineQueueError ?? .storage(operation: "unlink", path: path, errno: EIO)
        }
    }

    private func record(_ failure: OfflineQueueError, for path: String) {
        state.withLock { $0.failed[path] = failure }
    }

    /// Runs every queued deletion now, tries the failed ones again, and waits for every deletion in
    /// progress. Returns the error of a deletion that still fails, if any.
    @discardableResult
    func finish() -> OfflineQueueError? {
        let batch = state.withLock { state -> [String] in
            state.pending.formUnion(state.failed.keys)  // registered again, to be tried again
            state.failed.removeAll()
            return state.pending.union(state.reserved).sorted()
        }
        for path in batch { removeNow(path) }  // each unless a write or the worker took it first
        ended.lock()
        while state.withLock({ !$0.inProgress.isEmpty }) { ended.wait() }
        ended.unlock()
        return state.withLock { state in state.failed.sorted { $0.key < $1.key }.first?.value }
    }

    /// Deletions queued and not yet done (for tests).
    var outstanding: Int { state.withLock { $0.pending.count + $0.reserved.count + $0.inProgress.count } }

    private func work() {
        while true {
            ended.lock()
            let batch = state.withLock { state -> [String] in
                let batch = state.pending.subtracting(state.inProgress)
                state.pending.subtract(batch)
                state.inProgress.formUnion(batch)
                if batch.isEmpty { state.workerRunning = false }
                return batch.sorted()
            }
            ended.unlock()
            if batch.isEmpty { return }
            for path in batch {
                if let failure = delete(path) { record(failure, for: path) }
            }
            ended.lock()
            state.withLock { $0.inProgress.subtract(batch) }
            ended.broadcast()
            ended.unlock()
        }
    }
}
