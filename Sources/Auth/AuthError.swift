/// Why `AuthenticatedRequestEngine` or `TokenRefreshCoordinator` could not obtain a usable token.
///
/// Thrown next to `NetworkError` (which still reports every failure of the HTTP exchange itself,
/// including a second 401 as `NetworkError.httpError(statusCode: 401, data:)`). No case carries a
/// token, and `description` never prints one.
public enum AuthError: Error, Sendable {
    /// `TokenProvider.refreshToken()` threw `underlying`. Every request that waited for that
    /// refresh, and every request that was already on its way with the rejected token when the
    /// refresh failed, gets this same error; a request that starts later may try a new refresh.
    /// `underlying` is your provider's own error, so you can tell a revoked session (show the
    /// login screen) from an unreachable auth server (try later).
    case refreshFailed(underlying: any Error)

    /// `TokenProvider.refreshToken()` returned an empty token, or one containing CR, LF or NUL
    /// (which cannot travel in a header). It is not used, and the refresh counts as failed.
    case invalidToken

    /// More than `refreshes` refreshes would have started within `window`: the server keeps
    /// rejecting fresh tokens, so the coordinator stops refreshing (a refresh loop guard) until
    /// older refreshes leave the window. The request that got this error was not retried (or,
    /// when it had no usable token, not sent).
    case excessiveRefresh(refreshes: Int, window: Duration)

    /// `TokenProvider.refreshToken()` did not return within the coordinator's `refreshTimeout`
    /// (`after`, measured from the refresh's start on the coordinator's clock). Every request that
    /// waited for that refresh, and every request already on its way with the token it was meant
    /// to replace, gets this error; a request that starts later may start a new refresh (loop
    /// guard permitting). The provider's call is not cancelled: if it returns later, its token is
    /// still used unless a newer one has been obtained meanwhile.
    case refreshTimedOut(after: Duration)
}

extension AuthError: CustomStringConvertible {
    /// One line without tokens, header values or the underlying error's message (only its type).
    public var description: String {
        switch self {
        case .refreshFailed(let underlying):
            return "token refresh failed (\(type(of: underlying)))"
        case .invalidToken:
            return "token refresh returned an empty token or one with CR, LF or NUL"
        case .excessiveRefresh(let refreshes, let window):
            return "more than \(refreshes) token refreshes within \(window): refresh loop stopped"
        case .refreshTimedOut(let timeout):
            return "token refresh did not finish within \(timeout): abandoned"
        }
    }
}
