import Foundation
import ResilienceTesting
import Synchronization

/// The benchmark's origin: a `LoopbackHTTPServer` answering 201 to `/effects/*`, counting each
/// `Idempotency-Key`'s first request as an effect and later ones as duplicates, and waking a waiter
/// when the effects reach its target.
final class BenchOrigin: Sendable {
    private struct State {
        var seen: Set<String> = []
        var duplicates = 0
        var target = Int.max
        var reached: CheckedContinuation<Void, Never>?
    }

    let server: LoopbackHTTPServer
    private let state = Box()

    /// Holds the state for the server thread's handler and the benchmark alike.
    private final class Box: Sendable {
        let mutex = Mutex(State())
    }

    /// An origin that answers each request `latency` after reading it.
    init(latency: Duration = .zero) throws {
        server = try LoopbackHTTPServer()
        let box = state
        server.route("/effects/*") { request in
            let reached = box.mutex.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let key = request.header("Idempotency-Key"), state.seen.insert(key).inserted else {
                    state.duplicates += 1
                    return nil
                }
                guard state.seen.count >= state.target, let reached = state.reached else { return nil }
                state.reached = nil
                return reached
            }
            reached?.resume()
            return .status(201).delayed(by: latency)
        }
    }

    deinit { server.shutdown() }

    var baseURL: URL { server.baseURL }
    var effects: Int { state.mutex.withLock { $0.seen.count } }
    var duplicates: Int { state.mutex.withLock { $0.duplicates } }

    /// Forgets every effect (the next run's keys are new ones anyway).
    func reset() {
        state.mutex.withLock { state in
            state.seen = []
            state.duplicates = 0
        }
    }

    /// Returns once `count` effects have landed.
    func waitForEffects(_ count: Int) async {
        await withCheckedContinuation { continuation in
            let done = state.mutex.withLock { state -> Bool in
                if state.seen.count >= count { return true }
                state.target = count
                state.reached = continuation
                return false
            }
            if done { continuation.resume() }
        }
    }
}
