import Foundation
import IntegrationTestSupport
import ResilienceTesting
import Synchronization

/// The origin the replicas deliver to: a `LoopbackHTTPServer` that applies each `Idempotency-Key`
/// once (the first request carrying it is the effect; later ones are duplicates, answered the same)
/// and answers 201. Each request's body is `<ordering key> <index>` (`postgres-queue-replica`'s
/// entries); the origin checks, as each effect lands, that a key's effects come in index order.
/// Each answer is written `responseDelay` after the request arrived (the effect is recorded at once),
/// so that a replica killed at a random moment is often killed between an effect and its answer.
final class DeduplicatingOrigin: Sendable {
    struct Effect: Equatable, Sendable {
        let orderingKey: String
        let index: Int
    }

    private struct State {
        var effects: [String: Effect] = [:]
        var nextIndex: [String: Int] = [:]
        var duplicates = 0
        var violations: [String] = []
        /// Who waits for the effects to reach a count (`waitForEffects(atLeast:)`), by ticket.
        var waiters: [Int: (count: Int, continuation: CheckedContinuation<Void, Never>)] = [:]
        var nextTicket = 0

        /// The waiters whose count has been reached, taken out.
        mutating func reached() -> [CheckedContinuation<Void, Never>] {
            let done = waiters.filter { $0.value.count <= effects.count }
            for ticket in done.keys { waiters[ticket] = nil }
            return done.values.map(\.continuation)
        }
    }

    let server: LoopbackHTTPServer
    private let state = Mutex(State())

    init(responseDelay: Duration = .zero) throws {
        server = try LoopbackHTTPServer()
        let answer = LoopbackResponse.status(201).delayed(by: responseDelay)
        server.route("/effects/*") { [weak self] request in
            guard let self else { return .status(503) }
            let (response, reached) = self.state.withLock { state in
                let response = Self.record(request, answer: answer, in: &state)
                return (response, state.reached())
            }
            for waiter in reached { waiter.resume() }
            return response
        }
    }

    /// Records `request`'s effect (the first of its key) and checks its ordering key's order.
    private static func record(_ request: LoopbackRequest, answer: LoopbackResponse, in state: inout State) -> LoopbackResponse {
        guard let key = request.header("Idempotency-Key") else {
            state.violations.append("a request without an Idempotency-Key")
            return .status(400)
        }
        let fields = String(decoding: request.body, as: UTF8.self).split(separator: " ")
        guard fields.count == 2, let index = Int(fields[1]) else {
            state.violations.append("\(key): unreadable body")
            return .status(400)
        }
        guard state.effects[key] == nil else {
            state.duplicates += 1
            return answer
        }
        let orderingKey = String(fields[0])
        state.effects[key] = Effect(orderingKey: orderingKey, index: index)
        let expected = state.nextIndex[orderingKey, default: 0]
        if index != expected {
            state.violations.append("\(orderingKey): the first effect of entry \(index) came when entry \(expected) was next")
        }
        state.nextIndex[orderingKey] = max(expected, index + 1)
        return answer
    }

    /// Returns once the origin has recorded `count` effects, or when the calling task is cancelled.
    func waitForEffects(atLeast count: Int) async {
        let ticket = state.withLock { state in
            defer { state.nextTicket += 1 }
            return state.nextTicket
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ready = state.withLock { state -> Bool in
                    guard state.effects.count < count, !Task.isCancelled else { return true }
                    state.waiters[ticket] = (count, continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: ticket) }?.continuation.resume()
        }
    }

    deinit { server.shutdown() }

    var baseURL: URL { server.baseURL }
    var effectCount: Int { state.withLock { $0.effects.count } }
    var effects: [String: Effect] { state.withLock { $0.effects } }
    var duplicates: Int { state.withLock { $0.duplicates } }
    var violations: [String] { state.withLock { $0.violations } }
}

/// A child process of `postgres-queue-replica` (`ChildProcess`, in IntegrationTestSupport).
typealias ReplicaProcess = ChildProcess

extension ChildProcess {
    /// `postgres-queue-replica` as the build put it, beside this test bundle (SwiftPM builds the
    /// package's executables with its tests); `POSTGRES_QUEUE_REPLICA` names another.
    static let binary: URL? = executable(named: "postgres-queue-replica", overriddenBy: "POSTGRES_QUEUE_REPLICA")
}
