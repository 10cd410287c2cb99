/// The decisions of `TokenRefreshCoordinator`, as a value: which token a request carries, when a
/// refresh starts, who waits for it, and what everyone gets when it ends.
///
/// It performs no I/O, reads no clock and holds no continuations: every event takes the time as
/// an argument and returns an `Action` (or a `Completion`) that the coordinator carries out. So
/// every transition is unit-tested by hand, without a network, a clock or a task.
///
/// Vocabulary:
/// - **generation**: every distinct token the coordinator hands out gets the next number (0 means
///   "no token yet"). A refreshed token always gets a new generation, even if the server returned
///   the same string.
/// - **epoch**: how many refreshes have finished (succeeded, failed or timed out).
/// - **stamp**: the generation and epoch a request's token was handed out at. A 401 is judged by
///   it: it tells whether the request was sent with an older token than the current one, and
///   whether it was already on its way when a refresh failed.
/// - **refresh id**: every refresh the machine starts gets the next number. Its result and its
///   timeout are reported with it, so that a result arriving after the refresh was abandoned (it
///   timed out) is told apart from the result of the refresh in flight.
struct TokenRefreshStateMachine: Sendable {
    typealias WaiterID = UInt64
    typealias RefreshID = UInt64

    struct Configuration: Sendable {
        /// At most this many refreshes may start within `window` (at least 1).
        var maxRefreshes: Int
        /// The loop guard's sliding window; zero or negative disables the guard.
        var window: Duration
        /// A token this close to its known expiry is refreshed in the background.
        var proactiveRefreshLead: Duration
        /// How long after its start a refresh is abandoned (its waiters fail with
        /// `AuthError.refreshTimedOut`); zero or negative: never.
        var refreshTimeout: Duration

        init(maxRefreshes: Int, window: Duration, proactiveRefreshLead: Duration, refreshTimeout: Duration = .seconds(30)) {
            self.maxRefreshes = max(1, maxRefreshes)
            self.window = window
            self.proactiveRefreshLead = max(.zero, proactiveRefreshLead)
            self.refreshTimeout = refreshTimeout
        }

        /// Whether refreshes time out at all.
        var hasRefreshTimeout: Bool { refreshTimeout > .zero }
    }

    /// What the coordinator knew when it handed out a token (see the type's documentation).
    struct Stamp: Sendable, Hashable {
        var generation: UInt64
        var epoch: UInt64
    }

    /// A token to send, with the stamp its 401 will be judged by.
    struct IssuedToken: Sendable, Equatable {
        let token: String
        let stamp: Stamp
    }

    /// Why a refresh runs. It decides what requests about to send do meanwhile.
    enum RefreshReason: Sendable, Equatable {
        /// A server answered 401 to the current token.
        case unauthorized
        /// The provider has no token.
        case noToken
        /// The current token's expiry has passed.
        case expired
        /// The current token expires soon but still works.
        case proactive
        /// `TokenRefreshCoordinator.refresh()` was called.
        case explicit

        /// Whether the current token is known to be unusable, so that a request about to send it
        /// waits for the refresh instead of sending a request the server will reject.
        var rejectsCurrentToken: Bool {
            switch self {
            case .unauthorized, .noToken, .expired: return true
            case .proactive, .explicit: return false
            }
        }
    }

    /// What the coordinator must do for the request (or caller) that raised an event.
    enum Action: Sendable {
        /// Send (or retry) now with this token.
        case send(IssuedToken)
        /// Send now with this token, which is new to the coordinator; read its expiry from the
        /// provider and report it with `expiryRead(generation:expiresAt:now:)`.
        case sendAndReadExpiry(IssuedToken)
        /// Send now with this token, and start refresh `RefreshID` in the background (nobody
        /// waits for it yet); report its end with `refreshSucceeded` or `refreshFailed`, and arm
        /// its timeout (`refreshTimedOut`) when `Configuration.hasRefreshTimeout`.
        case sendAndStartRefresh(IssuedToken, RefreshID)
        /// The caller joined the refresh in flight as this waiter: wait for its `Completion`.
        case wait(WaiterID)
        /// The caller is the first waiter of refresh `RefreshID`, which the coordinator must start
        /// now (and arm its timeout, as for `sendAndStartRefresh`).
        case startRefreshAndWait(WaiterID, RefreshID)
        /// Fail the caller with this error; nothing more is sent for its request.
        case fail(AuthError)
    }

