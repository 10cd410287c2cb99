import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore

/// Hands out access tokens and runs at most one `TokenProvider.refreshToken()` at a time, shared
/// by every request that needs a new token. `AuthenticatedRequestEngine` uses it; share one
/// coordinator between every engine that talks to the same auth server.
///
/// ```swift
/// let coordinator = TokenRefreshCoordinator(provider: KeychainTokenProvider())
/// let engine = AuthenticatedRequestEngine(coordinator: coordinator)
/// ```
///
/// What a caller can rely on (Sources/Auth/Auth.docc/AuthGuide.md has every path):
/// - **One refresh per storm.** Every token it hands out has a generation. A 401 to a request sent
///   with an older generation than the current one is retried with the current token and
///   refreshes nothing (this covers a late 401 that arrives after a refresh finished). Every other
///   401 joins the refresh in flight or starts the only one. While a refresh that replaces a
///   rejected token runs, new requests wait for it instead of sending the rejected token.
/// - **Failure.** A failed refresh fails every waiter with the same
///   `AuthError.refreshFailed(underlying:)`, and so does every request that was already on its way
///   with the rejected token. Nobody hangs. A request that starts after the failure may try again.
/// - **Loop guard.** More than `maxRefreshes` refreshes within `window` → the request that would
///   start one more gets `AuthError.excessiveRefresh` and is not retried.
/// - **No token.** When the provider returns `nil` (or an empty string), the coordinator refreshes
///   first; nothing is sent without a token.
/// - **Expiry.** When the provider reports an expiry (`TokenProvider.tokenExpiry()`), a token within
///   `proactiveRefreshLead` of it is refreshed in the background while requests keep using it, and
///   an expired one is replaced before requests are sent. Each token's expiry triggers at most one
///   refresh, so a wrong device clock cannot cause a refresh loop.
/// - **Refresh timeout.** Nobody waits longer than `refreshTimeout` (default 30 s, on the
///   coordinator's clock) for a refresh: when it has not returned by then, every waiter gets
///   `AuthError.refreshTimedOut` and the refresh is abandoned, so the next request that needs a
///   token may start a new one (loop guard permitting). The abandoned call is not cancelled; if it
///   returns later, its token is used unless a newer one has been obtained meanwhile.
/// - **Cancellation.** A cancelled waiter is answered at once; the refresh itself always runs to
///   its end and its token is kept, even when every waiter has left, because cancelling it half-way
///   can lose a rotated refresh token.
/// - **Secrets.** Tokens never appear in errors, descriptions or logs; replaced tokens are
///   remembered only by hash.
///
/// Its state sits behind a lock, not in an actor: every request reads it, which must not cost an
/// actor hop, and a cancelled waiter must be removed synchronously from its cancellation handler.
public final class TokenRefreshCoordinator: Sendable {
    typealias Machine = TokenRefreshStateMachine
    typealias WaitOutcome = Result<Machine.IssuedToken, AuthError>

    struct State: Sendable {
        var machine: Machine
        /// Callers waiting for a refresh, tagged with their id in the machine; resumed with the
        /// refresh's outcome, or `nil` when cancelled. A ticket is issued in the same critical
        /// section as the machine's `.wait`, so an outcome that arrives before the caller has
        /// suspended is handed to its ticket rather than lost.
        var waiters = WaiterList<WaitOutcome?, Machine.WaiterID>()
        /// The armed timeout of each refresh in flight, cancelled when its result arrives first.
        var timers: [Machine.RefreshID: Task<Void, Never>] = [:]
        /// Callers of `waitUntil` (tests), tagged with their condition: each resumes once it holds.
        var watchers = WaiterList<Void, @Sendable (Machine) -> Bool>()
    }

    /// The token source this coordinator reads and refreshes.
    public let provider: any TokenProvider
    /// At most this many refreshes start within `window` (the loop guard). At least 1.
    public let maxRefreshes: Int
    /// The loop guard's sliding window, on the coordinator's clock. Zero disables the guard.
    public let window: Duration
    /// How long before a reported expiry a token is refreshed in the background.
    public let proactiveRefreshLead: Duration
    /// The longest anyone waits for a refresh, from its start, on the coordinator's clock; then
    /// the waiters get `AuthError.refreshTimedOut` and the refresh is abandoned. Zero or negative:
    /// no limit.
    public let refreshTimeout: Duration

