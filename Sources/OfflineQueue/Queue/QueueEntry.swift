import Foundation
import RequestEngine

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One queued request as stored on disk (`<id>.json`) and held in the queue's index.
///
/// Secrets are never stored. At enqueue, the queue's `QueueSecretPolicy` strips secret headers
/// (`Authorization`, `Cookie`, `X-Api-Key`, …; a replaying sender such as
/// `AuthenticatedRequestEngine` injects a fresh token at send time, and
/// `OfflineQueueEngine.Configuration.replayHeaders` re-adds others) and the URL's fragment, and
/// refuses URLs with user-info or credential-like query or path parameters
/// (`OfflineQueueError.credentialsInURL`, `.sensitiveQueryParameter`, `.sensitivePathParameter`).
/// `Authorization`, `Proxy-Authorization` and `Cookie` are dropped whenever an entry is made.
public struct QueueEntry: Codable, Sendable, Equatable, Identifiable {
    /// The file format version written by this library.
    public static let currentFormatVersion = 1

    /// Stable identity; also the file name.
    public let id: UUID
    public let url: URL
    /// The HTTP method's raw value ("POST").
    public let method: String
    /// Request headers without secrets and without `Idempotency-Key` (sent from `idempotencyKey`).
    public internal(set) var headers: [String: String]
    public internal(set) var body: Data?
    public let timeout: TimeInterval
    /// When the entry was first queued (wall clock); with `ttl` it decides expiry.
    public let enqueuedAt: Date
    public let ttl: TimeInterval
    /// `QueuePriority.rawValue`.
    public let priority: Int
    public internal(set) var idempotencyKey: String
    public let orderingKey: String?
    public let coalescingKey: String?
    /// Position in FIFO order; unique and increasing within a store.
    public internal(set) var sequence: UInt64
    /// Attempts made so far that reached no success (the first attempt at enqueue included).
    public internal(set) var attempts: Int
    /// Not sent again before this time (backoff); `nil` means as soon as possible.
    public internal(set) var nextAttemptAt: Date?
    /// A short description of the last failure, without bodies or secrets.
    public internal(set) var lastError: String?
    /// For an entry with a `coalescingKey`, a fresh number from the store's counter at each edit,
    /// so the newest write of the key has the highest; otherwise 0.
    public internal(set) var revision: Int
    public let formatVersion: Int
    /// The request's own `maximumResponseBodySize`, kept for its replays (`nil`: the sender's limit).
    public internal(set) var maximumResponseBodySize: Int?
    /// The request's own `deadline` in seconds, kept for its replays (`nil`: the sender's deadline);
    /// stored as a number, the form the entry file's JSON holds.
    let deadlineSeconds: Double?
    /// `base`, as the entry file's JSON holds it: two flat strings, which the fast reader knows.
    private(set) var baseETag: String?
    private(set) var baseLastModified: String?
    /// The API operation the entry's request performs (`NetworkRequest.operationID`, a generated
    /// OpenAPI client's `operationId`), stored with it and carried by each replay; `nil` for
    /// entries made without one (and every entry stored before it existed). Rules
    /// (`OptimisticUpdate`, `Invalidation`) can match on it.
    public internal(set) var operationID: String?

    /// The conflict this write is in (the server answered `412` or `428`), stored until the
    /// queue's `ConflictResolver` has answered; `nil` for a write in none.
    public internal(set) var conflict: QueueConflict?

    /// The version of the resource this write edits, sent as a precondition on every attempt
    /// (`EditBase`); `nil`: unconditional (and every entry written before bases existed).
    public internal(set) var base: EditBase? {
        get { baseETag == nil && baseLastModified == nil ? nil : EditBase(etag: baseETag, lastModified: baseLastModified) }
        set {
            baseETag = newValue?.etag
            baseLastModified = newValue?.lastModified
        }
    }

    /// The request's own `deadline`, which bounds the first attempt and each replay as a whole
    /// (each replay is a send of its own: the deadline is counted from that send, not from the
    /// enqueue — `ttl` bounds the entry's life). `nil`: the sender's deadline applies.
    public var deadline: Duration? { deadlineSeconds.map { Duration.clamped(seconds: $0, upperBound: .seconds(86_400 * 365_000)) } }

    /// The priority as an enum (unknown values read as `.normal`).
    public var queuePriority: QueuePriority { QueuePriority(rawValue: priority) ?? .normal }

    /// The method as an enum, `nil` if the stored value is not one the library knows.
    public var httpMethod: HTTPMethod? { HTTPMethod(rawValue: method) }

