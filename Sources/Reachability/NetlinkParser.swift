#if os(Linux)
import CNetlink
import Glibc

/// What one datagram from an rtnetlink dump contained.
struct NetlinkDatagram: Sendable, Equatable {
    var links: [NetlinkLink] = []
    var routes: [NetlinkRoute] = []
    /// `NLMSG_DONE` was seen: the dump is complete.
    var isDone = false
    /// The kernel answered `NLMSG_ERROR` with this (positive) errno.
    var errno: Int32?
    /// A message carried `NLM_F_DUMP_INTR`: the tables changed during the dump, which should be redone.
    var interrupted = false
}

/// Decodes rtnetlink messages with the kernel's own macros (through CNetlink) and bounds checks on
/// every length the kernel sends, so a malformed message is skipped, never read past.
enum NetlinkParser {
    /// Parses every message of `datagram` that answers the request numbered `sequence`; messages
    /// of other requests (a late answer to an abandoned dump) are ignored.
    static func parse(_ datagram: UnsafeMutableRawBufferPointer, sequence: UInt32) -> NetlinkDatagram {
        var result = NetlinkDatagram()
        guard let base = datagram.baseAddress, datagram.count <= Int(Int32.max) else { return result }
        var remaining = Int32(datagram.count)
        var message: UnsafeMutablePointer<nlmsghdr>? = base.assumingMemoryBound(to: nlmsghdr.self)
        while let current = message, cnetlink_nlmsg_ok(current, remaining) != 0 {
            defer { message = cnetlink_nlmsg_next(current, &remaining) }
            let header = current.pointee
            guard header.nlmsg_seq == sequence else { continue }
            if header.nlmsg_flags & UInt16(NLM_F_DUMP_INTR) != 0 { result.interrupted = true }
            switch Int32(header.nlmsg_type) {
            case NLMSG_DONE:
                result.isDone = true
                return result
            case NLMSG_ERROR:
                guard header.nlmsg_len >= cnetlink_nlmsg_length(UInt32(MemoryLayout<nlmsgerr>.size)) else {
                    result.errno = EPROTO
                    return result
                }
                let error = UnsafeRawPointer(cnetlink_nlmsg_data(current)).loadUnaligned(as: Int32.self)
                if error != 0 {
                    result.errno = error == Int32.min ? EPROTO : -error
                    return result
                }
            case Int32(RTM_NEWLINK):
                if let link = parseLink(current) { result.links.append(link) }
            case Int32(RTM_NEWROUTE):
                if let route = parseRoute(current) { result.routes.append(route) }
            default:
                continue
            }
        }
        return result
    }

    /// An RTM_NEWLINK message as a record, or `nil` if it is too short.
    static func parseLink(_ message: UnsafeMutablePointer<nlmsghdr>) -> NetlinkLink? {
        guard message.pointee.nlmsg_len >= cnetlink_nlmsg_length(UInt32(MemoryLayout<ifinfomsg>.size)),
            let data = cnetlink_nlmsg_data(message)
        else { return nil }
        let info = UnsafeRawPointer(data).loadUnaligned(as: ifinfomsg.self)
        var link = NetlinkLink(index: info.ifi_index, name: "", flags: info.ifi_flags, operState: nil)
        forEachAttribute(
            first: cnetlink_ifla_rta(data.assumingMemoryBound(to: ifinfomsg.self)),
            length: cnetlink_ifla_payload(message)
        ) { type, payload in
            switch type {
            case UInt16(IFLA_IFNAME):
                let bytes = payload.prefix { $0 != 0 }
                link.name = String(decoding: bytes, as: UTF8.self)
            case UInt16(IFLA_OPERSTATE):
                if payload.count >= 1 { link.operState = payload[0] }
            default:
                break
            }
        }
        return link
    }

    /// An RTM_NEWROUTE message as a record, or `nil` if it is too short.
    static func parseRoute(_ message: UnsafeMutablePointer<nlmsghdr>) -> NetlinkRoute? {
        guard message.pointee.nlmsg_len >= cnetlink_nlmsg_length(UInt32(MemoryLayout<rtmsg>.size)),
            let data = cnetlink_nlmsg_data(message)
        else { return nil }
        let header = UnsafeRawPointer(data).loadUnaligned(as: rtmsg.self)
        var route = NetlinkRoute(
            family: header.rtm_family,
            destinationLength: header.rtm_dst_len,
            table: UInt32(header.rtm_table),
            type: header.rtm_type,
            nextHops: [],
            nextHopObjectID: nil
        )
        var outputInterface: Int32?
        var multipath: [NetlinkRoute.NextHop]?
        forEachAttribute(
            first: cnetlink_rtm_rta(data.assumingMemoryBound(to: rtmsg.self)),
            length: cnetlink_rtm_payload(message)
        ) { type, payload in
            switch type {
            case UInt16(RTA_OIF.rawValue):
                if payload.count >= 4 { outputInterface = payload.loadUnaligned(as: Int32.self) }
            case UInt16(RTA_TABLE.rawValue):
                if payload.count >= 4 { route.table = payload.loadUnaligned(as: UInt32.self) }
            case UInt16(RTA_NH_ID.rawValue):
                if payload.count >= 4 { route.nextHopObjectID = payload.loadUnaligned(as: UInt32.self) }
            case UInt16(RTA_MULTIPATH.rawValue):
                multipath = parseNextHops(payload)
            default:
                break
            }
        }
        if let multipath {
            route.nextHops = multipath
        } else if let outputInterface {
            // A single-path route carries its next hop's RTNH_F_* flags in rtm_flags.
            route.nextHops = [NetlinkRoute.NextHop(interfaceIndex: outputInterface, flags: header.rtm_flags)]
        }
        return route
    }

    /// The `rtnexthop` entries of an RTA_MULTIPATH payload.
    private static func parseNextHops(_ payload: UnsafeRawBufferPointer) -> [NetlinkRoute.NextHop] {
        guard let base = payload.baseAddress, payload.count <= Int(Int32.max) else { return [] }
        var hops: [NetlinkRoute.NextHop] = []
        var remaining = Int32(payload.count)
        var hop: UnsafeMutablePointer<rtnexthop>? = UnsafeMutableRawPointer(mutating: base).assumingMemoryBound(to: rtnexthop.self)
        while let current = hop, cnetlink_rtnh_ok(current, remaining) != 0 {
            let value = UnsafeRawPointer(current).loadUnaligned(as: rtnexthop.self)
            hops.append(NetlinkRoute.NextHop(interfaceIndex: value.rtnh_ifindex, flags: UInt32(value.rtnh_flags)))
            hop = cnetlink_rtnh_next(current, &remaining)
        }
        return hops
    }

    /// Calls `body` with the type (flag bits masked off) and payload of each well-formed attribute.
    private static func forEachAttribute(
        first: UnsafeMutablePointer<rtattr>?,
        length: Int32,
        _ body: (UInt16, UnsafeRawBufferPointer) -> Void
    ) {
        var remaining = length
        var attribute = first
        while let current = attribute, cnetlink_rta_ok(current, remaining) != 0 {
            let type = current.pointee.rta_type & 0x3FFF  // NLA_TYPE_MASK: without NLA_F_NESTED, NLA_F_NET_BYTEORDER
            let payload = UnsafeRawBufferPointer(
                start: cnetlink_rta_data(current),
                count: Int(max(0, cnetlink_rta_payload(current)))
            )
            body(type, payload)
            attribute = cnetlink_rta_next(current, &remaining)
        }
    }
}
#endif