    /// The end of a refresh: answer these waiters (the ones still waiting) with `outcome`. For
    /// the late result of an abandoned refresh, `waiters` is empty and `outcome` tells whether its
    /// token was adopted (`.success`) or dropped.
    struct Completion: Sendable {
        let waiters: [WaiterID]
        let outcome: Result<IssuedToken, AuthError>
    }

    // MARK: - State

    private struct Current: Sendable {
        var token: String
        var generation: UInt64
        /// When the token stops being valid, on the coordinator's clock; `nil` when unknown.
        var expiresAt: Duration?
        /// Set once the expiry has triggered a refresh (or was judged unreliable), so that one
        /// token's expiry triggers at most one refresh, whatever the device's clock says.
        var expiryHandled: Bool
    }

    private struct Refresh: Sendable {
        let id: RefreshID
        var waiters: Set<WaiterID>
        var reason: RefreshReason
        /// The generation that was current when the refresh started.
        let generation: UInt64
    }

    private struct Failure: Sendable {
        /// The generation the failed refresh was meant to replace.
        let generation: UInt64
        /// The epoch right after the failure.
        let epoch: UInt64
        let error: AuthError
    }

    private enum Phase: Sendable {
        /// No refresh runs.
        case idle
        /// One refresh runs; every caller that needs a new token joins it.
        case refreshing(Refresh)
        /// Transient, inside a mutating method only: lets `Refresh.waiters` be mutated in place
        /// (10 000 joins would otherwise copy the set 10 000 times).
        case modifying
    }

    /// How many replaced tokens are remembered (by hash) to recognise a stale provider read.
    static let historyLimit = 8
    /// How many abandoned (timed-out) refreshes are remembered, so that their late results can
    /// still be used; the result of an older one is dropped (the provider has persisted it anyway).
    static let abandonedLimit = 8

    let configuration: Configuration
    private var phase: Phase = .idle
    private var current: Current?
    /// Hashes and generations of tokens that were current before `current`, oldest first. Hashes,
    /// not strings, so that replaced secrets are not kept alive.
    private var previous: [(hash: Int, generation: UInt64)] = []
    private var lastGeneration: UInt64 = 0
    private var epoch: UInt64 = 0
    private var lastFailure: Failure?
    /// Start times of the refreshes inside the loop guard's window, oldest first.
    private var refreshStarts: [Duration] = []
    private var lastWaiterID: WaiterID = 0
    private var lastRefreshID: RefreshID = 0
    /// Refreshes that timed out and may still return, oldest first, with the generation each was
    /// meant to replace.
    private var abandoned: [(id: RefreshID, generation: UInt64)] = []

    init(configuration: Configuration) {
        self.configuration = configuration
    }

    // MARK: - Events

    /// The stamp to take just before reading the provider's token, to pass to `tokenRead`.
    var stamp: Stamp {
        Stamp(generation: current?.generation ?? 0, epoch: epoch)
    }

    /// A request read `token` from the provider (the read began at `stamp`) and needs a token to send.
    mutating func tokenRead(_ token: String?, stamp: Stamp, now: Duration) -> Action {
        guard let token, !token.isEmpty else {
            // No token: exactly like a 401 for whatever was current when the read began. If a
            // refresh finished while the provider was being read (its nil was stale), the new
            // token is used; if one is running, the request waits; if one failed meanwhile, the
            // request shares its error instead of starting another.
            return needToken(after: stamp, reason: .noToken, now: now)
        }
        if let current, current.token == token {
            return use(now: now)
        }
        if current != nil, previous.contains(where: { $0.hash == Self.hash(token) }) {
            // A stale read: the provider returned a token this coordinator has already replaced
            // (its read began before a refresh persisted the new one). The newest token wins;
            // sending the old one would earn a 401 and a retry for nothing.
            return use(now: now)
        }
        // A token never seen: the first read, or the app changed the token itself (a login, its
        // own refresh, or the provider persisting a refresh result before returning it). It
        // becomes current with a new generation, even while a refresh runs.
        adopt(token, expiresAt: nil, expiryHandled: false)
        return .sendAndReadExpiry(issue())
    }

    /// The server answered 401 to a request sent with the token stamped `stamp`.
    mutating func unauthorized(_ stamp: Stamp, now: Duration) -> Action {
        needToken(after: stamp, reason: .unauthorized, now: now)
    }

    /// `TokenRefreshCoordinator.refresh()`: join the refresh in flight, or start one (loop guard
    /// permitting), whatever the generations say.
    mutating func refreshRequested(now: Duration) -> Action {
        switch phase {
        case .refreshing:
            return .wait(join(upgradingTo: nil))
        case .idle, .modifying:
            guard mayStartRefresh(now: now) else { return .fail(excessiveRefresh) }
            return startRefreshAndWait(.explicit, now: now)
        }
    }

