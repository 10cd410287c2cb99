/// What one API operation may do beyond HTTP's own rules, as `ResilienceTransport` asks
/// `Configuration.operationPolicy` for each `operationID`.
///
/// ```swift
/// var configuration = ResilienceTransport.Configuration()
/// configuration.operationPolicy = { operationID in
///     switch operationID {
///     case "createNote": OperationPolicy(retryable: true)  // the API makes its POSTs idempotent
///     case "getQuota": OperationPolicy(cacheable: false)    // never served from a cache
///     default: OperationPolicy()
///     }
/// }
/// ```
public struct OperationPolicy: Sendable, Hashable {
    /// Whether the operation's request may be sent more than once (retried and hedged by the
    /// engine's policies): `nil` (the default) leaves it to the method and the `Idempotency-Key`
    /// rule — GET, HEAD, OPTIONS, PUT and DELETE, or any request carrying an `Idempotency-Key`;
    /// `false` sends it once; `true` vouches that repeating it is safe whatever the method.
    /// Carried to the stack as `NetworkRequest.retryable`.
    public var retryable: Bool?
    /// Whether a response cache in the stack may store and answer the operation: `nil` (the
    /// default) and `true` leave it to HTTP's caching rules (GET and HEAD responses a server lets a
    /// cache store); `false` keeps the operation out of the cache both ways. Carried as
    /// `NetworkRequest.cacheable`.
    public var cacheable: Bool?

    public init(retryable: Bool? = nil, cacheable: Bool? = nil) {
        self.retryable = retryable
        self.cacheable = cacheable
    }
}
