import Foundation
import RequestEngine

/// Replay priority: higher first; FIFO within one priority.
public enum QueuePriority: Int, Comparable, Sendable, Codable, CaseIterable {
    /// Routine background work.
    case normal = 0
    /// User-initiated mutations.
    case high = 1
    /// Actions whose loss the user would notice at once.
    case critical = 2

    public static func < (lhs: QueuePriority, rhs: QueuePriority) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A `NetworkRequest` that can wait in the offline queue and be replayed later.
///
/// Every property has a default, so a conformance needs only what `NetworkRequest` needs:
/// ```swift
/// struct PostComment: QueueableRequest {
///     let url: URL
///     let method: HTTPMethod = .post
///     let body: Data?
/// }
/// ```
public protocol QueueableRequest: NetworkRequest {
    /// Seconds the entry may wait before it expires unsent. Default 86 400 (one day).
    var ttl: TimeInterval { get }
    /// Replay priority. Default `.normal`.
    var priority: QueuePriority { get }
    /// Sent as the `Idempotency-Key` header on the first attempt and on every replay, so the server
    /// can apply the request once. The default is a fresh UUID: the queue reads it **once**, at
    /// enqueue, and stores it with the entry, so two identical requests are two mutations.
    /// SwiftResilience derived its default from the method, URL and body instead; to get that, return
    /// `derivedIdempotencyKey` (see `IdempotencyKey.derived(method:url:body:)`).
    var idempotencyKey: String { get }
    /// Entries with the same ordering key are replayed strictly in enqueue order, whatever their
    /// priority; a head that cannot be delivered yet holds back only its own followers. Default `nil`.
    var orderingKey: String? { get }
    /// A newer entry replaces a pending (not in-flight) older one with the same key, keeping the
    /// older one's place in line: rapid edits converge on the last value. Default `nil`.
    var coalescingKey: String? { get }
    /// The version of the resource this write edits (`EditBase`): stored with the entry and sent
    /// as a precondition (`If-Match`, else `If-Unmodified-Since`) on every attempt, so a newer
    /// version written meanwhile is answered `412` instead of overwritten. Default `nil`: the write
    /// goes unconditionally. (Named `editBase`, not `base`, so that a conforming type's own
    /// `base` of another type cannot silently stand in the default's place.)
    var editBase: EditBase? { get }
}

extension QueueableRequest {
    public var ttl: TimeInterval { 86_400 }
    public var priority: QueuePriority { .normal }
    public var idempotencyKey: String { UUID().uuidString }
    public var orderingKey: String? { nil }
    public var coalescingKey: String? { nil }
    public var editBase: EditBase? { nil }
}

/// A queueable request built from a method, URL and body, for callers without their own request
/// types (and for `enqueue(_:sending: .onNextDrain)` of raw data).
public struct QueuedRequest: QueueableRequest, Hashable {
    public var url: URL
    public var method: HTTPMethod
    public var headers: [String: String]
    public var body: Data?
    public var timeout: TimeInterval
    public var ttl: TimeInterval
    public var priority: QueuePriority
    public var idempotencyKey: String
    public var orderingKey: String?
    public var coalescingKey: String?
    /// The longest each send of this request may take as a whole (the first attempt, and each
    /// replay counted from its own start); `nil`: the sender's own deadline.
    public var deadline: Duration?
    /// The version this write edits, sent as a precondition (`QueueableRequest.editBase`).
    public var editBase: EditBase?

    public init(
        method: HTTPMethod,
        url: URL,
        headers: [String: String] = [:],
        body: Data? = nil,
        timeout: TimeInterval = 30,
        ttl: TimeInterval = 86_400,
        priority: QueuePriority = .normal,
        idempotencyKey: String = UUID().uuidString,
        orderingKey: String? = nil,
        coalescingKey: String? = nil,
        deadline: Duration? = nil,
        editBase: EditBase? = nil
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.ttl = ttl
        self.priority = priority
        self.idempotencyKey = idempotencyKey
        self.orderingKey = orderingKey
        self.coalescingKey = coalescingKey
        self.deadline = deadline
        self.editBase = editBase
    }
}