    /// When the entry expires.
    public var expiresAt: Date { enqueuedAt.addingTimeInterval(ttl.isFinite ? max(0, ttl) : 86_400 * 365_000) }

    /// Whether the entry has expired at `now`.
    public func isExpired(at now: Date) -> Bool { now >= expiresAt }

    /// Whether the entry has expired now, by the system clock (SwiftResilience's spelling of
    /// `isExpired(at: Date())`). The queue itself judges expiry by its own clock,
    /// `OfflineQueueEngine.now`, which a test may move with a `ManualClock`.
    public var isExpired: Bool { isExpired(at: Date()) }

    /// A snapshot of `request` for `DiskQueueStore.save(_:)` — SwiftResilience's initializer.
    ///
    /// The entry carries the request's URL, method, headers, body, timeout, TTL, priority and
    /// ordering and coalescing keys, and reads `request.idempotencyKey` once. `Authorization`,
    /// `Proxy-Authorization`, `Cookie` and any `Idempotency-Key` header are never kept (the key
    /// travels in `idempotencyKey`); unlike `OfflineQueueEngine.enqueue`, no `QueueSecretPolicy` is
    /// applied here, so strip other secrets before you save the entry yourself.
    ///
    /// Its place in line is given by the store when it is saved: a new id goes to the back of its
    /// priority's line (FIFO is save order, not `enqueuedAt` order); an id already queued keeps
    /// its place, moved to the line of its new priority if that changed.
    ///
    /// - Parameters:
    ///   - request: what to store: its method, URL, headers, body and queue settings.
    ///   - id: the entry's identity and file name; a fresh UUID by default.
    ///   - enqueuedAt: when the entry's TTL starts; now by default.
    public init(_ request: some QueueableRequest, id: UUID = UUID(), enqueuedAt: Date = Date()) {
        self.init(
            id: id, request: request, idempotencyKey: request.idempotencyKey, enqueuedAt: enqueuedAt,
            sequence: Self.unplacedSequence)
    }

    /// The request this entry replays, as a `URLRequest` (SwiftResilience's): `method`, `url`, the
    /// stored headers, `body`, `timeout` as `timeoutInterval` (7 days when infinite), and
    /// `Idempotency-Key: idempotencyKey`. It holds no token (tokens are never stored; the sender
    /// adds one at send time) and is not validated: `NetworkRequest.makeURLRequest()` is the
    /// checked path the queue itself uses.
    public func asURLRequest() -> URLRequest {
        var request = URLRequest(url: url, timeoutInterval: timeout.isFinite && timeout > 0 ? timeout : 7 * 24 * 3600)
        request.httpMethod = method
        request.httpBody = body
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        request.setValue(idempotencyKey, forHTTPHeaderField: HTTPHeader.idempotencyKey)
        return request
    }

    /// The `sequence` of an entry not yet placed in a store's line (made by the public
    /// initializer); `DiskQueueStore.save(_:)` gives it its place. The store's own numbers start at 1.
    static let unplacedSequence: UInt64 = 0

    /// This entry without the headers no entry may keep (`storableHeaders`): an entry decoded by a
    /// caller, or built by hand, may carry them; the store never writes them.
    package func withStorableHeaders() -> QueueEntry {
        var copy = self
        copy.headers = Self.storableHeaders(headers)
        return copy
    }

    /// This entry with another `sequence` (its place in line): what a `QueueStorage` conformer
    /// returns from `add(_:limit:)` once it has placed an entry.
    public func placed(at sequence: UInt64) -> QueueEntry {
        var copy = self
        copy.sequence = sequence
        return copy
    }

    init(
        id: UUID = UUID(),
        request: some QueueableRequest,
        idempotencyKey: String,
        enqueuedAt: Date,
        sequence: UInt64,
        revision: Int = 0,
        attempts: Int = 0,
        nextAttemptAt: Date? = nil,
        lastError: String? = nil
    ) {
        self.id = id
        self.url = request.url
        self.method = request.method.rawValue
        self.headers = Self.storableHeaders(request.headers)
        self.body = request.body
        self.timeout = request.timeout
        self.enqueuedAt = enqueuedAt
        self.ttl = request.ttl
        self.priority = request.priority.rawValue
        self.idempotencyKey = idempotencyKey
        self.orderingKey = request.orderingKey
        self.coalescingKey = request.coalescingKey
        self.sequence = sequence
        self.revision = revision
        self.attempts = attempts
        self.nextAttemptAt = nextAttemptAt
        self.lastError = lastError
        self.formatVersion = Self.currentFormatVersion
        self.maximumResponseBodySize = request.maximumResponseBodySize
        self.deadlineSeconds = request.deadline?.seconds
        self.baseETag = request.editBase?.etag
        self.baseLastModified = request.editBase?.lastModified
        self.operationID = request.operationID
    }

