@_spi(ResilienceCore) import ResilienceCore
import Retry

/// Tells the offline queue whether the network is usable, and when that changes.
public protocol ReachabilityMonitoring: Actor {
    /// The connectivity state now.
    var isConnected: Bool { get }
    /// A new stream for each access: it yields the current state first, then every change
    /// (repeated values are not repeated), and finishes when the monitor stops.
    var connectivity: AsyncStream<Bool> { get }
}

/// A monitor whose state is set by hand — for tests, and for apps that know better than the OS
/// (a VPN that must be up, a server-side maintenance flag).
public actor ManualReachabilityMonitor: ReachabilityMonitoring {
    public private(set) var isConnected: Bool
    private nonisolated let subscribers = StreamSubscribers<Bool>()

    public init(isConnected: Bool = true) {
        self.isConnected = isConnected
    }

    public var connectivity: AsyncStream<Bool> {
        subscribers.stream(bufferingPolicy: .bufferingNewest(16), first: isConnected)
    }

    /// Sets the state; subscribers hear about it only if it changed.
    public func setConnected(_ connected: Bool) {
        guard connected != isConnected else { return }
        isConnected = connected
        subscribers.yield(connected)
    }

    /// Number of live `connectivity` streams. Tests read it as `subscriberCount`, from
    /// ResilienceTesting, to wait until the code under test listens before flipping the state.
    package var liveStreamCount: Int { subscribers.count }
}
