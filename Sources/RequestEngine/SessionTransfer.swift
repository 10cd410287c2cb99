import Dispatch
import Foundation
import ResilienceCore
import Retry
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The task a transfer drives: a `URLSessionTask`, or a test double.
protocol TransferTask: AnyObject, Sendable {
    var taskIdentifier: Int { get }
    func resume()
    func cancel()
}

extension URLSessionTask: TransferTask {}

/// One request's data transfer as the caller sees it: the caller waits on a continuation, the
/// session reports the response, bytes and completion, and a `TransferStateMachine` decides.
///
/// Cancellation never blocks the cancelling thread: the caller is answered `URLError(.cancelled)`
/// at once and the task's `cancel()` runs later on `canceller`, a few dedicated threads. That
/// matters on Linux, where `URLSessionTask.cancel()` waits (`workQueue.sync`) for the session's
/// one serial queue, which is also where libcurl processes every transfer's incoming data: under
/// load or a flood of body bytes a synchronous cancel held the cancelling thread — a thread of
/// Swift's cooperative pool — for seconds. Not a `DispatchQueue`: on Linux Dispatch's worker
/// threads are the cooperative pool's, about one per core and not added when one blocks, so a
/// cancel blocked there starves every task.
final class SessionTransfer: Sendable {
    private let machine: Locked<TransferStateMachine>
    private let canceller: BlockingIOPool

    /// - Parameters:
    ///   - limit: the largest body accepted, in bytes; `nil` for no limit.
    ///   - expectsBody: false for HEAD, whose `Content-Length` describes a body that is not sent.
    ///   - canceller: the threads the task's `cancel()` is handed to.
    init(limit: Int?, expectsBody: Bool = true, canceller: BlockingIOPool) {
        machine = Locked(TransferStateMachine(limit: limit, expectsBody: expectsBody))
        self.canceller = canceller
    }

    /// Where every transfer hands its task's cancel: up to four dedicated threads, started on
    /// first use, so a burst of slow cancels occupies at most four threads and never one of the
    /// cooperative pool's.
    static let sharedCanceller = BlockingIOPool(maxThreads: 4, name: "resilience.request-engine.cancel")

    /// Makes the task with `makeTask` (made, maybe registered, never resumed by it), starts it and
    /// waits for the answer. A cancelled caller gets `URLError(.cancelled)` at once.
    func run(makeTask: () -> any TransferTask) async throws -> (Data, URLResponse) {
        if Task.isCancelled { throw URLError(.cancelled) }  // no task made for nothing
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                let task = makeTask()
                perform(machine.withLock { $0.start(continuation, task: task) })
            }
        } onCancel: {
            perform(machine.withLock { $0.cancel() })
        }
    }

    /// The response head arrived (from a session delegate).
    func receive(response: URLResponse) {
        perform(machine.withLock { $0.receive(response: response) })
    }

    /// Body bytes arrived (from a session delegate).
    func receive(data: Data) {
        perform(machine.withLock { $0.receive(data: data) })
    }

    /// The task ended: with the whole body from a completion handler, or with `data` nil after a
    /// delegate delivered the bytes.
    func complete(data: Data?, response: URLResponse?, error: (any Error)?) {
        perform(machine.withLock { $0.complete(data: data, response: response, error: error) })
    }

    /// Whether the caller still waits (for tests).
    var isWaiting: Bool { machine.withLock { $0.isReceiving } }

    /// Body bytes held for the caller (for tests).
    var bufferedByteCount: Int { machine.withLock { $0.bufferedByteCount } }

    private func perform(_ action: TransferStateMachine.Action) {
        switch action {
        case .none:
            break
        case .resume(let task):
            task.resume()
        case .answer(let continuation, let result):
            continuation.resume(with: result)
        case .answerAndCancel(let continuation, let result, let task):
            continuation.resume(with: result)
            canceller.submit { task.cancel() }
        }
    }
}
