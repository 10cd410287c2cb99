import Foundation

/// Errors of the response cache itself. Reads never throw them: a response that cannot be stored
/// is still returned to the caller (and counted in `DiskResponseCache.statistics`).
public enum ResponseCacheError: Error, Sendable, Equatable {
    /// A file operation failed when the cache was opened or cleared: the folder cannot be created,
    /// listed or read, or a file cannot be deleted.
    case storage(operation: String, path: String, errno: Int32)
    /// Another `DiskResponseCache` — in this process or another — holds the folder.
    case folderInUse(path: String)
    /// The cache was closed (`DiskResponseCache.close()`): it has let go of its folder.
    case closed
}

extension ResponseCacheError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .storage(let operation, let path, let code):
            return "response cache storage: \(operation) failed for \(path): \(String(cString: strerror(code))) (errno \(code))"
        case .folderInUse(let path):
            return "response cache folder \(path) is in use by another cache (this process or another)"
        case .closed:
            return "response cache was closed"
        }
    }
}