    let state: Locked<State>
    let time: TimeSource
    /// Ends the waits of callers whose request deadline comes before their refresh ends: one
    /// timer for all of them, armed only for a caller that must wait.
    private let waitDeadlines: DeadlineTimer
    /// The wall-clock moment the clock's zero corresponds to, to place a provider's expiry `Date`
    /// on the clock (so a `ManualClock` moves expiries in tests, as it does TTLs in the queue).
    private let wallClockOrigin: Date

    /// - Parameters:
    ///   - provider: reads and refreshes the token.
    ///   - maxRefreshes: the loop guard's limit: at most this many refreshes start within
    ///     `window` (default 5; values below 1 count as 1).
    ///   - window: the loop guard's sliding window (default 30 s; zero disables the guard).
    ///   - proactiveRefreshLead: a token this close to the expiry its provider reports is refreshed
    ///     in the background (default 60 s; only used when `tokenExpiry()` returns a date).
    ///   - refreshTimeout: the longest a caller waits for a refresh, measured from the refresh's
    ///     start (default 30 s). Past it, waiters get `AuthError.refreshTimedOut` and the refresh is
    ///     abandoned (not cancelled). Raise it if your `refreshToken()` may legitimately take longer
    ///     (it waits for the user to sign in, say); zero or negative disables it.
    ///   - clock: the clock the loop guard, expiries and the refresh timeout are measured on
    ///     (`ManualClock` in tests).
    public init(
        provider: any TokenProvider,
        maxRefreshes: Int = 5,
        window: Duration = .seconds(30),
        proactiveRefreshLead: Duration = .seconds(60),
        refreshTimeout: Duration = .seconds(30),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        let configuration = Machine.Configuration(
            maxRefreshes: maxRefreshes,
            window: window,
            proactiveRefreshLead: proactiveRefreshLead,
            refreshTimeout: refreshTimeout
        )
        self.provider = provider
        self.maxRefreshes = configuration.maxRefreshes
        self.window = configuration.window
        self.proactiveRefreshLead = configuration.proactiveRefreshLead
        self.refreshTimeout = configuration.refreshTimeout
        self.state = Locked(State(machine: Machine(configuration: configuration)))
        self.time = TimeSource(clock)
        self.waitDeadlines = DeadlineTimer(time: time)
        self.wallClockOrigin = SimulationPoints.date()  // Date() but under a simulation
    }

    /// The token the next request would carry, without refreshing: the provider's current token,
    /// or a newer one this coordinator obtained when the provider's answer is one it has already
    /// replaced. `nil` when the provider has none.
    public func currentToken() async -> String? {
        let token = await provider.currentToken()
        return state.withLock { $0.machine.newestToken(for: token) }
    }

    /// Refreshes now, or joins the refresh in flight, and returns the new token. Requests keep
    /// using the current token meanwhile (unless a 401 has rejected it).
    ///
    /// - Throws: `AuthError.refreshFailed` or `.invalidToken` when the refresh fails,
    ///   `AuthError.refreshTimedOut` when it has not returned within `refreshTimeout`,
    ///   `AuthError.excessiveRefresh` when the loop guard refuses to start one, and
    ///   `CancellationError` when the calling task is cancelled (the refresh goes on).
    public func refresh() async throws -> String {
        return try await perform(decide { $0.refreshRequested(now: time.now()) }).token
    }

    // MARK: - Used by AuthenticatedRequestEngine

    /// The token to send a request with: the current one, or a new one if there is none yet or
    /// the current one is known to be unusable (then this waits for the shared refresh).
    ///
    /// - Parameter deadline: when the caller's request must be done, on this coordinator's clock
    ///   (`time.now()` based); a wait for a refresh ends there. `nil`: no bound but `refreshTimeout`.
    /// - Throws: `AuthError` when no token can be had, `CancellationError` when cancelled,
    ///   `NetworkError.deadlineExceeded` when `deadline` comes first (the refresh goes on).
    func tokenForRequest(deadline: Duration? = nil) async throws -> Machine.IssuedToken {
        let stamp = state.withLock { $0.machine.stamp }
        let token = await provider.currentToken()
        return try await perform(decide { $0.tokenRead(token, stamp: stamp, now: time.now()) }, deadline: deadline)
    }

