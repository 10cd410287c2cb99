import Foundation

/// Where `AuthenticatedRequestEngine` gets its access tokens: your app's auth layer.
///
/// Implement it once. `currentToken()` is read before every request, so it must be cheap (memory
/// or Keychain, not the network); `refreshToken()` obtains a new token (the network call that
/// trades a refresh token for an access token) and must persist it, so that `currentToken()`
/// returns it afterwards.
///
/// What the Auth layer guarantees to a provider:
/// - `refreshToken()` is never called twice at once by one `TokenRefreshCoordinator`: every
///   concurrent 401 shares one call. The one exception: a call that has not returned within the
///   coordinator's `refreshTimeout` is abandoned (its waiters fail with
///   `AuthError.refreshTimedOut`), and the next request that needs a token may start another call
///   while it still runs. If your refresh tokens rotate, make that call wait for the running one
///   (or share its result), and do not let a call that returns late overwrite a newer token pair.
/// - A refresh, once started, is never cancelled, even when every request waiting for it has been
///   cancelled or it has timed out: a provider that rotates refresh tokens must not lose the new
///   pair half-way. An abandoned call's token is still used if it returns before a newer one was
///   obtained.
/// - Tokens are never written to events, errors' descriptions or logs by this library.
///
/// ```swift
/// actor KeychainTokenProvider: TokenProvider {
///     func currentToken() async -> String? { Keychain.read("access_token") }
///     func refreshToken() async throws -> String {
///         let pair = try await AuthAPI.refresh(using: Keychain.read("refresh_token"))
///         Keychain.write("access_token", pair.accessToken)
///         Keychain.write("refresh_token", pair.refreshToken)
///         return pair.accessToken
///     }
/// }
/// ```
///
/// Implementations that hold mutable state must protect it (an actor or a lock): the protocol
/// refines `Sendable` and is called from many tasks at once.
public protocol TokenProvider: Sendable {
    /// The access token to send now, without the prefix (`"abc"`, not `"Bearer abc"`); `nil` (or
    /// an empty string) when there is none. With no token, the coordinator calls `refreshToken()`
    /// before sending anything.
    func currentToken() async -> String?

    /// Obtains a new access token, persists it (so `currentToken()` returns it) and returns it.
    /// Send the refresh call through a plain engine or `URLSession`, not through an
    /// `AuthenticatedRequestEngine` that uses this provider's coordinator: a 401 there would wait
    /// for the very refresh it is part of.
    /// Throw when that is impossible (the refresh token was revoked, the auth server is
    /// unreachable): every request waiting for this refresh fails with
    /// `AuthError.refreshFailed(underlying:)` carrying this error. Give the network call a timeout
    /// of its own: waiters stop waiting after the coordinator's `refreshTimeout`, but the call is
    /// never cancelled.
    func refreshToken() async throws -> String

    /// When the token `currentToken()` returns now stops being valid, if known (for example a
    /// JWT's `exp`, or the time of issue plus OAuth's `expires_in`). The default returns `nil`:
    /// no expiry is known, and tokens are refreshed only when a server answers 401.
    ///
    /// Read once per new token. When a token is within the coordinator's
    /// `proactiveRefreshLead` of its expiry, the next request starts a refresh in the background
    /// and still goes out with the current token; once it has expired, requests wait for the new
    /// token instead of sending one the server will reject.
    func tokenExpiry() async -> Date?
}

extension TokenProvider {
    /// No expiry is known: tokens are refreshed only when a server answers 401.
    public func tokenExpiry() async -> Date? { nil }
}
