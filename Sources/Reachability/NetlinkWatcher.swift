@_spi(ResilienceCore) import ResilienceCore

#if os(Linux)
import CNetlink
import Foundation
import Glibc
import Retry

/// Watches the kernel's link and route tables over rtnetlink on a dedicated thread, and reports
/// `NetlinkSnapshot.isConnected` after the start and after every burst of kernel notifications.
///
/// Two sockets: one subscribed to the link, address and route multicast groups, read only as
/// "something changed" (its messages are never parsed, and an overflow, ENOBUFS, means the same);
/// one without groups for the RTM_GETLINK / RTM_GETROUTE dumps each evaluation reads afresh. A
/// fresh dump is never wrong the way a state patched together from notifications can be.
///
/// The thread blocks in `poll()` — never on Swift's cooperative pool — and a self-pipe wakes it
/// for `stop()`. Its poll timeouts are wall-clock I/O waits (the debounce), not timers of the
/// monitor's injected clock.
final class NetlinkWatcher: Sendable {
    private struct Shared: Sendable {
        var stopRequested = false
        /// The write end of the self-pipe; `nil` once the thread has closed it (so `stop()` can
        /// never write to a descriptor number that has been reused).
        var wakeWriteFD: Int32?
    }

    private let shared: Locked<Shared>

    /// Quiet time after the last notification of a burst before evaluating.
    static let burstQuiet: Duration = .milliseconds(20)
    /// Longest wait after the first notification of a burst.
    static let burstMaximumDelay: Duration = .milliseconds(200)
    /// Wait before retrying a failed dump.
    static let dumpRetryDelay: Duration = .seconds(1)

    private init(shared: Locked<Shared>) {
        self.shared = shared
    }

    /// Starts watching and returns at once; the first evaluation follows on the watcher's thread.
    /// Every outcome goes to `events`, which the thread finishes when it ends.
    ///
    /// - Parameter namespacePath: a network namespace to watch (e.g. `/var/run/netns/NAME`); the
    ///   sockets are opened inside it and stay bound to it. `nil`: the process's own namespace.
    static func start(
        namespacePath: String?,
        events: AsyncStream<LinkLayerEvent>.Continuation
    ) -> NetlinkWatcher {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else {
            events.yield(.unavailable(.subscriptionFailed(call: "pipe", errno: errno)))
            events.finish()
            return NetlinkWatcher(shared: Locked(Shared(stopRequested: true, wakeWriteFD: nil)))
        }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        _ = fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK)
        let shared = Locked(Shared(stopRequested: false, wakeWriteFD: fds[1]))
        let wakeReadFD = fds[0]
        let thread = Thread {
            NetlinkWatcher.run(namespacePath: namespacePath, wakeReadFD: wakeReadFD, shared: shared, events: events)
        }
        thread.name = "resilience.reachability.netlink"
        thread.start()
        return NetlinkWatcher(shared: shared)
    }

    /// Asks the thread to close its sockets and end; returns at once. Idempotent.
    func stop() {
        shared.withLock { state in
            guard !state.stopRequested else { return }
            state.stopRequested = true
            if let fd = state.wakeWriteFD {
                var byte: UInt8 = 1
                _ = write(fd, &byte, 1)
            }
        }
    }

    // MARK: - The thread

    private static func run(
        namespacePath: String?,
        wakeReadFD: Int32,
        shared: Locked<Shared>,
        events: AsyncStream<LinkLayerEvent>.Continuation
    ) {
        defer {
            close(wakeReadFD)
            shared.withLock { state in
                if let fd = state.wakeWriteFD { close(fd) }
                state.wakeWriteFD = nil
            }
            events.finish()
        }
        var sockets: NetlinkSockets
        do {
            sockets = try NetlinkSockets.open(namespacePath: namespacePath)
        } catch {
            events.yield(.unavailable(error))
            return
        }
        defer { sockets.close() }

        let clock = ContinuousClock()
        var burst = NetlinkBurst<ContinuousClock.Instant>(quiet: burstQuiet, maximumDelay: burstMaximumDelay)
        var retryAt: ContinuousClock.Instant?
        var lastFailure: Int32?

        func evaluate() {
            do {
                let snapshot = try sockets.dumpSnapshot()
                lastFailure = nil
                retryAt = nil
                events.yield(.evaluated(snapshot.isConnected))
            } catch {
                // Keep the last verdict; report the failure once, and try again shortly.
                if case .dumpFailed(let code) = error, code != lastFailure {
                    lastFailure = code
                    events.yield(.unavailable(error))
                }
                retryAt = clock.now.advanced(by: dumpRetryDelay)
            }
        }

        evaluate()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !shared.withLock({ $0.stopRequested }) {
            let deadline = [burst.deadline, retryAt].compactMap { $0 }.min()
            var descriptors = [
                pollfd(fd: sockets.events, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeReadFD, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&descriptors, nfds_t(descriptors.count), timeoutMilliseconds(until: deadline, clock: clock))
            if ready < 0, errno != EINTR {
                events.yield(.unavailable(.subscriptionFailed(call: "poll", errno: errno)))
                return
            }
            if descriptors[1].revents != 0 { return }
            if descriptors[0].revents & Int16(POLLNVAL) != 0 {
                events.yield(.unavailable(.subscriptionFailed(call: "poll", errno: EBADF)))
                return
            }
            if descriptors[0].revents & Int16(POLLIN | POLLERR) != 0, sockets.drainNotifications(into: &buffer) {
                burst.messageArrived(at: clock.now)
            }
            let now = clock.now
            if burst.isDue(at: now) || (retryAt.map { $0 <= now } ?? false) {
                burst.reset()
                evaluate()
            }
        }
    }

    /// Milliseconds from now to `deadline` for `poll()`, rounded up; -1 (wait forever) without one.
    private static func timeoutMilliseconds(until deadline: ContinuousClock.Instant?, clock: ContinuousClock) -> Int32 {
        guard let deadline else { return -1 }
        let wait = clock.now.duration(to: deadline)
        guard wait > .zero else { return 0 }
        let (seconds, attoseconds) = wait.components
        let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: milliseconds)
    }
}

