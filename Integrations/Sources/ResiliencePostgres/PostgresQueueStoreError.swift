import Foundation
import OfflineQueue
import PostgresNIO

/// What `PostgresQueueStore` throws besides `OfflineQueueError` (which keeps the queue's own
/// meanings: `.full`, `.claimLost(id:)`, the URL refusals of the outbox).
///
/// An entry's JSON — its request's URL, headers and body — never appears in an error's text, nor
/// in what the store logs: `.database` keeps only PostgreSQL's SQLSTATE and primary message (see
/// that case).
public enum PostgresQueueStoreError: Error, Sendable, Equatable {
    /// The table name is not a plain SQL identifier (a letter or `_`, then letters, digits or `_`,
    /// at most `PostgresQueueStore.maximumTableNameLength` characters).
    case invalidTableName(String)
    /// The table's schema was written by a newer version of this library (`found`) than this one
    /// knows (`supported`): nothing was changed. Upgrade this replica before it uses the table.
    case schemaTooNew(found: Int, supported: Int)
    /// `enqueue(_:on:)` was called on a connection with no open transaction: the outbox enqueue
    /// runs inside the caller's transaction, so that the entry exists if and only if it commits.
    case notInTransaction
    /// A stored row could not be read back as a `QueueEntry` (written by hand, or damaged).
    case unreadableEntry(id: UUID?, reason: String)
    /// The database could not be reached, or answered an error: `operation` names what the store
    /// was doing (`"claim"`, `"add"`, …), `sqlState` is PostgreSQL's error code when the server
    /// answered (`"40P01"` for a deadlock, …; `nil` when the connection failed), and `message` the
    /// server's primary message as PostgreSQL wrote it, or the connection failure. PostgreSQL's
    /// DETAIL and CONTEXT, which can quote a row, are dropped. The store's statements bind only
    /// ids, times, numbers, the entry's ordering and coalescing keys and the entry's JSON, and
    /// PostgreSQL's primary messages never quote the JSON.
    case database(operation: String, sqlState: String?, message: String)
}

extension PostgresQueueStoreError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .invalidTableName(let name): "invalid queue table name \"\(name)\": use letters, digits and underscores"
        case .schemaTooNew(let found, let supported): "the queue table's schema is version \(found); this library knows up to \(supported)"
        case .notInTransaction: "the outbox enqueue needs an open transaction on the connection"
        case .unreadableEntry(let id, let reason): "unreadable queue entry \(id?.uuidString ?? "?"): \(reason)"
        case .database(let operation, let sqlState, let message):
            "PostgreSQL error during \(operation)" + (sqlState.map { " [\($0)]" } ?? "") + ": \(message)"
        }
    }
}

extension PostgresQueueStoreError {
    /// `error` as the store throws it: the queue's and the store's own errors and cancellation as
    /// they are; anything from postgres-nio as `.database`, without the statement or its binds.
    static func wrapping(_ error: any Error, operation: String) -> any Error {
        switch error {
        case is OfflineQueueError, is PostgresQueueStoreError, is CancellationError:
            return error
        case let error as PSQLError:
            return database(from: error, operation: operation)
        case let error as PostgresTransactionError:
            return wrapping(error.closureError ?? error.beginError ?? error.commitError ?? error.rollbackError ?? error, operation: operation)
        default:
            return PostgresQueueStoreError.database(operation: operation, sqlState: nil, message: String(describing: type(of: error)))
        }
    }

    /// A postgres-nio error as `.database`: the server's SQLSTATE and primary message, or the
    /// connection failure's kind.
    static func database(from error: PSQLError, operation: String) -> PostgresQueueStoreError {
        if let info = error.serverInfo {
            return .database(operation: operation, sqlState: info[.sqlState], message: info[.message] ?? "server error")
        }
        var message = error.code.description
        // The socket's failure (refused, timed out) says why the database cannot be reached; other
        // codes' underlying errors may hold decoded data, so only their kind is told.
        if error.code == .connectionError, let underlying = error.underlying { message += " (\(underlying))" }
        return .database(operation: operation, sqlState: nil, message: message)
    }
}
