import Auth
import Synchronization

/// Hands out `current` until refreshed, then `next`; counts refreshes.
public final class CountingTokenProvider: TokenProvider {
    private let state: Mutex<(token: String, refreshes: Int)>
    private let next: String

    public init(current: String, next: String) {
        state = Mutex((current, 0))
        self.next = next
    }

    /// How many times `refreshToken()` was called.
    public var refreshes: Int { state.withLock { $0.refreshes } }

    public func currentToken() async -> String? { state.withLock { $0.token } }

    public func refreshToken() async throws -> String {
        state.withLock { state in
            state.refreshes += 1
            state.token = next
            return next
        }
    }
}
