import Dispatch
import Foundation
@_spi(ResilienceCore) import ResilienceCore
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
/// No thread of Swift's cooperative pool ever waits for the session. On Linux, making a task
/// (`dataTask(with:)`), `resume()` and `cancel()` each wait (`workQueue.sync`) for the session's
/// work queue — in corelibs-foundation one serial queue shared by every session of the process —
/// which is also where libcurl processes every transfer's incoming data: a flood of body bytes on
/// one transfer held those calls for tens of seconds, and two callers blocked there stopped every
/// task of the process (a two-core machine has two cooperative threads), timers and the sessions'
/// delegate queues included. So on Linux the task is made, resumed and cancelled on
/// `sessionCalls`, a few dedicated threads; the caller is answered `URLError(.cancelled)` at once,
/// and its timeout fires, whatever the session is doing. Not a `DispatchQueue`: on Linux
/// Dispatch's worker threads are the cooperative pool's, about one per core and not added when one
/// blocks. On Apple platforms the session never blocks its caller, and the task is made and resumed
/// inline.
final class SessionTransfer: Sendable {
    private let machine: Locked<TransferStateMachine>

    /// - Parameters:
    ///   - limit: the largest body accepted, in bytes; `nil` for no limit.
    ///   - expectsBody: false for HEAD, whose `Content-Length` describes a body that is not sent.
    init(limit: Int?, expectsBody: Bool = true) {
        machine = Locked(TransferStateMachine(limit: limit, expectsBody: expectsBody))
    }

    /// Where tasks are cancelled (and, on Linux, made and resumed): up to eight dedicated threads,
    /// started as needed and ended when idle, so calls that wait for a busy session hold these,
    /// never a thread of the cooperative pool. (In corelibs-foundation every session's work queue
    /// runs on one process-wide serial queue, so more threads would only wait side by side.)
    static let sessionCalls = BlockingIOPool(maxThreads: 8, name: "resilience.request-engine.session")

    /// Makes the task with `makeTask` (made, maybe registered, never resumed by it), starts it and
    /// waits for the answer. A cancelled caller gets `URLError(.cancelled)` at once, even while its
    /// task is still being made or resumed.
    func run(makeTask: @escaping @Sendable () -> any TransferTask) async throws -> (Data, URLResponse) {
        if Task.isCancelled { throw URLError(.cancelled) }  // no task made for nothing
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                perform(machine.withLock { $0.start(continuation) }, makeTask: makeTask)
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

    private func perform(_ action: TransferStateMachine.Action, makeTask: (@Sendable () -> any TransferTask)? = nil) {
        switch action {
        case .none:
            break
        case .makeTask:
            guard let makeTask else { preconditionFailure("a task is made only at the start") }
            #if canImport(FoundationNetworking)
            Self.sessionCalls.submit { [self] in start(makeTask()) }
            #else
            start(makeTask())
            #endif
        case .resume(let task):
            task.resume()
        case .cancel(let task):
            Self.sessionCalls.submit { task.cancel() }
        case .answer(let continuation, let result):
            continuation.resume(with: result)
        case .answerAndCancel(let continuation, let result, let task):
            continuation.resume(with: result)
            Self.sessionCalls.submit { task.cancel() }
        }
    }

    private func start(_ task: any TransferTask) {
        perform(machine.withLock { $0.taskMade(task) })
    }
}
