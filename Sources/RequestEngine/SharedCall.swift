import Foundation
import Retry
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One network call shared by one or more waiting callers (single-flight).
///
/// The call runs in its own task. Each caller waits on a continuation, so a caller whose task is
/// cancelled is answered `.cancelled` at once, without waiting for the network, while the others
/// keep waiting. When the last waiter leaves, the call's task is cancelled.
///
/// Races this guards against:
/// - a waiter cancelled before its continuation is installed (cancellation handler runs first):
///   it is remembered in `cancelledEarly` and answered as soon as it installs;
/// - the last waiter leaving before the engine has attached the task: `attach` cancels it at once;
/// - a caller trying to join after the last waiter left or after completion: `join` refuses, and
///   the engine starts a fresh call instead of handing out a cancelled or stale result.
final class SharedCall: Sendable {
    typealias Outcome = Result<(Data, HTTPURLResponse), NetworkError>

    private struct State: Sendable {
        var nextWaiter = 0
        var activeWaiters = 0
        var continuations: [Int: CheckedContinuation<Outcome, Never>] = [:]
        var cancelledEarly: Set<Int> = []
        var outcome: Outcome?
        var task: Task<Void, Never>?
        var abandoned = false
    }

    private let state = Locked(State())

    /// Makes a call with its first waiter already registered (waiter id returned).
    static func started() -> (SharedCall, Int) {
        let call = SharedCall()
        let first = call.state.withLock { state in
            state.nextWaiter = 1
            state.activeWaiters = 1
            return 1
        }
        return (call, first)
    }

    /// Registers a waiter; `nil` when the call has completed or been abandoned.
    func join() -> Int? {
        state.withLock { state in
            guard state.outcome == nil, !state.abandoned else { return nil }
            state.nextWaiter += 1
            state.activeWaiters += 1
            return state.nextWaiter
        }
    }

    /// Hands over the task doing the work, cancelling it at once if everyone already left.
    func attach(_ task: Task<Void, Never>) {
        let cancelNow = state.withLock { state in
            state.task = task
            return state.abandoned
        }
        if cancelNow { task.cancel() }
    }

    /// Waits for the outcome as waiter `id`; returns `.cancelled` promptly if the caller is cancelled.
    func wait(_ id: Int) async -> Outcome {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Outcome, Never>) in
                let ready: Outcome? = state.withLock { state in
                    if let outcome = state.outcome { return outcome }
                    if state.cancelledEarly.remove(id) != nil { return .failure(.cancelled) }
                    state.continuations[id] = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            leave(id)
        }
    }

    /// Delivers the outcome to every waiter still waiting.
    func complete(_ outcome: Outcome) {
        let waiting = state.withLock { state -> [CheckedContinuation<Outcome, Never>] in
            guard state.outcome == nil else { return [] }
            state.outcome = outcome
            state.task = nil
            defer { state.continuations.removeAll() }
            return Array(state.continuations.values)
        }
        for continuation in waiting { continuation.resume(returning: outcome) }
    }

    private func leave(_ id: Int) {
        let (continuation, taskToCancel) = state.withLock { state -> (CheckedContinuation<Outcome, Never>?, Task<Void, Never>?) in
            guard state.outcome == nil else { return (nil, nil) }
            let continuation = state.continuations.removeValue(forKey: id)
            if continuation == nil { state.cancelledEarly.insert(id) }
            state.activeWaiters -= 1
            guard state.activeWaiters == 0 else { return (continuation, nil) }
            state.abandoned = true
            return (continuation, state.task)
        }
        continuation?.resume(returning: .failure(.cancelled))
        taskToCancel?.cancel()
    }
}
