import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The lifecycle of one data transfer, apart from any I/O: the caller waiting for it, the task
/// carrying it, the body received so far, and the limit on that body. `SessionTransfer` feeds it
/// events (start, the caller's cancellation, the transport's response, bytes and completion) and
/// performs the actions it returns: resume the task, answer the caller, hand the task's cancel off.
///
/// Races this guards against:
/// - the caller cancelled before the transfer started (the cancellation handler runs before the
///   continuation exists): remembered as `cancelledEarly`; the start then answers `cancelled` at
///   once and no task is made;
/// - the caller cancelled while its task is being made (on Linux that happens on another thread,
///   see `SessionTransfer`): answered `cancelled` at once; the task, when it arrives, is cancelled
///   instead of resumed;
/// - bytes, a response or a completion arriving after the caller was answered (cancelled, timed
///   out, body too large): the transport only learns of the cancel later (libcurl can take seconds
///   under load), so until then whatever it delivers is dropped here, and memory stops growing the
///   moment the caller is answered;
/// - a second answer: the continuation leaves the state the first time it is resumed.
struct TransferStateMachine: Sendable {
    typealias Body = (Data, URLResponse)
    typealias Continuation = UnsafeContinuation<Body, any Error>

    private enum State: Sendable {
        /// Made, not started: nobody waits yet.
        case idle
        /// The caller was cancelled before the transfer started.
        case cancelledEarly
        /// The caller waits; its task is being made.
        case starting(Continuation)
        /// Started: the caller waits; the body accumulates.
        case receiving(Continuation, task: any TransferTask, response: URLResponse?, body: Data)
        /// The caller has its answer; the task may still be winding down. Holds nothing.
        case answered
    }

    /// What the owner must do after an event, outside its lock.
    enum Action: Sendable {
        case none
        /// Make the task (and register it), then report it with `taskMade(_:)`.
        case makeTask
        /// Start the task.
        case resume(any TransferTask)
        /// Stop a task whose caller has already been answered; it was never resumed.
        case cancel(any TransferTask)
        /// Answer the caller; the task has ended by itself.
        case answer(Continuation, Result<Body, any Error>)
        /// Answer the caller at once, then stop the task without waiting for it.
        case answerAndCancel(Continuation, Result<Body, any Error>, any TransferTask)
    }

    private var state = State.idle
    /// The largest body accepted, in bytes; `nil` for no limit.
    let limit: Int?
    /// Whether the response to this request can carry a body (not for HEAD): only then does a
    /// `Content-Length` above the limit fail the transfer before any body byte arrives.
    let expectsBody: Bool

    init(limit: Int?, expectsBody: Bool = true) {
        self.limit = limit
        self.expectsBody = expectsBody
    }

    /// The caller waits on `continuation`; its task is to be made (`.makeTask`), unless the caller
    /// was cancelled already.
    mutating func start(_ continuation: Continuation) -> Action {
        switch state {
        case .idle:
            state = .starting(continuation)
            return .makeTask
        case .cancelledEarly:
            state = .answered
            return .answer(continuation, .failure(URLError(.cancelled)))
        case .starting, .receiving, .answered:
            preconditionFailure("a transfer starts once")
        }
    }

    /// The task asked for by `.makeTask` exists (registered, not resumed).
    mutating func taskMade(_ task: any TransferTask) -> Action {
        switch state {
        case .starting(let continuation):
            state = .receiving(continuation, task: task, response: nil, body: Data())
            return .resume(task)
        case .answered:
            // Cancelled while the task was being made: the caller has its answer already.
            return .cancel(task)
        case .idle, .cancelledEarly, .receiving:
            preconditionFailure("a task is made once, after the start")
        }
    }

    /// The caller's task was cancelled (or the engine's timeout cancelled it).
    mutating func cancel() -> Action {
        switch state {
        case .idle:
            state = .cancelledEarly
            return .none
        case .starting(let continuation):
            state = .answered
            return .answer(continuation, .failure(URLError(.cancelled)))
        case .receiving(let continuation, let task, _, _):
            state = .answered
            return .answerAndCancel(continuation, .failure(URLError(.cancelled)), task)
        case .cancelledEarly, .answered:
            return .none
        }
    }

    /// The response head arrived. A declared `Content-Length` above the limit fails the transfer
    /// before its body is read.
    mutating func receive(response: URLResponse) -> Action {
        guard case .receiving(let continuation, let task, _, let body) = state else { return .none }
        if let limit, expectsBody, response.expectedContentLength > Int64(limit),
            Self.statusAllowsBody(response)
        {
            state = .answered
            return .answerAndCancel(continuation, .failure(NetworkError.responseTooLarge(limit: limit, statusCode: Self.status(response))), task)
        }
        state = .receiving(continuation, task: task, response: response, body: body)
        return .none
    }

    /// Body bytes arrived: kept while the body stays within the limit, dropped once the caller has
    /// its answer. The byte that would cross the limit fails the transfer.
    mutating func receive(data: Data) -> Action {
        guard case .receiving(let continuation, let task, let response, var body) = state else { return .none }
        if let limit, data.count > limit - body.count {
            state = .answered
            return .answerAndCancel(continuation, .failure(NetworkError.responseTooLarge(limit: limit, statusCode: response.flatMap(Self.status))), task)
        }
        // Leave no second reference to the buffer in `state` while appending, or it would be copied.
        state = .answered
        if body.isEmpty, let expected = response?.expectedContentLength, expected > 0 {
            body.reserveCapacity(Int(min(expected, Int64(min(limit ?? .max, Self.largestReservation)))))
        }
        body.append(data)
        state = .receiving(continuation, task: task, response: response, body: body)
        return .none
    }

    /// The task ended. `data`, when given (a completion-handler task), is the whole body; otherwise
    /// the body is what `receive(data:)` collected. `response` stands in for a head the delegate did
    /// not see.
    mutating func complete(data: Data?, response: URLResponse?, error: (any Error)?) -> Action {
        guard case .receiving(let continuation, _, let received, let body) = state else { return .none }
        state = .answered
        if let error { return .answer(continuation, .failure(error)) }
        guard let response = received ?? response else {
            return .answer(continuation, .failure(URLError(.badServerResponse)))
        }
        let whole = data ?? body
        if let limit, whole.count > limit {
            return .answer(continuation, .failure(NetworkError.responseTooLarge(limit: limit, statusCode: Self.status(response))))
        }
        return .answer(continuation, .success((whole, response)))
    }

    private static func status(_ response: URLResponse) -> Int? {
        (response as? HTTPURLResponse)?.statusCode
    }

    /// Whether the caller is still waiting (for tests).
    var isReceiving: Bool {
        if case .receiving = state { return true }
        return false
    }

    /// Body bytes held for the caller right now (for tests).
    var bufferedByteCount: Int {
        if case .receiving(_, _, _, let body) = state { return body.count }
        return 0
    }

    /// The most a `Content-Length` reserves up front (a server may announce more than it sends).
    private static let largestReservation = 16 * 1024 * 1024

    /// 1xx, 204 and 304 responses have no body whatever their `Content-Length` says.
    private static func statusAllowsBody(_ response: URLResponse) -> Bool {
        guard let status = (response as? HTTPURLResponse)?.statusCode else { return true }
        return !(100..<200).contains(status) && status != 204 && status != 304
    }
}
