import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import Retry

@testable import Auth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The token a fake server accepts; the provider rotates it on refresh.
final class ValidToken: Sendable {
    private let token: Locked<String?>
    init(_ token: String?) { self.token = Locked(token) }
    var value: String? {
        get { token.withLock { $0 } }
        set { token.withLock { $0 = newValue } }
    }
}

struct RefreshFailure: Error, Equatable {
    let id: Int
}

/// A token provider whose refresh rotates tokens ("fresh-1", "fresh-2", …), optionally publishing
/// each new token to a `ValidToken` (the "server"), optionally held at a gate, optionally failing.
final class TestTokenProvider: TokenProvider {
    enum RefreshBehaviour: Sendable {
        /// Returns "fresh-N" and makes it current (and valid on the server).
        case rotate
        /// Returns this token (and makes it current) without touching the server.
        case returns(String)
        /// Throws `RefreshFailure(id:)`.
        case fail(id: Int)
    }

    private struct State {
        var current: String?
        var expiry: Date?
        var refreshExpiry: Date?
        var behaviour: RefreshBehaviour
        var gate: Gate?
        var refreshCount = 0
        var completedRefreshes = 0
        var sawCancellation = false
        var currentTokenReads = 0
    }

    private let state: Locked<State>
    private let server: ValidToken?
    private let refreshStarted: Gate
    private let refreshCompleted: Gate

    init(current: String?, behaviour: RefreshBehaviour = .rotate, server: ValidToken? = nil, gate: Gate? = nil) {
        state = Locked(State(current: current, behaviour: behaviour, gate: gate))
        self.server = server
        self.refreshStarted = Gate()
        self.refreshCompleted = Gate()
    }

    var refreshCount: Int { state.withLock { $0.refreshCount } }
    var currentTokenReads: Int { state.withLock { $0.currentTokenReads } }
    /// Whether a refresh found its task cancelled (the coordinator must never cancel one).
    var sawCancellation: Bool { state.withLock { $0.sawCancellation } }

    func setCurrent(_ token: String?) { state.withLock { $0.current = token } }
    func setBehaviour(_ behaviour: RefreshBehaviour) { state.withLock { $0.behaviour = behaviour } }
    func setGate(_ gate: Gate?) { state.withLock { $0.gate = gate } }
    /// The expiry reported for the current token, and the one reported after each refresh.
    func setExpiry(_ expiry: Date?, afterRefresh: Date? = nil) {
        state.withLock {
            $0.expiry = expiry
            $0.refreshExpiry = afterRefresh
        }
    }

    /// Returns once a refresh has started (held or not).
    func waitForRefreshStart() async { await refreshStarted.wait() }
    /// Returns once a refresh has returned or thrown.
    func waitForRefreshCompletion() async { await refreshCompleted.wait() }

    func currentToken() async -> String? {
        state.withLock {
            $0.currentTokenReads += 1
            return $0.current
        }
    }

    func tokenExpiry() async -> Date? {
        state.withLock { $0.expiry }
    }

    func refreshToken() async throws -> String {
        let gate = state.withLock { state -> Gate? in
            state.refreshCount += 1
            return state.gate
        }
        refreshStarted.open()
        if let gate { await gate.wait() }
        defer { refreshCompleted.open() }
        return try state.withLock { state -> String in
            state.completedRefreshes += 1
            if Task.isCancelled { state.sawCancellation = true }
            let token: String
            switch state.behaviour {
            case .rotate:
                token = "fresh-\(state.refreshCount)"
                server?.value = token
            case .returns(let fixed):
                token = fixed
            case .fail(let id):
                throw RefreshFailure(id: id)
            }
            state.current = token
            state.expiry = state.refreshExpiry
            return token
        }
    }
}

/// A session that answers 200 when the `Authorization` header is `Bearer <valid>`, else 401, and
/// records every request. `hold` makes each call wait at a gate first.
final class TokenCheckingSession: NetworkSession {
    private let valid: ValidToken
    private let requests = Locked<[URLRequest]>([])
    private let headerName: String
    private let prefix: String

    init(valid: ValidToken, headerName: String = "Authorization", prefix: String = "Bearer ") {
        self.valid = valid
        self.headerName = headerName
        self.prefix = prefix
    }

    var callCount: Int { requests.withLock { $0.count } }
    var sentTokens: [String?] { requests.withLock { $0.map { $0.value(forHTTPHeaderField: headerName) } } }

    func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        requests.withLock { $0.append(request) }
        let accepted = valid.value.map { request.value(forHTTPHeaderField: headerName) == prefix + $0 } ?? false
        let url = request.url ?? URL(fileURLWithPath: "/")
        guard let response = HTTPURLResponse(url: url, statusCode: accepted ? 200 : 401, httpVersion: "HTTP/1.1", headerFields: [:]) else {
            throw URLError(.badServerResponse)
        }
        return (Data((accepted ? "ok" : "denied").utf8), response)
    }
}

extension Error {
    /// A stable label for assertions: "httpError(401)", "cancelled", "refreshFailed(7)", …
    var label: String {
        switch self {
        case let error as NetworkError:
            switch error {
            case .httpError(let status, _): return "httpError(\(status))"
            case .cancelled: return "cancelled"
            default: return "network(\(error))"
            }
        case let error as AuthError:
            switch error {
            case .refreshFailed(let underlying as RefreshFailure): return "refreshFailed(\(underlying.id))"
            case .refreshFailed: return "refreshFailed(?)"
            case .invalidToken: return "invalidToken"
            case .excessiveRefresh(let refreshes, _): return "excessiveRefresh(\(refreshes))"
            case .refreshTimedOut(let timeout): return "refreshTimedOut(\(timeout))"
            }
        case is CancellationError:
            return "CancellationError"
        default:
            return "other(\(type(of: self)))"
        }
    }
}
