import Foundation
import RequestEngine
import Retry
import ResilienceCore

/// One network exchange per key at a time, shared by every reader that asks while it runs (so a
/// thousand readers of one stale key cause one revalidation). The exchange runs in its own task and
/// always finishes — it updates the cache for the next reader — while a reader whose task is
/// cancelled is answered `.cancelled` at once.
final class SharedFetches: Sendable {
    typealias Exchange = CachedRequestEngine.Exchange

    private struct Flight: Sendable {
        /// Readers suspended on the result.
        var waiting: [UInt64: CheckedContinuation<Exchange, Never>] = [:]
        /// Readers that joined but have not suspended yet.
        var joining: Set<UInt64> = []
    }

    private struct State: Sendable {
        var flights: [CacheDigest: Flight] = [:]
        var nextID: UInt64 = 0
        /// Results for readers that joined a flight which ended before they suspended.
        var parked: [UInt64: Exchange] = [:]
        /// Readers cancelled before they suspended.
        var cancelledEarly: Set<UInt64> = []
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Locked(State())

    /// Joins the exchange running for `key`, or starts `work` as it; returns its result.
    func run(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) async -> Exchange {
        let (id, start) = state.withLock { state -> (UInt64, Bool) in
            state.nextID += 1
            let start = state.flights[key] == nil
            state.flights[key, default: Flight()].joining.insert(state.nextID)
            return (state.nextID, start)
        }
        if start { launch(key, work) }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Exchange, Never>) in
                let ready = state.withLock { state -> Exchange? in
                    if let result = state.parked.removeValue(forKey: id) { return result }
                    if state.cancelledEarly.remove(id) != nil { return .failed(NetworkError.cancelled) }
                    state.flights[key]?.joining.remove(id)
                    state.flights[key]?.waiting[id] = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Exchange, Never>? in
                if let continuation = state.flights[key]?.waiting.removeValue(forKey: id) { return continuation }
                if state.flights[key]?.joining.remove(id) != nil { state.cancelledEarly.insert(id) }
                return nil
            }
            continuation?.resume(returning: .failed(NetworkError.cancelled))
        }
    }

    /// Starts `work` for `key` unless an exchange for it is already running; nobody waits for it.
    func startInBackground(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) {
        let start = state.withLock { state -> Bool in
            guard state.flights[key] == nil else { return false }
            state.flights[key] = Flight()
            return true
        }
        if start { launch(key, work) }
    }

    /// Returns once no exchange is running.
    func waitUntilIdle() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { state -> Bool in
                guard state.flights.isEmpty else {
                    state.idleWaiters.append(continuation)
                    return false
                }
                return true
            }
            if idle { continuation.resume() }
        }
    }

    /// Readers joined or waiting on `key` (for tests).
    func readers(_ key: CacheDigest) -> Int {
        state.withLock { state in state.flights[key].map { $0.waiting.count + $0.joining.count } ?? 0 }
    }

    private func launch(_ key: CacheDigest, _ work: @escaping @Sendable () async -> Exchange) {
        Task {
            let result = await work()
            let (waiting, idle) = state.withLock { state -> ([CheckedContinuation<Exchange, Never>], [CheckedContinuation<Void, Never>]) in
                guard let flight = state.flights.removeValue(forKey: key) else { return ([], []) }
                for id in flight.joining { state.parked[id] = result }
                var idle: [CheckedContinuation<Void, Never>] = []
                if state.flights.isEmpty {
                    idle = state.idleWaiters
                    state.idleWaiters = []
                }
                return (Array(flight.waiting.values), idle)
            }
            for continuation in waiting { continuation.resume(returning: result) }
            for continuation in idle { continuation.resume() }
        }
    }
}
