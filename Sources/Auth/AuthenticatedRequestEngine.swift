import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends requests with an access token, and when a server answers 401, refreshes the token once
/// for every concurrent 401 and retries each request once with the new token.
///
/// ```swift
/// let engine = AuthenticatedRequestEngine(
///     requestEngine: AsyncRequestEngine(retryPolicy: ExponentialRetryPolicy()),
///     coordinator: TokenRefreshCoordinator(provider: KeychainTokenProvider())
/// )
/// let (data, response) = try await engine.send(FetchPosts())
/// ```
///
/// What a caller can rely on (Sources/Auth/Auth.docc/AuthGuide.md has every path):
/// - **Injection.** Each attempt carries `tokenHeaderName: tokenPrefix + token`, set at send time
///   from the coordinator; a header of the same name on the request (any letter case) is replaced.
///   The request is never sent without a token: with none, the coordinator refreshes first.
/// - **401.** The request is retried exactly once, with the token that replaces the rejected one:
///   the current one if it is already newer, else the result of the one refresh shared by every
///   concurrent 401. A second 401 is the final answer: `send` throws
///   `NetworkError.httpError(statusCode: 401, data:)`, `response(for:)` returns it.
/// - **Other statuses and failures** pass through untouched, as the underlying engine reports
///   them (with its retries, deduplication, timeouts and events); they never trigger a refresh.
/// - **Errors.** `NetworkError` for the HTTP exchange, `AuthError` when no token can be had (a
///   failed refresh, the loop guard); then the request is not retried (or, if it had no usable
///   token to begin with, not sent at all).
/// - **Cancellation.** A cancelled caller gets `NetworkError.cancelled` at once, also while it
///   waits for a refresh; the refresh goes on for the others.
/// - **Deadline.** A request's `deadline` (else the `AsyncRequestEngine`'s `totalDeadline`) bounds
///   the whole call — the wait for admission, the token wait, the first send, the refresh after
///   a 401 and the retry — and a caller still waiting for a place or a refresh at it gets
///   `NetworkError.deadlineExceeded`.
/// - **Admission (opt-in).** With `maxConcurrentRequests: n`, at most n attempts are in flight at
///   once; later ones wait in order and read the token only when admitted. After a 401, requests
///   not yet admitted then go out with the refreshed token instead of the rejected one: a storm of
///   10 000 requests with an expired token costs one refresh and about n rejected attempts instead
///   of 10 000. The price: a request still waiting for admission when a refresh fails is not one
///   of that refresh's waiters; it reads the (rejected) token when admitted and its 401 may start
///   another refresh, within the loop guard. Default `nil`: no limit, every caller is a waiter.
/// - **Secrets.** The token travels only in the request header. The underlying engine's events
///   carry no headers, and no error or description here contains a token.
///
/// `send` and `response(for:)` are `nonisolated`: a request never hops onto this actor.
public final class AuthenticatedRequestEngine: RequestSending {
    /// The header that carries the token. Default `"Authorization"`.
    public let tokenHeaderName: String
    /// Put before the token in the header value. Default `"Bearer "` (note the space).
    public let tokenPrefix: String
    /// Hands out tokens and shares refreshes; share one between engines that use the same tokens.
    public let coordinator: TokenRefreshCoordinator
    /// Sends every attempt (an `AsyncRequestEngine` unless you passed another sender).
    public let requestEngine: any RequestSending
    /// Attempts allowed in flight at once (see "Admission"); `nil` means no limit.
    public let maxConcurrentRequests: Int?
    /// The admission gate, and the timer that ends its waits at the requests' deadlines (one
    /// sleeping task for them all); `nil` without `maxConcurrentRequests`.
    private let admission: (gate: AdmissionGate, deadlines: DeadlineTimer)?
    /// The sending engine's own total deadline, which applies when a request has none (read once
    /// here, not cast for on every request).
    private let defaultDeadline: Duration?

    /// - Parameters:
    ///   - requestEngine: sends each attempt; `AsyncRequestEngine()` (on `URLSession.shared`, no
    ///     retries) by default. Its retry policy applies to each attempt; a 401 is never retried by it.
    ///   - coordinator: hands out tokens and shares refreshes.
    ///   - tokenHeaderName: the header that carries the token.
    ///   - tokenPrefix: put before the token in that header.
    ///   - maxConcurrentRequests: attempts in flight at once (at least 1), or `nil` (default) for no
    ///     limit. 64 is well above what URLSession opens to one host.
    public init(
        requestEngine: some RequestSending = AsyncRequestEngine(),
        coordinator: TokenRefreshCoordinator,
        tokenHeaderName: String = "Authorization",
        tokenPrefix: String = "Bearer ",
        maxConcurrentRequests: Int? = nil
    ) {
        self.requestEngine = requestEngine
        self.coordinator = coordinator
        self.tokenHeaderName = tokenHeaderName
        self.tokenPrefix = tokenPrefix
        self.maxConcurrentRequests = maxConcurrentRequests.map { max(1, $0) }
        self.admission = maxConcurrentRequests.map { (AdmissionGate(limit: max(1, $0)), DeadlineTimer(time: coordinator.time)) }
        self.defaultDeadline = (requestEngine as? AsyncRequestEngine)?.configuration.deadline
    }