    /// Every stored field, as read back from a file.
    init(
        id: UUID, url: URL, method: String, headers: [String: String], body: Data?, timeout: TimeInterval,
        enqueuedAt: Date, ttl: TimeInterval, priority: Int, idempotencyKey: String, orderingKey: String?,
        coalescingKey: String?, sequence: UInt64, attempts: Int, nextAttemptAt: Date?, lastError: String?,
        revision: Int, formatVersion: Int, maximumResponseBodySize: Int? = nil, deadlineSeconds: Double? = nil,
        baseETag: String? = nil, baseLastModified: String? = nil, conflict: QueueConflict? = nil, operationID: String? = nil
    ) {
        self.id = id
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.enqueuedAt = enqueuedAt
        self.ttl = ttl
        self.priority = priority
        self.idempotencyKey = idempotencyKey
        self.orderingKey = orderingKey
        self.coalescingKey = coalescingKey
        self.sequence = sequence
        self.attempts = attempts
        self.nextAttemptAt = nextAttemptAt
        self.lastError = lastError
        self.revision = revision
        self.formatVersion = formatVersion
        self.maximumResponseBodySize = maximumResponseBodySize
        self.deadlineSeconds = deadlineSeconds
        self.baseETag = baseETag
        self.baseLastModified = baseLastModified
        self.conflict = conflict
        self.operationID = operationID
    }

    /// The largest `sequence`, `revision` or `attempts` a stored entry may carry: 2^53, the largest
    /// integer a JSON number holds exactly. An entry file with a larger sequence is quarantined at
    /// open; larger (or negative) attempts and revisions are clamped, so no arithmetic on a value
    /// read from disk can overflow.
    static let maximumCounter: UInt64 = 1 << 53

    /// This entry with `attempts` and `revision` clamped to `0...maximumCounter`.
    func withCountersInRange() -> QueueEntry {
        let limit = Int(Self.maximumCounter)
        let attempts = min(max(0, self.attempts), limit)
        let revision = min(max(0, self.revision), limit)
        var copy = self
        copy.attempts = attempts
        copy.revision = revision
        return copy
    }

    /// This entry as the edit that replaces `holder` (the queued edit of the same coalescing key)
    /// in its place: what every `QueueStorage` stores then. It keeps the holder's `base` when the
    /// holder has one — the version the user saw before the first of the edits, which is the one
    /// the server must still have for the merged edit to apply — and its own otherwise.
    public func replacing(_ holder: QueueEntry) -> QueueEntry {
        guard let base = holder.base else { return self }
        var copy = self
        copy.base = base
        return copy
    }

    /// This entry as a new edit of its coalescing key, numbered `revision`.
    func revised(_ revision: Int) -> QueueEntry {
        var copy = self
        copy.revision = revision
        return copy
    }

    /// `attempts + 1`, saturating at `maximumCounter`.
    var attemptsAfterOneMore: Int { attempts < Int(Self.maximumCounter) ? attempts + 1 : attempts }

    /// The JSON encoder for entry files (infinite timeouts and TTLs are written as "inf").
    package static func makeEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return encoder
    }

    /// The matching decoder.
    package static func makeDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        return decoder
    }

    /// Header names never written to disk, whatever the queue's `QueueSecretPolicy` says.
    static let secretHeaders: Set<String> = QueueSecretPolicy.alwaysSecretHeaderNames

    static func storableHeaders(_ headers: [String: String]) -> [String: String] {
        headers.filter { name, _ in
            let lowered = name.lowercased()
            return !secretHeaders.contains(lowered) && lowered != HTTPHeader.idempotencyKey.lowercased()
        }
    }
}

extension QueueEntry {
    /// The request this entry replays: the stored fields plus its `Idempotency-Key`, in the
    /// background share of a host's adaptive limit (an online enqueue's first attempt is made
    /// interactive by the queue: someone waits for it); `nil` when the stored method is not one
    /// the library knows.
    var replayRequest: PreparedRequest? {
        guard let method = httpMethod else { return nil }
        var headers = base?.applied(to: headers) ?? headers
        headers[HTTPHeader.idempotencyKey] = idempotencyKey
        return PreparedRequest(
            url: url, method: method, headers: headers, body: body, timeout: timeout,
            maximumResponseBodySize: maximumResponseBodySize, deadline: deadline, requestPriority: .background,
            operationID: operationID
        )
    }
}