    /// The token to retry with after the server answered 401 to `rejected`: the current token if
    /// it is newer, else the result of the shared refresh.
    ///
    /// - Throws: as `tokenForRequest(deadline:)`.
    func tokenAfterUnauthorized(_ rejected: Machine.IssuedToken, deadline: Duration? = nil) async throws -> Machine.IssuedToken {
        return try await perform(decide { $0.unauthorized(rejected.stamp, now: time.now()) }, deadline: deadline)
    }

    // MARK: - Performing the machine's actions

    /// What the machine decided, and for a caller that must wait, its place in the waiting line.
    private struct Decision {
        let action: Machine.Action
        let ticket: WaiterList<WaitOutcome?, Machine.WaiterID>.Ticket?
    }

    /// Runs one of the machine's inputs and, when it says wait, issues the caller's ticket in the
    /// same critical section.
    private func decide(_ input: (inout Machine) -> Machine.Action) -> Decision {
        state.withLock { state in
            let action = input(&state.machine)
            switch action {
            case .wait(let id), .startRefreshAndWait(let id, _):
                return Decision(action: action, ticket: state.waiters.issue(id))
            case .send, .sendAndReadExpiry, .sendAndStartRefresh, .fail:
                return Decision(action: action, ticket: nil)
            }
        }
    }

    private func perform(_ decision: Decision, deadline: Duration? = nil) async throws -> Machine.IssuedToken {
        switch decision.action {
        case .send(let issued):
            return issued
        case .sendAndReadExpiry(let issued):
            if let expiry = await provider.tokenExpiry() {
                let expiresAt = clockTime(of: expiry)
                state.withLock {
                    $0.machine.expiryRead(generation: issued.stamp.generation, expiresAt: expiresAt, now: time.now())
                }
            }
            return issued
        case .sendAndStartRefresh(let issued, let refresh):
            startRefresh(refresh)
            return issued
        case .wait(let id):
            notifyWatchers()
            return try await waitForRefresh(id, decision.ticket, deadline: deadline)
        case .startRefreshAndWait(let id, let refresh):
            startRefresh(refresh)
            notifyWatchers()
            return try await waitForRefresh(id, decision.ticket, deadline: deadline)
        case .fail(let error):
            throw error
        }
    }

    /// Arms refresh `id`'s timeout, then runs the provider's refresh in a task of its own, so that
    /// no caller's cancellation reaches it, and reports its end to the machine.
    private func startRefresh(_ id: Machine.RefreshID) {
        if refreshTimeout > .zero {
            // The deadline is taken now, at the start, so that a timer task that runs late still
            // fires `refreshTimeout` after the start. The timer is registered before the refresh
            // task exists, so that the refresh's end always finds (and cancels) it; a timer that
            // has already fired (a tiny timeout) is not registered, so none is left behind.
            let deadline = time.now() + refreshTimeout
            let timer = Task { [time] in
                do { try await time.sleep(deadline - time.now()) } catch { return }
                refreshTimedOut(id)
            }
            state.withLock { state in
                if state.machine.refreshInFlight == id { state.timers[id] = timer }
            }
        }
        Task {
            let result: Result<String, AuthError>
            do {
                let token = try await provider.refreshToken()
                result = Self.isUsable(token) ? .success(token) : .failure(.invalidToken)
            } catch {
                result = .failure(.refreshFailed(underlying: error))
            }
            var expiresAt: Duration?
            if case .success = result, let expiry = await provider.tokenExpiry() {
                expiresAt = clockTime(of: expiry)
            }
            finishRefresh(id, result, expiresAt: expiresAt)
        }
    }

    private func finishRefresh(_ id: Machine.RefreshID, _ result: Result<String, AuthError>, expiresAt: Duration?) {
        let (timer, ready, outcome) = state.withLock { state in
            let completion: Machine.Completion
            switch result {
            case .success(let token):
                completion = state.machine.refreshSucceeded(id, token: token, expiresAt: expiresAt, now: time.now())
            case .failure(let error):
                completion = state.machine.refreshFailed(id, error)
            }
            let (ready, outcome) = Self.take(completion, from: &state)
            return (state.timers.removeValue(forKey: id), ready, outcome)
        }
        // Disarmed before anyone is answered, so that no timer outlives the refresh it guards.
        timer?.cancel()
        for waiter in ready { waiter.resume(returning: outcome) }
        notifyWatchers()
    }

