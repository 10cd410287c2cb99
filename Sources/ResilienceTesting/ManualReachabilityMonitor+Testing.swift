import Reachability

extension ManualReachabilityMonitor {
    /// Number of live `connectivity` streams: a test waits until the code under test listens
    /// before it flips the state (`while await monitor.subscriberCount == 0 { await Task.yield() }`).
    public var subscriberCount: Int { liveStreamCount }
}
