/// The decisions of `NetworkReachabilityMonitor`, kept apart from its I/O: what to report, and when
/// to probe the health URL. The actor feeds it events and performs the returned actions.
///
/// Each probe and each probe timer carries the generation it was started in. Any link-layer event
/// starts a new generation, so a probe that was already running when the link went down (or
/// when a newer event asked for a fresh probe) cannot report its stale answer afterwards.
struct NetworkReachabilityStateMachine: Sendable {
    enum Action: Sendable, Equatable {
        /// Report this state: set `isConnected` and yield it to every subscriber.
        case publish(Bool)
        /// Cancel any probe or probe timer, then probe now, tagged with this generation.
        case startProbe(generation: UInt64)
        /// Cancel any probe or probe timer.
        case cancelProbe
        /// Probe again after the probe interval, tagged with this generation.
        case scheduleProbe(generation: UInt64)
    }

    /// Whether a health URL confirms the link layer before `true` is reported.
    let probes: Bool
    /// What was last reported; `nil` until the first decision.
    private(set) var reported: Bool?
    /// What the link layer last said; `nil` before it said anything (since the last start).
    private(set) var linkLayerUp: Bool?
    /// Whether a state has been decided since monitoring (re)started: the link layer said "down",
    /// or said "up" and, with probes, a probe answered.
    private(set) var isSettled = false
    private var generation: UInt64 = 0

    init(probes: Bool) {
        self.probes = probes
    }

    /// The link layer (rtnetlink or NWPathMonitor) evaluated the system's state.
    mutating func linkLayerEvaluated(_ up: Bool) -> [Action] {
        linkLayerUp = up
        generation &+= 1
        guard probes else {
            isSettled = true
            return publish(up)
        }
        guard up else {
            isSettled = true
            return [.cancelProbe] + publish(false)
        }
        // Up: every evaluation may mean a different path (a new Wi-Fi, a VPN), so confirm it anew.
        // Until the probe answers, the last report stands.
        return [.startProbe(generation: generation)]
    }

    /// A probe started in `generation` finished.
    mutating func probeFinished(generation: UInt64, reachable: Bool) -> [Action] {
        guard generation == self.generation, linkLayerUp == true else { return [] }
        isSettled = true
        return publish(reachable) + [.scheduleProbe(generation: generation)]
    }

    /// The timer set by `.scheduleProbe(generation:)` fired.
    mutating func probeTimerFired(generation: UInt64) -> [Action] {
        guard generation == self.generation, linkLayerUp == true else { return [] }
        return [.startProbe(generation: generation)]
    }

    /// Monitoring stopped: outstanding probes and timers become stale; the last report stands.
    mutating func stopped() {
        generation &+= 1
        linkLayerUp = nil
        isSettled = false
    }

    private mutating func publish(_ state: Bool) -> [Action] {
        guard reported != state else { return [] }
        reported = state
        return [.publish(state)]
    }
}