    /// Sends `request` with the token — one shared refresh and a single retry after a 401 — and
    /// returns the final HTTP response whatever its status (the offline queue replays through
    /// this). A second 401 is returned, not thrown. `send(_:)` (from `RequestSending`) is this,
    /// with a final status outside 2xx thrown as `NetworkError.httpError` (a second 401 as
    /// `.httpError(statusCode: 401, data:)`).
    ///
    /// - Throws: `NetworkError` when no HTTP response was obtained (`.cancelled` included),
    ///   `AuthError` when no token can be had.
    public func response(for request: some NetworkRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, head) = try await responseWithHead(for: request)
        return (data, head.httpURLResponse)
    }

    /// `response(for:)`, answering with the response's head as the engine below received it
    /// (`RequestSending.responseWithHead(for:)`): over `AsyncHTTPClientSession` no
    /// `HTTPURLResponse` is built.
    public func responseWithHead(for request: some NetworkRequest) async throws -> (Data, ResponseHead) {
        // The request's deadline (or the sending engine's `totalDeadline`) bounds the whole call:
        // the wait for an admission place, the wait for a token, the first send, the shared
        // refresh after a 401 and the retry. It is placed on the coordinator's clock once, here;
        // each send gets what is left of it.
        let request = PreparedRequest(request)  // read once; each send sets its token and deadline on it
        let deadline = (request.deadline ?? defaultDeadline).map { coordinator.time.now() + $0 }
        // With an admission limit, the place is held from the token read through the 401, the
        // shared refresh and the retry: the 401 must start the refresh at once, not after
        // queueing again behind requests that would then all go out with the rejected token.
        return try await admitted(by: deadline) {
            let issued = try await token(by: deadline) { try await coordinator.tokenForRequest(deadline: deadline) }
            let first = try await requestEngine.responseWithHead(for: try authorized(request, issued.token, by: deadline))
            guard first.1.statusCode == 401 else { return first }
            let replacement = try await token(by: deadline) {
                try await coordinator.tokenAfterUnauthorized(issued, deadline: deadline)
            }
            return try await requestEngine.responseWithHead(for: try authorized(request, replacement.token, by: deadline))
        }
    }

    /// Its token header, beside what the engine it sends through adds: a cache above it treats
    /// every request as credentialed (stored only under a partition). The value stands for
    /// whichever token is sent (never the token itself): within one partition, one user, a
    /// response that varies on the header is matched whatever the token is.
    public func credentialHeaders(for url: URL) -> [String: String] {
        requestEngine.credentialHeaders(for: url).merging([tokenHeaderName: "(token)"]) { _, token in token }
    }

    deinit {
        admission?.deadlines.shutdown()
    }

    /// Runs `body` holding a place in the admission gate, if there is one. A request with a
    /// deadline (a point on the coordinator's clock) waits for its place until then at most, and
    /// then fails with `NetworkError.deadlineExceeded`, having sent nothing.
    private func admitted<T>(by deadline: Duration?, _ body: () async throws -> T) async throws -> T {
        guard let (gate, deadlines) = admission else { return try await body() }
        do {
            if let deadline {
                // A deadline already past: a free place is taken (and `body` fails at once),
                // else the wait ends as soon as it starts.
                try await gate.enter(timeout: deadline - coordinator.time.now(), on: deadlines)
            } else {
                try await gate.enter()
            }
        } catch is AdmissionGate.TimedOut {
            throw NetworkError.deadlineExceeded
        } catch {
            throw NetworkError.cancelled
        }
        defer { gate.leave() }
        return try await body()
    }

    /// The request to send with `token` in its token header (the caller's request is never
    /// changed, and a retry carries the new token), its deadline what is left of `deadline` (a
    /// point on the coordinator's clock); `NetworkError.deadlineExceeded` when nothing is left.
    private func authorized(_ request: PreparedRequest, _ token: String, by deadline: Duration?) throws(NetworkError) -> PreparedRequest {
        var outgoing = request.settingHeader(tokenHeaderName, to: tokenPrefix + token)
        if let deadline {
            let left = deadline - coordinator.time.now()
            guard left > .zero else { throw .deadlineExceeded }
            outgoing.deadline = left
        }
        return outgoing
    }

    /// Runs a coordinator call, reporting its cancellation the way the engines do; with a
    /// deadline already past, it fails at once with `deadlineExceeded` and asks for no token.
    private func token(
        by deadline: Duration?,
        _ body: () async throws -> TokenRefreshStateMachine.IssuedToken
    ) async throws -> TokenRefreshStateMachine.IssuedToken {
        if let deadline, deadline <= coordinator.time.now() { throw NetworkError.deadlineExceeded }
        do {
            return try await body()
        } catch is CancellationError {
            throw NetworkError.cancelled
        }
    }
}