    /// The provider reported the expiry of the token of `generation` (after `.sendAndReadExpiry`).
    mutating func expiryRead(generation: UInt64, expiresAt: Duration?, now: Duration) {
        // The token may have been replaced while the provider was asked; then the expiry is not
        // this token's and is dropped.
        guard let expiresAt, current?.generation == generation, current?.expiresAt == nil else { return }
        current?.expiresAt = expiresAt
    }

    /// Refresh `id` returned `token` (already checked to be non-empty and header-safe);
    /// `expiresAt` is its expiry as the provider reported it, if any.
    ///
    /// Usually `id` is the refresh in flight: its waiters get the token. If it was abandoned
    /// because it timed out, its waiters have already been answered; see `lateRefreshSucceeded`.
    mutating func refreshSucceeded(_ id: RefreshID, token: String, expiresAt: Duration?, now: Duration) -> Completion {
        guard case .refreshing(let refresh) = phase, refresh.id == id else {
            return lateRefreshSucceeded(id, token: token, expiresAt: expiresAt, now: now)
        }
        phase = .idle
        epoch += 1
        lastFailure = nil
        // A token that already looks (nearly) expired on arrival says the device's clock or the
        // provider's expiry is wrong: its expiry is ignored, or every request would refresh.
        let unreliableExpiry = expiresAt.map { now >= $0 - configuration.proactiveRefreshLead } ?? false
        if let current, current.token == token, current.generation > refresh.generation {
            // The provider persisted the new token before returning it, and a request read it and
            // made it current while the refresh was still running: it keeps its generation, so
            // that the requests already sent with it are not treated as stale.
            self.current?.expiresAt = expiresAt ?? current.expiresAt
            self.current?.expiryHandled = unreliableExpiry
        } else {
            // Always a new generation, even if the server returned the same string: requests
            // sent before the refresh then retry with it instead of starting another refresh.
            adopt(token, expiresAt: expiresAt, expiryHandled: unreliableExpiry)
        }
        return Completion(waiters: Array(refresh.waiters), outcome: .success(issue()))
    }

    /// Refresh `id` failed with `error`. If it is the refresh in flight, its waiters get `error`;
    /// so does any request already on its way with the same token whose 401 arrives later (see
    /// `needToken`). The failure of an abandoned refresh changes nothing: its waiters and
    /// stragglers already have `AuthError.refreshTimedOut`.
    mutating func refreshFailed(_ id: RefreshID, _ error: AuthError) -> Completion {
        guard case .refreshing(let refresh) = phase, refresh.id == id else {
            abandoned.removeAll { $0.id == id }
            return Completion(waiters: [], outcome: .failure(error))
        }
        phase = .idle
        epoch += 1
        lastFailure = Failure(generation: refresh.generation, epoch: epoch, error: error)
        return Completion(waiters: Array(refresh.waiters), outcome: .failure(error))
    }

    /// Refresh `id` has run for `Configuration.refreshTimeout` (the coordinator's timer fired).
    ///
    /// If it is still the refresh in flight, it is **abandoned**: its waiters get
    /// `AuthError.refreshTimedOut`, and so does a request already on its way with the token it was
    /// meant to replace whose 401 arrives later (exactly like a failure, so a storm of stragglers
    /// does not start a refresh each). The machine goes idle, so the next request that needs a
    /// token may start a new refresh (loop guard permitting): a provider that hangs forever must
    /// not wedge authentication forever. The provider's call is not cancelled (cancelling a
    /// refresh half-way can lose a rotated refresh token); if it returns later, see
    /// `lateRefreshSucceeded`.
    ///
    /// If the refresh has already ended, the timer lost the race with its result: nothing happens.
    mutating func refreshTimedOut(_ id: RefreshID) -> Completion {
        guard case .refreshing(let refresh) = phase, refresh.id == id else {
            return Completion(waiters: [], outcome: .failure(refreshTimedOut))
        }
        phase = .idle
        epoch += 1
        lastFailure = Failure(generation: refresh.generation, epoch: epoch, error: refreshTimedOut)
        abandoned.append((id, refresh.generation))
        if abandoned.count > Self.abandonedLimit { abandoned.removeFirst(abandoned.count - Self.abandonedLimit) }
        return Completion(waiters: Array(refresh.waiters), outcome: .failure(refreshTimedOut))
    }

