import Resilience

// What the published README leaves to the reader: the URLs and bodies it names, the request types it
// sends without defining, and the app's Keychain and auth API. Requests go to the server the runner
// sets in `SnippetContext.baseURL` (a loopback server).

public enum SnippetContext {
    /// Where the snippets' requests go.
    public static var baseURL: URL {
        get { state.withLock { $0.baseURL } }
        set { state.withLock { $0.baseURL = newValue } }
    }

    static func url(_ path: String) -> URL { baseURL.appendingPathComponent(path) }

    /// How many times `showLoginScreen()` ran.
    public static var loginScreensShown: Int { state.withLock { $0.loginScreens } }

    /// Sets what the app's Keychain holds.
    public static func setKeychain(_ values: [String: String]) { state.withLock { $0.keychain = values } }

    /// The error `AuthAPI.refresh` throws while `failRefresh` is set.
    public struct RefreshRejected: Error, Sendable {}
    public static func failRefresh(_ fail: Bool) { state.withLock { $0.failRefresh = fail } }

    struct State {
        var baseURL = URL(fileURLWithPath: "/")
        var keychain: [String: String] = [:]
        var loginScreens = 0
        var failRefresh = false
    }

    /// `@unchecked Sendable`: `value` is only touched under `lock`.
    final class Guarded: @unchecked Sendable {
        private let lock = NSLock()
        private var value = State()
        func withLock<T>(_ body: (inout State) -> T) -> T { lock.withLock { body(&value) } }
    }

    static let state = Guarded()
}

var userURL: URL { SnippetContext.url("/user") }

var payload: Data { Data(#"{"item":"book","quantity":1}"#.utf8) }

struct FetchFeedRequest: NetworkRequest {
    var url: URL { SnippetContext.url("/feed") }
    let method: HTTPMethod = .get
}

struct FetchProfileRequest: NetworkRequest {
    var url: URL { SnippetContext.url("/profile") }
    let method: HTTPMethod = .get
}

extension SubmitOrderRequest {
    /// The README calls `SubmitOrderRequest(orderID:body:)`, which its struct does not declare.
    init(orderID: String, body: Data?) {
        self.init(url: SnippetContext.url("/orders"), body: body, orderID: orderID)
    }
}

enum Keychain {
    static func read(_ key: String) -> String? { SnippetContext.state.withLock { $0.keychain[key] } }
    static func write(_ key: String, _ value: String) { SnippetContext.state.withLock { $0.keychain[key] = value } }
}

/// The app's token endpoint: POST /token with the refresh token, answered with the new access token.
enum AuthAPI {
    struct TokenResponse { let accessToken: String }

    struct TokenRequest: NetworkRequest {
        let url = SnippetContext.url("/token")
        let method: HTTPMethod = .post
        let body: Data?
    }

    static func refresh(using refreshToken: String?) async throws -> TokenResponse {
        if SnippetContext.state.withLock({ $0.failRefresh }) { throw SnippetContext.RefreshRejected() }
        let (data, _) = try await AsyncRequestEngine().send(TokenRequest(body: Data((refreshToken ?? "").utf8)))
        return TokenResponse(accessToken: String(decoding: data, as: UTF8.self))
    }
}

func showLoginScreen() async {
    SnippetContext.state.withLock { $0.loginScreens += 1 }
}

#if canImport(BackgroundTasks) && canImport(UIKit) && !os(watchOS)
/// The queue the README's app delegate hands to its drainer.
let offlineQueueEngine: OfflineQueueEngine = {
    do {
        return try OfflineQueueEngine(reachabilityMonitor: NetworkReachabilityMonitor())
    } catch {
        fatalError("the app cannot run without its queue folder: \(error)")
    }
}()
#endif
