import Foundation

/// Errors of the offline queue itself. Failures of the network call on the fast path are thrown
/// as `NetworkError`.
public enum OfflineQueueError: Error, Sendable, Equatable {
    /// The queue holds `maxQueueSize` entries; the new one was not queued (nothing was written).
    case full
    /// A file operation failed: the disk is full (`ENOSPC`), the folder is not writable, … The
    /// entry was not queued; nothing half-written is left behind.
    case storage(operation: String, path: String, errno: Int32)
    /// The request's URL has a credential-like query parameter (e.g. `access_token`; the rule is
    /// `QueueSecretPolicy`); queue files never hold secrets, so the request was neither sent nor
    /// queued. Put credentials in a header instead. Carries the parameter's name, never its value.
    case sensitiveQueryParameter(String)
    /// The request's URL has a credential-like path parameter (e.g. `/cart;jsessionid=…`; the
    /// rule is `QueueSecretPolicy`): neither sent nor queued. Carries the name, never the value.
    case sensitivePathParameter(String)
    /// The request's URL carries user-info (`https://user:password@host/`): it would be written to
    /// the queue file and sent as Basic auth by every replay, so the request was neither sent nor
    /// queued. Send credentials in a header (stripped from the entry; see `QueueSecretPolicy`).
    case credentialsInURL
    /// The request cannot be stored (its method is unknown, it could not be encoded, or its file
    /// would exceed `DiskQueueStore.maximumEntrySize`).
    case unstorable(reason: String)
    /// Another `DiskQueueStore` — in this process or another — holds the queue folder at `path`.
    /// Two writers on one folder would deliver entries twice and delete each other's writes, so a
    /// folder has one owner at a time (see `DiskQueueStore.init(directory:)`).
    case folderInUse(path: String)
    /// A `QueueClaim` is no longer its entry's live claim: its lease ran out and another consumer
    /// claimed the entry, or the entry was cancelled. Nothing was changed; the delivery the claim
    /// covered must stop (see `QueueStorage`).
    case claimLost(id: UUID)
    /// The queue or its store was closed (`OfflineQueueEngine.close()`, `DiskQueueStore.close()`):
    /// it has let go of its folder, sends and writes nothing more.
    case closed
}

extension OfflineQueueError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .full: return "offline queue is full"
        case .storage(let operation, let path, let code):
            return "offline queue storage: \(operation) failed for \(path): \(String(cString: strerror(code))) (errno \(code))"
        case .sensitiveQueryParameter(let name): return "offline queue refuses a URL with the credential-like query parameter '\(name)'"
        case .sensitivePathParameter(let name): return "offline queue refuses a URL with the credential-like path parameter '\(name)'"
        case .credentialsInURL: return "offline queue refuses a URL with user-info (user:password@)"
        case .unstorable(let reason): return "offline queue cannot store the request: \(reason)"
        case .folderInUse(let path): return "offline queue folder \(path) is in use by another store (this process or another)"
        case .claimLost(let id): return "offline queue entry \(id) is no longer claimed by this consumer"
        case .closed: return "offline queue was closed"
        }
    }

    /// Whether the disk was full.
    public var isDiskFull: Bool {
        if case .storage(_, _, let code) = self { return code == ENOSPC || code == EDQUOT }
        return false
    }
}
