import Foundation

/// Decides what becomes of a queued write the server refused because its version moved on:
/// `412 Precondition Failed` to a write sent with its `EditBase`, or `428 Precondition Required`
/// to one sent without. Set it as `OfflineQueueEngine.Configuration.conflictResolver`; a queue
/// without one treats both as any other 4xx (the write is rejected).
///
/// The queue calls it in a task of its own, once the server's current version is fetched, with
/// the write held out of every pass meanwhile: a slow resolver delays only its own write (and its
/// ordering key's line). One that throws leaves the conflict stored; it is asked again at the
/// write's next attempt (after the queue's backoff, counted as an attempt), on the server version
/// fetched for it, which is stored with the conflict then. The conflict is stored with the entry
/// before the resolution starts, and the answer before anything is sent: a process killed
/// meanwhile resolves again at its next launch (fetching the server's version again) and never
/// sends the refused write as it was.
public protocol ConflictResolver: Sendable {
    /// What to do with `conflict.entry`, given the server's current version.
    func resolve(_ conflict: WriteConflict) async throws -> ConflictResolution
}

/// A queued write the server refused because its version moved on, and what the server has now.
public struct WriteConflict: Sendable {
    /// The write, as queued: its body is the user's edit, its `base` the version they edited.
    public let entry: QueueEntry
    /// The server's current representation of the resource (a `GET` of the write's URL with
    /// `Cache-Control: no-cache`); `nil` when it has none (a `404`, an empty body).
    public let serverBody: Data?
    /// The validators of `serverBody` (its `ETag`, its `Last-Modified`): the base a rebased write
    /// is sent on.
    public let serverValidator: EditBase?
    /// `412` (the write's base is no longer current) or `428` (the server requires a base).
    public let statusCode: Int

    public init(entry: QueueEntry, serverBody: Data?, serverValidator: EditBase?, statusCode: Int) {
        self.entry = entry
        self.serverBody = serverBody
        self.serverValidator = serverValidator
        self.statusCode = statusCode
    }
}

/// A `ConflictResolver`'s answer.
public enum ConflictResolution: Sendable, Equatable {
    /// Send this body instead (the user's edit applied to the server's version), conditional on
    /// the server's version (`WriteConflict.serverValidator`). The write keeps its place in its
    /// ordering key's line and gets a new `Idempotency-Key`: a key is never reused for another body.
    case rebase(body: Data?)
    /// Drop the write: it leaves the queue as `QueueRemovalReason.conflict(statusCode:)` (reported
    /// as `failedPermanently` with the status), and the server's version stands.
    case discard
    /// Send the write as it is, unconditionally: the app's explicit choice that this edit wins over
    /// whatever the server has. After a `428` (the server accepts no unconditional write) it is
    /// sent on the server's version instead. A new `Idempotency-Key`, as for a rebase.
    case overwrite
}

/// The conflict a queued write is in, stored with it (`QueueEntry.conflict`) from the server's
/// `412`/`428` until the resolver's answer is stored: the write is not sent meanwhile.
public struct QueueConflict: Sendable, Hashable, Codable {
    /// The status that started it: `412` or `428`.
    public var statusCode: Int
    /// Whether the server's current version was fetched (then `serverBody` and `serverValidator`
    /// are what it answered); false until then.
    public var fetched: Bool
    /// The server's current representation, once fetched.
    public var serverBody: Data?
    /// Its validators, once fetched.
    public var serverValidator: EditBase?

    public init(statusCode: Int, fetched: Bool = false, serverBody: Data? = nil, serverValidator: EditBase? = nil) {
        self.statusCode = statusCode
        self.fetched = fetched
        self.serverBody = serverBody
        self.serverValidator = serverValidator
    }

    /// The statuses that mean a write's version moved on: `412 Precondition Failed` (RFC 9110
    /// §15.5.13) and `428 Precondition Required` (RFC 6585 §3).
    static func isConflict(status: Int?) -> Bool { status == 412 || status == 428 }
}
