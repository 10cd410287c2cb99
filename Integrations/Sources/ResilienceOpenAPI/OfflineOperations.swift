import Foundation
import HTTPTypes
import OfflineQueue
import OpenAPIRuntime
import RequestEngine
import Synchronization

/// Makes a generated client's operations durable: each call is stored in the offline queue and
/// replayed by it, instead of sent and answered.
///
/// ```swift
/// let offline = OfflineOperations(queue: queue) { Client(serverURL: serverURL, transport: $0) }
/// let result = try await offline.enqueue { try await $0.createNote(body: .json(note)) }
/// // .sent(statusCode: 201) when it went at once, .queued(id:) when it waits for the network
/// ```
///
/// `enqueue` runs `operation` against a client whose transport captures the request the generated
/// code builds — URL, method, header fields (joined per name, as `ResilienceTransport` joins them)
/// and body — and hands it to `OfflineQueueEngine.enqueue(_:)` with the given priority, ordering
/// and coalescing keys and the operation's `operationID` (stored as `QueueEntry.operationID`, so
/// `OptimisticUpdate` and `Invalidation` rules can match it). The queue's rules apply as to any
/// entry: it is sent at once when the network is up, else stored durably (surviving a relaunch) and
/// replayed in order with the same `Idempotency-Key` on every attempt — the operation's own
/// `Idempotency-Key` header when its input sets one, else a fresh key for this call.
///
/// The operation's output never exists: once the request is captured, the client's call throws
/// and `enqueue` returns the queue's answer (a response to a replay arrives long after the call).
/// Code in `operation` after the client's call does not run; make exactly one call in it.
public struct OfflineOperations<Client>: Sendable {
    private let queue: OfflineQueueEngine
    private let makeClient: @Sendable (any ClientTransport) -> Client
    private let maximumRequestBodySize: Int

    /// - Parameters:
    ///   - queue: where operations are stored and from which they are replayed.
    ///   - maximumRequestBodySize: the largest body stored for an operation (default 16 MiB); a
    ///     larger one throws `ResilienceTransportError.requestBodyTooLarge` and nothing is queued.
    ///   - makeClient: the generated client over the transport it is given.
    public init(
        queue: OfflineQueueEngine,
        maximumRequestBodySize: Int = 16 * 1024 * 1024,
        makeClient: @escaping @Sendable (any ClientTransport) -> Client
    ) {
        self.queue = queue
        self.maximumRequestBodySize = maximumRequestBodySize
        self.makeClient = makeClient
    }

    /// Stores the one operation `operation` calls on the client it is given, and returns what
    /// the queue did: `.sent(statusCode:)` when the request went at once and was answered 2xx,
    /// `.queued(id:)` when it waits for a replay.
    ///
    /// Throws what the queue throws (`OfflineQueueError`, `NetworkError.invalidRequest`),
    /// `ResilienceTransportError` for a request the queue cannot take (a method it does not send,
    /// a body over the bound), `OfflineOperationsError.noOperation` when `operation` made no call,
    /// and `.moreThanOneOperation` for a second call in one `enqueue` (the first is stored).
    public func enqueue(
        priority: QueuePriority = .normal,
        orderingKey: String? = nil,
        coalescingKey: String? = nil,
        _ operation: (Client) async throws -> Void
    ) async throws -> EnqueueResult {
        let capture = CapturingTransport(
            queue: queue, priority: priority, orderingKey: orderingKey, coalescingKey: coalescingKey,
            maximumRequestBodySize: maximumRequestBodySize)
        do {
            try await operation(makeClient(capture))
        } catch {
            guard let result = capture.result else { throw Self.underlying(error) }
            return result
        }
        // The client returned without the transport answering: it never called it.
        if let result = capture.result { return result }
        throw OfflineOperationsError.noOperation
    }

    /// `error` without the generated client's `ClientError` around it.
    private static func underlying(_ error: any Error) -> any Error {
        (error as? ClientError)?.underlyingError ?? error
    }
}

/// Why `OfflineOperations.enqueue` stored nothing, or stopped a second operation.
public enum OfflineOperationsError: Error, Sendable, Equatable {
    /// The closure made no call on the client.
    case noOperation
    /// The closure called a second operation; only the first was stored.
    case moreThanOneOperation
}

/// The transport `OfflineOperations` gives the client: it hands the first request to the queue
/// and ends the client's call with `Captured` (there is no response to decode).
private final class CapturingTransport: ClientTransport {
    /// Thrown to end the client's call once its request is in the queue's hands.
    struct Captured: Error {}

    private let queue: OfflineQueueEngine
    private let priority: QueuePriority
    private let orderingKey: String?
    private let coalescingKey: String?
    private let maximumRequestBodySize: Int
    private let state = Mutex<(started: Bool, result: EnqueueResult?)>((false, nil))

    init(queue: OfflineQueueEngine, priority: QueuePriority, orderingKey: String?, coalescingKey: String?, maximumRequestBodySize: Int) {
        self.queue = queue
        self.priority = priority
        self.orderingKey = orderingKey
        self.coalescingKey = coalescingKey
        self.maximumRequestBodySize = maximumRequestBodySize
    }

    /// What the queue answered for the captured operation.
    var result: EnqueueResult? { state.withLock { $0.result } }

    func send(_ request: HTTPRequest, body: HTTPBody?, baseURL: URL, operationID: String) async throws -> (HTTPResponse, HTTPBody?) {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { throw OfflineOperationsError.moreThanOneOperation }
        let method = try HTTPConversion.method(request.method)
        var headers = HTTPConversion.headers(request.headerFields)
        let ownKey = headers.first { $0.key.caseInsensitiveCompare(HTTPHeader.idempotencyKey) == .orderedSame }
        if let ownKey { headers[ownKey.key] = nil }
        var data: Data?
        if let body { data = try await HTTPConversion.collect(body, upTo: maximumRequestBodySize) }
        let entry = OperationRequest(
            url: try HTTPConversion.url(baseURL: baseURL, path: request.path),
            method: method,
            headers: headers,
            body: data,
            priority: priority,
            idempotencyKey: ownKey.map(\.value).flatMap { $0.isEmpty ? nil : $0 } ?? UUID().uuidString,
            orderingKey: orderingKey,
            coalescingKey: coalescingKey,
            operationID: operationID
        )
        let result = try await queue.enqueue(entry)
        state.withLock { $0.result = result }
        throw Captured()
    }
}

/// A generated operation's request as the queue stores it.
private struct OperationRequest: QueueableRequest {
    let url: URL
    let method: HTTPMethod
    let headers: [String: String]
    let body: Data?
    let priority: QueuePriority
    let idempotencyKey: String
    let orderingKey: String?
    let coalescingKey: String?
    let operationID: String?
}