    /// Waiter `id` was cancelled. It is forgotten; the refresh itself goes on (it may rotate a
    /// refresh token server-side, and other requests will want its result). Returns whether
    /// `id` was waiting.
    @discardableResult
    mutating func waiterLeft(_ id: WaiterID) -> Bool {
        guard case .refreshing(var refresh) = phase else { return false }
        phase = .modifying
        let removed = refresh.waiters.remove(id) != nil
        phase = .refreshing(refresh)
        return removed
    }

    /// The token a request would send if `token` was what the provider returned, without
    /// changing anything: the newest known one for a stale read, else `token` itself.
    func newestToken(for token: String?) -> String? {
        guard let token, !token.isEmpty else { return nil }
        guard let current, current.token != token else { return token }
        return previous.contains(where: { $0.hash == Self.hash(token) }) ? current.token : token
    }

    // MARK: - Observation (tests and diagnostics)

    var isRefreshing: Bool {
        if case .refreshing = phase { return true }
        return false
    }

    var waiterCount: Int {
        if case .refreshing(let refresh) = phase { return refresh.waiters.count }
        return 0
    }

    var currentGeneration: UInt64 { current?.generation ?? 0 }

    var refreshReason: RefreshReason? {
        if case .refreshing(let refresh) = phase { return refresh.reason }
        return nil
    }

    /// The id of the refresh in flight, if one runs.
    var refreshInFlight: RefreshID? {
        if case .refreshing(let refresh) = phase { return refresh.id }
        return nil
    }

    /// How many abandoned (timed-out) refreshes may still report a late result.
    var abandonedCount: Int { abandoned.count }

    // MARK: - Late results

    /// An abandoned refresh returned `token` after all. Its waiters were answered at the timeout,
    /// so nobody is answered now; the token becomes current (a new generation, as for any
    /// refresh) only if **no token was adopted since the refresh started**: neither a later
    /// refresh's nor one the app set. A late result never replaces a newer token. Adopting it
    /// while another refresh runs is what happens when the app changes the token meanwhile
    /// (`tokenRead`): requests send it at once instead of waiting for that refresh, and that
    /// refresh's own waiters still get that refresh's result.
    private mutating func lateRefreshSucceeded(_ id: RefreshID, token: String, expiresAt: Duration?, now: Duration) -> Completion {
        guard let index = abandoned.firstIndex(where: { $0.id == id }) else {
            // Not a refresh this machine abandoned (the coordinator never reports one it did not
            // start), or one forgotten past `abandonedLimit`. Nothing to answer.
            return Completion(waiters: [], outcome: .failure(refreshTimedOut))
        }
        let replacing = abandoned.remove(at: index).generation
        guard (current?.generation ?? 0) == replacing else {
            // Something newer is current already: a late token must not overwrite it.
            return Completion(waiters: [], outcome: .failure(refreshTimedOut))
        }
        lastFailure = nil
        let unreliableExpiry = expiresAt.map { now >= $0 - configuration.proactiveRefreshLead } ?? false
        adopt(token, expiresAt: expiresAt, expiryHandled: unreliableExpiry)
        return Completion(waiters: [], outcome: .success(issue()))
    }

    // MARK: - Transitions

    /// A request can send the current token, unless its expiry says otherwise or a refresh has
    /// already been started because the server rejected it.
    private mutating func use(now: Duration) -> Action {
        guard let current else { return needToken(after: stamp, reason: .noToken, now: now) }
        if let expiresAt = current.expiresAt, !current.expiryHandled,
            now >= expiresAt - configuration.proactiveRefreshLead
        {
            // The first request to see the token near (or past) its expiry handles it, once.
            self.current?.expiryHandled = true
            let expired = now >= expiresAt
            switch phase {
            case .idle, .modifying:
                guard mayStartRefresh(now: now) else {
                    // The loop guard says no: send the token anyway and let the server decide,
                    // rather than fail a request over a clock that may be wrong.
                    return .send(issue())
                }
                if expired {
                    return startRefreshAndWait(.expired, now: now)
                }
                let started = startRefresh(.proactive, now: now, withWaiter: false)
                return .sendAndStartRefresh(issue(), started.refresh)
            case .refreshing:
                // A refresh (proactive or explicit) already runs. An expired token waits for it,
                // and so will the requests after this one; one that is only near expiry is sent.
                if expired { return .wait(join(upgradingTo: .expired)) }
                return .send(issue())
            }
        }
        if case .refreshing(let refresh) = phase, refresh.reason.rejectsCurrentToken,
            refresh.generation == current.generation
        {
            // The server already rejected this token and its replacement is on its way: wait for
            // it rather than send a request that will earn a 401 and a retry. This is what keeps
            // a 401 storm from doubling the traffic.
            return .wait(join(upgradingTo: nil))
        }
        return .send(issue())
    }

