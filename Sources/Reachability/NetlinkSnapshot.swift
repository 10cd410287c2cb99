// The connectivity rule of `NetworkReachabilityMonitor` on Linux, as a pure function over the
// link and route records an rtnetlink dump yields. No sockets here: this file compiles on every
// platform, so the rule is unit-tested everywhere. Kernel constants are spelled out because they
// are Linux ABI values (AF_INET6 is 10 on Linux, 30 on Darwin) and must not come from the host.

/// One network interface, as an RTM_NEWLINK message describes it.
struct NetlinkLink: Sendable, Hashable {
    /// `ifi_index`.
    var index: Int32
    /// `IFLA_IFNAME` (for diagnostics only; the rule never looks at names).
    var name: String
    /// `ifi_flags` (`IFF_*`).
    var flags: UInt32
    /// `IFLA_OPERSTATE` (`IF_OPER_*`, RFC 2863), when the kernel sent it.
    var operState: UInt8?

    static let iffUp: UInt32 = 0x1
    static let iffLoopback: UInt32 = 0x8
    static let iffRunning: UInt32 = 0x40
    static let operUnknown: UInt8 = 0
    static let operUp: UInt8 = 6

    var isLoopback: Bool { flags & Self.iffLoopback != 0 }

    /// Administratively up (`IFF_UP`) and operationally up: `IFF_RUNNING` (the kernel sets it when
    /// the carrier is present and the RFC 2863 state is UP or UNKNOWN — tunnels report UNKNOWN),
    /// and the reported operational state, if any, agrees.
    var isUp: Bool {
        guard flags & Self.iffUp != 0, flags & Self.iffRunning != 0 else { return false }
        guard let operState else { return true }
        return operState == Self.operUp || operState == Self.operUnknown
    }
}

/// One route, as an RTM_NEWROUTE message describes it.
struct NetlinkRoute: Sendable, Hashable {
    /// One way out of a route: an interface, and the `RTNH_F_*` flags of that next hop.
    struct NextHop: Sendable, Hashable {
        var interfaceIndex: Int32
        var flags: UInt32
    }

    /// `rtm_family`: 2 (AF_INET) or 10 (AF_INET6) on Linux.
    var family: UInt8
    /// `rtm_dst_len`: 0 for a default route.
    var destinationLength: UInt8
    /// `RTA_TABLE` when present, else `rtm_table`.
    var table: UInt32
    /// `rtm_type` (`RTN_*`).
    var type: UInt8
    /// `RTA_OIF` with `rtm_flags` for a single-path route; one entry per `rtnexthop` for an
    /// `RTA_MULTIPATH` route; empty when the route names neither.
    var nextHops: [NextHop]
    /// `RTA_NH_ID`: the route uses a nexthop object (the dump then names no interface).
    var nextHopObjectID: UInt32?

    static let familyIPv4: UInt8 = 2
    static let familyIPv6: UInt8 = 10
    static let typeUnicast: UInt8 = 1
    static let tableLocal: UInt32 = 255
    static let nextHopDead: UInt32 = 0x1
    static let nextHopLinkDown: UInt32 = 0x10

    var isDefault: Bool { destinationLength == 0 }
}

/// What one evaluation of the kernel's tables saw.
struct NetlinkSnapshot: Sendable, Hashable {
    var links: [NetlinkLink]
    var routes: [NetlinkRoute]

    /// The connectivity rule. Connected exactly when some IPv4 or IPv6 **default route** is usable:
    /// a unicast route (not blackhole, unreachable, prohibit, local, broadcast…) outside the local
    /// table, with a next hop that is neither dead nor link-down through an interface that is not
    /// loopback and is up (`NetlinkLink.isUp`).
    ///
    /// Why a default route and not any route: a subnet route alone (a Docker bridge, a LAN without
    /// a gateway, an IPv6 link-local prefix) reaches no server the offline queue talks to, and
    /// counting it would report "connected" on a laptop whose only uplink is gone.
    ///
    /// A default route that uses a nexthop object (`RTA_NH_ID`, no interface in the route dump)
    /// counts when some non-loopback interface is up: nexthop objects are not dumped here.
    var isConnected: Bool {
        let usable = Set(links.lazy.filter { !$0.isLoopback && $0.isUp }.map(\.index))
        guard !usable.isEmpty else { return false }
        return routes.contains { route in
            guard route.family == NetlinkRoute.familyIPv4 || route.family == NetlinkRoute.familyIPv6,
                route.type == NetlinkRoute.typeUnicast,
                route.table != NetlinkRoute.tableLocal,
                route.isDefault
            else { return false }
            if route.nextHops.isEmpty { return route.nextHopObjectID != nil }
            return route.nextHops.contains { hop in
                hop.flags & (NetlinkRoute.nextHopDead | NetlinkRoute.nextHopLinkDown) == 0
                    && usable.contains(hop.interfaceIndex)
            }
        }
    }
}

/// Debounce of kernel notifications: a burst of messages (one `ip link set down` sends several)
/// leads to one evaluation, `quiet` after the last message, but never later than `maximumDelay`
/// after the first, so a steady stream of messages still gets evaluated.
struct NetlinkBurst<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    private var first: Instant?
    private var last: Instant?
    let quiet: Duration
    let maximumDelay: Duration

    init(quiet: Duration, maximumDelay: Duration) {
        self.quiet = quiet
        self.maximumDelay = max(quiet, maximumDelay)
    }

    /// A message arrived at `instant`.
    mutating func messageArrived(at instant: Instant) {
        if first == nil { first = instant }
        last = instant
    }

    /// When to evaluate, or `nil` when no burst is pending.
    var deadline: Instant? {
        guard let first, let last else { return nil }
        return min(last.advanced(by: quiet), first.advanced(by: maximumDelay))
    }

    /// Whether the pending burst is due at `instant`.
    func isDue(at instant: Instant) -> Bool {
        guard let deadline else { return false }
        return deadline <= instant
    }

    /// The burst was evaluated.
    mutating func reset() {
        first = nil
        last = nil
    }
}
