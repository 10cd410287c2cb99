import Foundation
@_spi(ResilienceCore) import ResilienceCore

/// One `CircuitBreaker` per authority (lower-cased `host[:port]`), so one failing host does not
/// stop calls to the others; with one stream of every breaker's state changes and manual control
/// per host.
///
/// - `breaker(forHost:)` makes a host's breaker on first use (with the registry's configuration
///   and clock) and returns the same instance afterwards. Hosts are compared lower-cased.
/// - **Bounded**: at most `maximumBreakers` breakers are kept, so a caller reaching a million
///   hosts (or hostile input choosing them) cannot grow the registry without end. When a new host
///   would exceed the bound, the least recently used breaker that is not isolated is dropped; if
///   that host comes back it starts over with a new, closed breaker. A dropped breaker keeps
///   working for whoever still holds it. Isolated breakers are never dropped (an operator's
///   decision outlives traffic), so only isolations can take the registry past its bound.
/// - `stateChanges` merges the changes of every breaker the registry made, each with its host.
///
/// Lock-based: `breaker(forHost:)` is on the request path (one dictionary look-up under a lock).
/// Finding a breaker to drop scans the registry, which only happens when it is full.
public final class CircuitBreakerRegistry: Sendable {
    /// The configuration of every breaker the registry makes.
    public let configuration: CircuitBreaker.Configuration
    /// The most breakers kept (isolated ones aside); at least 1.
    public let maximumBreakers: Int

    private struct Entry: Sendable {
        let breaker: CircuitBreaker
        var lastUsed: UInt64
    }

    private struct State: Sendable {
        var entries: [String: Entry] = [:]
        var clock: UInt64 = 0
    }

    private let state = Locked(State())
    private let time: TimeSource
    private let subscribers = StreamSubscribers<CircuitBreakerStateChange>()

    /// - Parameters:
    ///   - configuration: for every breaker.
    ///   - maximumBreakers: how many hosts' breakers are kept (values below 1 become 1).
    ///   - clock: the breakers' clock.
    public init(
        configuration: CircuitBreaker.Configuration = .init(),
        maximumBreakers: Int = 1_000,
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.configuration = configuration
        self.maximumBreakers = max(1, maximumBreakers)
        self.time = TimeSource(clock)
    }

    /// The breaker for `host` (`"example.com"` or `"example.com:8443"`; case does not matter),
    /// made on first use.
    public func breaker(forHost host: String) -> CircuitBreaker {
        breaker(key: Self.key(host))
    }

    /// The breaker for API operation `operationID` (`"createNote"`; case matters, as in an OpenAPI
    /// document) on `host` (as `breaker(forHost:)` takes it), made on first use: two APIs with an
    /// operation of the same name, or one API on two hosts, never share one. It is kept and
    /// reported (`states`, `hosts`, its changes' `host`) as `"<host> <operationID>"`, which no
    /// host's name can equal (a host has no space); isolate or reset it on the breaker itself
    /// (`isolate(host:)` and `reset(host:)` take hosts).
    public func breaker(forOperation operationID: String, onHost host: String) -> CircuitBreaker {
        breaker(key: Self.key(host) + " " + operationID)
    }

    private func breaker(key: String) -> CircuitBreaker {
        state.withLock { state in
            state.clock &+= 1
            if let entry = state.entries[key] {
                state.entries[key]?.lastUsed = state.clock
                return entry.breaker
            }
            if state.entries.count >= maximumBreakers { Self.dropLeastRecentlyUsed(&state) }
            let breaker = CircuitBreaker(configuration: configuration, host: key, time: time) { [subscribers] change in
                subscribers.yield(change)
            }
            state.entries[key] = Entry(breaker: breaker, lastUsed: state.clock)
            return breaker
        }
    }

    /// The breaker for `url`'s authority, or `nil` when the URL has no host.
    public func breaker(for url: URL) -> CircuitBreaker? {
        Self.authority(of: url).map { breaker(forHost: $0) }
    }

    /// Holds `host`'s breaker open until `reset(host:)` (making the breaker if there is none yet,
    /// so the host's next call already fails fast). See `CircuitBreaker.isolate()`.
    public func isolate(host: String) {
        breaker(forHost: host).isolate()
    }

    /// Closes `host`'s breaker with an empty window (ending an isolation). Does nothing for a host
    /// without a breaker.
    public func reset(host: String) {
        let key = Self.key(host)
        state.withLock { $0.entries[key]?.breaker }?.reset()
    }

    /// The hosts with a breaker now, sorted.
    public var hosts: [String] {
        state.withLock { Array($0.entries.keys) }.sorted()
    }

    /// Each host's breaker state now.
    public var states: [String: CircuitBreaker.State] {
        state.withLock { $0.entries.mapValues(\.breaker) }.mapValues(\.state)
    }

    /// A new stream of the state changes of every breaker this registry made, from now on, each
    /// with its `host`. In order per breaker; it ends when the consumer stops listening.
    public var stateChanges: AsyncStream<CircuitBreakerStateChange> {
        subscribers.stream()
    }

    /// The registry's key for a URL: its host lower-cased, with `:port` when the URL names a port.
    public static func authority(of url: URL) -> String? {
        guard let host = url.host, !host.isEmpty else { return nil }
        return authority(host: host, port: url.port)
    }

    /// The same key from a host and port already read off a URL (the engine reads them once, when
    /// it validates the request).
    public static func authority(host: String, port: Int?) -> String {
        // Most processes call one or a few hosts: the last key made is kept, and an equal host
        // and port (two small-string compares) take it instead of lower-casing and joining again.
        if let last = lastAuthority.withLock({ $0 }), last.host == host, last.port == port { return last.authority }
        let key = Self.key(host)
        let authority = port.map { key + ":" + String($0) } ?? key
        lastAuthority.withLock { $0 = (host, port, authority) }
        return authority
    }

    private static let lastAuthority = Locked<(host: String, port: Int?, authority: String)?>(nil)

    private static func key(_ host: String) -> String {
        host.utf8.contains(where: { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) }) ? host.lowercased() : host
    }

    private static func dropLeastRecentlyUsed(_ state: inout State) {
        var oldest: (key: String, lastUsed: UInt64)?
        for (key, entry) in state.entries where !entry.breaker.isIsolated {
            if oldest.map({ entry.lastUsed < $0.lastUsed }) ?? true { oldest = (key, entry.lastUsed) }
        }
        if let oldest { state.entries[oldest.key] = nil }
    }
}
