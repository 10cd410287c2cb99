// The monitors the queue follows moved to their own product; re-exported so every
// `import OfflineQueue` that used `ReachabilityMonitoring`, `ManualReachabilityMonitor` or
// `NetworkReachabilityMonitor` still compiles.
@_exported import Reachability