/// The two rtnetlink sockets of a watcher; used by its thread only.
private struct NetlinkSockets {
    typealias MonitoringError = NetworkReachabilityMonitor.MonitoringError

    /// Subscribed to notifications; non-blocking.
    let events: Int32
    /// For dump requests; blocking with a receive timeout.
    let dumps: Int32
    private var sequence: UInt32 = 0
    private var dumpBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)

    private init(events: Int32, dumps: Int32) {
        self.events = events
        self.dumps = dumps
    }

    func close() {
        _ = Glibc.close(events)
        _ = Glibc.close(dumps)
        dumpBuffer.deallocate()
    }

    /// Opens and subscribes both sockets, inside `namespacePath` when given.
    static func open(namespacePath: String?) throws(MonitoringError) -> NetlinkSockets {
        try inNetworkNamespace(namespacePath) { () throws(MonitoringError) -> NetlinkSockets in
            let groups = UInt32(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE)
            let events = try makeSocket(groups: groups, nonBlocking: true)
            let dumps: Int32
            do throws(MonitoringError) {
                dumps = try makeSocket(groups: 0, nonBlocking: false)
            } catch {
                _ = Glibc.close(events)
                throw error
            }
            // A dump is answered at once; the timeout only guards against a kernel that never does.
            var timeout = timeval(tv_sec: 2, tv_usec: 0)
            _ = setsockopt(dumps, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            return NetlinkSockets(events: events, dumps: dumps)
        }
    }

    private static func makeSocket(groups: UInt32, nonBlocking: Bool) throws(MonitoringError) -> Int32 {
        var type = Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        let fd = socket(AF_NETLINK, type, NETLINK_ROUTE)
        guard fd >= 0 else { throw .subscriptionFailed(call: "socket", errno: errno) }
        if groups != 0 {
            // Room for a burst (a link going down removes many routes at once); overflow is handled.
            var size: Int32 = 1 << 20
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_nl()
        address.nl_family = sa_family_t(AF_NETLINK)
        address.nl_groups = groups
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_nl>.size))
            }
        }
        guard bound == 0 else {
            let code = errno
            _ = Glibc.close(fd)
            throw .subscriptionFailed(call: "bind", errno: code)
        }
        return fd
    }

    /// Runs `body` on this thread inside the network namespace at `path`, then returns the thread
    /// to its own namespace. Sockets created in `body` stay bound to the namespace they were made in.
    private static func inNetworkNamespace<T>(
        _ path: String?,
        _ body: () throws(MonitoringError) -> T
    ) throws(MonitoringError) -> T {
        guard let path else { return try body() }
        let original = Glibc.open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)
        guard original >= 0 else { throw .subscriptionFailed(call: "open /proc/thread-self/ns/net", errno: errno) }
        defer { _ = Glibc.close(original) }
        let target = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard target >= 0 else { throw .subscriptionFailed(call: "open \(path)", errno: errno) }
        defer { _ = Glibc.close(target) }
        guard cnetlink_setns_net(target) == 0 else { throw .subscriptionFailed(call: "setns \(path)", errno: errno) }
        // Back to the original namespace whatever happens; if that fails, only this dedicated
        // thread (which never opens another socket) is left in the target namespace.
        defer { _ = cnetlink_setns_net(original) }
        return try body()
    }

    /// Reads every pending notification without blocking; whether anything arrived (an overflow,
    /// ENOBUFS, counts: notifications were lost, so the tables must be read again).
    func drainNotifications(into buffer: inout [UInt8]) -> Bool {
        var changed = false
        // Bounded, so a notification storm cannot keep the loop from evaluating.
        for _ in 0..<256 {
            let count = buffer.withUnsafeMutableBytes { recv(events, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count > 0 { changed = true; continue }
            if count < 0 {
                switch errno {
                case EINTR: continue
                case ENOBUFS: changed = true; continue
                default: return changed  // EAGAIN: drained
                }
            }
            return changed
        }
        return changed
    }

    /// A fresh view of the kernel's links and IPv4/IPv6 routes.
    mutating func dumpSnapshot() throws(MonitoringError) -> NetlinkSnapshot {
        var snapshot = NetlinkSnapshot(links: [], routes: [])
        // The tables changing mid-dump (NLM_F_DUMP_INTR) asks for a redo; after three the last
        // one stands, and the notification that interrupted it triggers another evaluation anyway.
        for _ in 0..<3 {
            let links = try dump(type: UInt16(RTM_GETLINK), family: UInt8(AF_UNSPEC))
            let routes4 = try dump(type: UInt16(RTM_GETROUTE), family: UInt8(AF_INET))
            let routes6 = try dump(type: UInt16(RTM_GETROUTE), family: UInt8(AF_INET6))
            snapshot = NetlinkSnapshot(links: links.links, routes: routes4.routes + routes6.routes)
            if !(links.interrupted || routes4.interrupted || routes6.interrupted) { break }
        }
        return snapshot
    }

    /// One dump request and all of its answer.
    private mutating func dump(type: UInt16, family: UInt8) throws(MonitoringError) -> NetlinkDatagram {
        sequence &+= 1
        let sequence = self.sequence
        // The family header (ifinfomsg for links, rtmsg for routes) is zero but for its first
        // byte, the address family, in both.
        let payloadSize = type == UInt16(RTM_GETLINK) ? MemoryLayout<ifinfomsg>.size : MemoryLayout<rtmsg>.size
        var header = nlmsghdr()
        header.nlmsg_len = cnetlink_nlmsg_length(UInt32(payloadSize))
        header.nlmsg_type = type
        header.nlmsg_flags = UInt16(NLM_F_REQUEST | NLM_F_DUMP)
        header.nlmsg_seq = sequence
        var request = [UInt8](repeating: 0, count: Int(header.nlmsg_len))
        withUnsafeBytes(of: header) { bytes in request.replaceSubrange(0..<bytes.count, with: bytes) }
        request[Int(cnetlink_nlmsg_length(0))] = family

        var kernel = sockaddr_nl()
        kernel.nl_family = sa_family_t(AF_NETLINK)
        while true {
            let sent = request.withUnsafeBytes { bytes in
                withUnsafePointer(to: &kernel) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        sendto(dumps, bytes.baseAddress, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_nl>.size))
                    }
                }
            }
            if sent >= 0 { break }
            if errno != EINTR { throw .dumpFailed(errno: errno) }
        }

        var answer = NetlinkDatagram()
        while true {
            // Peek at the next datagram's real size first, so none is ever truncated.
            let size = recv(dumps, nil, 0, Int32(MSG_PEEK | MSG_TRUNC))
            if size < 0 {
                if errno == EINTR { continue }
                throw .dumpFailed(errno: errno == EAGAIN || errno == EWOULDBLOCK ? ETIMEDOUT : errno)
            }
            if size > dumpBuffer.count {
                dumpBuffer.deallocate()
                dumpBuffer = .allocate(byteCount: size, alignment: 8)
            }
            let received = recv(dumps, dumpBuffer.baseAddress, dumpBuffer.count, 0)
            if received < 0 {
                if errno == EINTR { continue }
                throw .dumpFailed(errno: errno)
            }
            let part = NetlinkParser.parse(UnsafeMutableRawBufferPointer(rebasing: dumpBuffer[0..<received]), sequence: sequence)
            if let code = part.errno { throw .dumpFailed(errno: code) }
            answer.links += part.links
            answer.routes += part.routes
            answer.interrupted = answer.interrupted || part.interrupted
            if part.isDone { return answer }
        }
    }
}
#endif