    /// Refresh `id`'s timer fired: the machine abandons the refresh if it still runs, and its
    /// waiters get `AuthError.refreshTimedOut`.
    private func refreshTimedOut(_ id: Machine.RefreshID) {
        let (ready, outcome) = state.withLock { state in
            state.timers[id] = nil
            return Self.take(state.machine.refreshTimedOut(id), from: &state)
        }
        for waiter in ready { waiter.resume(returning: outcome) }
        notifyWatchers()
    }

    /// The waiters to resume with `completion`'s outcome; those in line but not yet suspended
    /// are handed it and take it as they suspend.
    private static func take(
        _ completion: Machine.Completion, from state: inout State
    ) -> ([WaiterList<WaitOutcome?, Machine.WaiterID>.Waiter], WaitOutcome) {
        guard !completion.waiters.isEmpty else { return ([], completion.outcome) }
        let ids = Set(completion.waiters)
        return (state.waiters.resumeAll(where: { ids.contains($0) }, with: completion.outcome), completion.outcome)
    }

    /// Suspends waiter `id` until its refresh ends; answers at once when the caller is cancelled,
    /// or when `deadline` (on `time`) passes first — the waiter leaves as a cancelled one does,
    /// and the refresh goes on for the others.
    private func waitForRefresh(
        _ id: Machine.WaiterID, _ ticket: WaiterList<WaitOutcome?, Machine.WaiterID>.Ticket?, deadline: Duration?
    ) async throws -> Machine.IssuedToken {
        guard let ticket else { preconditionFailure("a waiting decision always carries a ticket") }
        let state = self.state
        @Sendable func leave() -> Bool {
            let waiter = state.withLock { state in
                let waiter = state.waiters.cancel(ticket, with: nil)
                if waiter != nil { _ = state.machine.waiterLeft(id) }
                return waiter
            }
            waiter?.resume(returning: nil)
            return waiter != nil
        }
        // Set only by the deadline's timer, and read after the wait: a `nil` outcome is then the
        // deadline's, not a cancellation.
        let passedDeadline = deadline.map { _ in Locked(false) }
        let timer = deadline.map { deadline in
            waitDeadlines.schedule(after: deadline - time.now()) {
                passedDeadline?.withLock { $0 = true }
                _ = leave()
            }
        }
        defer { if let timer { waitDeadlines.cancel(timer) } }
        let outcome = await suspendCancellably { continuation in
            state.withLock { state -> WaitOutcome?? in
                if let handed = state.waiters.claim(ticket) {
                    // Cancelled before it suspended: it leaves the machine's refresh too.
                    if case .none = handed { _ = state.machine.waiterLeft(id) }
                    return .some(handed)
                }
                state.waiters.park(ticket, continuation)
                return nil
            }
        } onCancel: {
            _ = leave()
        }
        switch outcome {
        case .success(let issued): return issued
        case .failure(let error): throw error
        case nil:
            if Task.isCancelled { throw CancellationError() }
            if passedDeadline?.withLock({ $0 }) == true { throw NetworkError.deadlineExceeded }
            throw CancellationError()
        }
    }

    private func notifyWatchers() {
        let ready = state.withLock { state -> [WaiterList<Void, @Sendable (Machine) -> Bool>.Waiter] in
            guard !state.watchers.isEmpty else { return [] }
            let machine = state.machine
            return state.watchers.takeAll { $0(machine) }
        }
        for watcher in ready { watcher.resume(returning: ()) }
    }

    /// `date` as a time on the coordinator's clock.
    private func clockTime(of date: Date) -> Duration {
        let seconds = date.timeIntervalSince(wallClockOrigin)
        // A date before the origin is simply "already expired": clamp to the clock's zero.
        return .clamped(seconds: seconds, upperBound: .seconds(Int64.max / 4))
    }

    /// A token can travel in a header: non-empty, no CR, LF or NUL.
    static func isUsable(_ token: String) -> Bool {
        !token.isEmpty && !token.utf8.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }
    }
}