    /// Someone needs a newer token than the one stamped `stamp` (a 401, or no token at all).
    private mutating func needToken(after stamp: Stamp, reason: RefreshReason, now: Duration) -> Action {
        if let current, current.generation > stamp.generation {
            // The request was sent with an older token than the current one (a 401 that arrives
            // after a refresh finished, or one sent before the app changed the token): retry with
            // the current token; refreshing again would throw away a token nobody has tried.
            return .send(issue())
        }
        switch phase {
        case .refreshing:
            // Every concurrent 401 shares the refresh in flight. If that refresh was only
            // proactive or explicit, the server has now rejected the current token: later
            // requests wait for the refresh too.
            return .wait(join(upgradingTo: reason))
        case .idle, .modifying:
            if let lastFailure, lastFailure.generation == stamp.generation, lastFailure.epoch > stamp.epoch {
                // The request was already on its way with this token when the refresh meant to
                // replace it failed: it gets that same error instead of starting a second refresh.
                // A storm of in-flight 401s thus costs one failed refresh, not one per straggler;
                // requests that start after the failure may try again.
                return .fail(lastFailure.error)
            }
            guard mayStartRefresh(now: now) else { return .fail(excessiveRefresh) }
            return startRefreshAndWait(reason, now: now)
        }
    }

    /// Enters `.refreshing` with a new refresh id and counts the start for the loop guard.
    /// Returns the first waiter's id (0 when `withWaiter` is false) and the refresh's id.
    private mutating func startRefresh(
        _ reason: RefreshReason, now: Duration, withWaiter: Bool
    ) -> (waiter: WaiterID, refresh: RefreshID) {
        var waiters = Set<WaiterID>()
        var first: WaiterID = 0
        if withWaiter {
            lastWaiterID += 1
            first = lastWaiterID
            waiters.insert(first)
        }
        if configuration.window > .zero { refreshStarts.append(now) }
        lastRefreshID += 1
        phase = .refreshing(Refresh(id: lastRefreshID, waiters: waiters, reason: reason, generation: current?.generation ?? 0))
        return (first, lastRefreshID)
    }

    private mutating func startRefreshAndWait(_ reason: RefreshReason, now: Duration) -> Action {
        let started = startRefresh(reason, now: now, withWaiter: true)
        return .startRefreshAndWait(started.waiter, started.refresh)
    }

    /// Adds a waiter to the refresh in flight, optionally marking the current token as rejected.
    private mutating func join(upgradingTo reason: RefreshReason?) -> WaiterID {
        guard case .refreshing(var refresh) = phase else { return 0 }
        phase = .modifying  // drop the enum's reference so that the set is mutated in place
        lastWaiterID += 1
        refresh.waiters.insert(lastWaiterID)
        if let reason, reason.rejectsCurrentToken, !refresh.reason.rejectsCurrentToken {
            refresh.reason = reason
        }
        phase = .refreshing(refresh)
        return lastWaiterID
    }

    /// The loop guard: fewer than `maxRefreshes` starts within the window ending `now`.
    private mutating func mayStartRefresh(now: Duration) -> Bool {
        guard configuration.window > .zero else { return true }
        refreshStarts.removeAll { now - $0 >= configuration.window }
        return refreshStarts.count < configuration.maxRefreshes
    }

    private var excessiveRefresh: AuthError {
        .excessiveRefresh(refreshes: configuration.maxRefreshes, window: configuration.window)
    }

    private var refreshTimedOut: AuthError {
        .refreshTimedOut(after: configuration.refreshTimeout)
    }

    private mutating func adopt(_ token: String, expiresAt: Duration?, expiryHandled: Bool) {
        if let current {
            previous.append((Self.hash(current.token), current.generation))
            if previous.count > Self.historyLimit { previous.removeFirst(previous.count - Self.historyLimit) }
        }
        lastGeneration += 1
        current = Current(token: token, generation: lastGeneration, expiresAt: expiresAt, expiryHandled: expiryHandled)
    }

    private func issue() -> IssuedToken {
        IssuedToken(token: current?.token ?? "", stamp: stamp)
    }

    private static func hash(_ token: String) -> Int {
        var hasher = Hasher()
        hasher.combine(token)
        return hasher.finalize()
    }
}
