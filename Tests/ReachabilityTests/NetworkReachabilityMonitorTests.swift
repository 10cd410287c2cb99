import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Reachability

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if os(Linux)
import CNetlink
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// MARK: - The connectivity rule, as a pure function over parsed records

@Suite("NetworkReachabilityMonitor: the Linux connectivity rule")
struct NetlinkConnectivityRuleTests {
    static let up = NetlinkLink.iffUp | NetlinkLink.iffRunning
    let loopback = NetlinkLink(index: 1, name: "lo", flags: Self.up | NetlinkLink.iffLoopback, operState: NetlinkLink.operUnknown)
    let veth = NetlinkLink(index: 7, name: "veth0", flags: Self.up, operState: NetlinkLink.operUp)

    static func route(
        family: UInt8 = NetlinkRoute.familyIPv4,
        prefix: UInt8 = 0,
        table: UInt32 = 254,
        type: UInt8 = NetlinkRoute.typeUnicast,
        via interfaces: [Int32],
        flags: UInt32 = 0
    ) -> NetlinkRoute {
        NetlinkRoute(
            family: family, destinationLength: prefix, table: table, type: type,
            nextHops: interfaces.map { NetlinkRoute.NextHop(interfaceIndex: $0, flags: flags) },
            nextHopObjectID: nil
        )
    }

    @Test func vethThatIsUpWithADefaultRouteIsConnected() {
        let snapshot = NetlinkSnapshot(
            links: [loopback, veth],
            routes: [Self.route(prefix: 24, via: [7]), Self.route(via: [7])]
        )
        #expect(snapshot.isConnected)
    }

    @Test func loopbackAloneIsNotConnectedEvenWithADefaultRouteThroughIt() {
        let local = Self.route(prefix: 8, table: NetlinkRoute.tableLocal, type: 2, via: [1])
        #expect(!NetlinkSnapshot(links: [loopback], routes: [local]).isConnected)
        #expect(!NetlinkSnapshot(links: [loopback], routes: [local, Self.route(via: [1])]).isConnected)
    }

    @Test func administrativelyDownInterfaceIsNotConnected() {
        var down = veth
        down.flags = 0
        down.operState = 2  // IF_OPER_DOWN
        #expect(!NetlinkSnapshot(links: [loopback, down], routes: [Self.route(via: [7])]).isConnected)
    }

    @Test func interfaceWithoutCarrierIsNotConnected() {
        var noCarrier = veth
        noCarrier.flags = NetlinkLink.iffUp  // up, not running
        noCarrier.operState = 5  // IF_OPER_LOWERLAYERDOWN
        #expect(!NetlinkSnapshot(links: [noCarrier], routes: [Self.route(via: [7])]).isConnected)
    }

    @Test func runningInterfaceInAnOperationalStateOtherThanUpOrUnknownIsNotConnected() {
        var dormant = veth
        dormant.operState = 5  // the flags say running, the RFC 2863 state disagrees: trust the stricter
        #expect(!NetlinkSnapshot(links: [dormant], routes: [Self.route(via: [7])]).isConnected)
    }

    @Test func tunnelInOperationalStateUnknownIsConnected() {
        let tunnel = NetlinkLink(index: 9, name: "wg0", flags: Self.up, operState: NetlinkLink.operUnknown)
        #expect(NetlinkSnapshot(links: [loopback, tunnel], routes: [Self.route(via: [9])]).isConnected)
    }

    @Test func subnetRouteWithoutADefaultRouteIsNotConnected() {
        let snapshot = NetlinkSnapshot(links: [loopback, veth], routes: [Self.route(prefix: 24, via: [7])])
        #expect(!snapshot.isConnected)
    }

    @Test func blackholeUnreachableAndLocalDefaultRoutesDoNotCount() {
        for type: UInt8 in [2, 6, 7, 8] {  // RTN_LOCAL, RTN_BLACKHOLE, RTN_UNREACHABLE, RTN_PROHIBIT
            #expect(!NetlinkSnapshot(links: [veth], routes: [Self.route(type: type, via: [7])]).isConnected)
        }
        #expect(!NetlinkSnapshot(links: [veth], routes: [Self.route(table: NetlinkRoute.tableLocal, via: [7])]).isConnected)
    }

    @Test func defaultRouteWhoseNextHopIsLinkDownOrDeadDoesNotCount() {
        #expect(!NetlinkSnapshot(links: [veth], routes: [Self.route(via: [7], flags: NetlinkRoute.nextHopLinkDown)]).isConnected)
        #expect(!NetlinkSnapshot(links: [veth], routes: [Self.route(via: [7], flags: NetlinkRoute.nextHopDead)]).isConnected)
    }

    @Test func defaultRouteThroughAnInterfaceThatIsNotListedDoesNotCount() {
        #expect(!NetlinkSnapshot(links: [loopback, veth], routes: [Self.route(via: [42])]).isConnected)
    }

    @Test func ipv6DefaultRouteCountsAndPolicyTablesCount() {
        let routes = [Self.route(family: NetlinkRoute.familyIPv6, table: 1000, via: [7])]
        #expect(NetlinkSnapshot(links: [loopback, veth], routes: routes).isConnected)
    }

    @Test func multipathDefaultRouteCountsWhenAnyNextHopIsUsable() {
        let down = NetlinkLink(index: 8, name: "eth1", flags: NetlinkLink.iffUp, operState: 2)
        let multipath = Self.route(via: [8, 7])
        #expect(NetlinkSnapshot(links: [down, veth], routes: [multipath]).isConnected)
        #expect(!NetlinkSnapshot(links: [down], routes: [multipath]).isConnected)
    }

    @Test func defaultRouteThroughANextHopObjectCountsWhenSomeInterfaceIsUp() {
        let route = NetlinkRoute(family: NetlinkRoute.familyIPv4, destinationLength: 0, table: 254, type: NetlinkRoute.typeUnicast, nextHops: [], nextHopObjectID: 12)
        #expect(NetlinkSnapshot(links: [loopback, veth], routes: [route]).isConnected)
        #expect(!NetlinkSnapshot(links: [loopback], routes: [route]).isConnected)
    }

    @Test func burstOfMessagesIsEvaluatedOnceAfterItGoesQuietButNeverLaterThanTheMaximumDelay() {
        typealias Instant = ManualClock.Instant
        var burst = NetlinkBurst<Instant>(quiet: .milliseconds(20), maximumDelay: .milliseconds(200))
        #expect(burst.deadline == nil)
        burst.messageArrived(at: Instant(offset: .zero))
        burst.messageArrived(at: Instant(offset: .milliseconds(5)))
        #expect(burst.deadline == Instant(offset: .milliseconds(25)))
        #expect(!burst.isDue(at: Instant(offset: .milliseconds(24))))
        #expect(burst.isDue(at: Instant(offset: .milliseconds(25))))
        // A steady stream of messages is still evaluated at the maximum delay.
        for step in 1...30 { burst.messageArrived(at: Instant(offset: .milliseconds(10 * step))) }
        #expect(burst.deadline == Instant(offset: .milliseconds(200)))
        burst.reset()
        #expect(burst.deadline == nil)
    }
}

// MARK: - Decisions: what is reported, when the health URL is probed

@Suite("NetworkReachabilityMonitor: state machine")
struct NetworkReachabilityStateMachineTests {
    @Test func withoutProbesLinkLayerVerdictsArePublishedDeduplicated() {
        var machine = NetworkReachabilityStateMachine(probes: false)
        #expect(machine.linkLayerEvaluated(false) == [.publish(false)])
        #expect(machine.isSettled)
        #expect(machine.linkLayerEvaluated(false) == [])
        #expect(machine.linkLayerEvaluated(true) == [.publish(true)])
        #expect(machine.linkLayerEvaluated(true) == [])
    }

    @Test func withProbesUpIsReportedOnlyAfterTheProbeAnswers() {
        var machine = NetworkReachabilityStateMachine(probes: true)
        #expect(machine.linkLayerEvaluated(true) == [.startProbe(generation: 1)])
        #expect(machine.reported == nil)
        #expect(!machine.isSettled)
        #expect(machine.probeFinished(generation: 1, reachable: true) == [.publish(true), .scheduleProbe(generation: 1)])
        #expect(machine.isSettled)
        #expect(machine.probeTimerFired(generation: 1) == [.startProbe(generation: 1)])
        #expect(machine.probeFinished(generation: 1, reachable: false) == [.publish(false), .scheduleProbe(generation: 1)])
    }

    @Test func linkDownIsReportedAtOnceAndAProbeStillInFlightCannotOverrideIt() {
        var machine = NetworkReachabilityStateMachine(probes: true)
        _ = machine.linkLayerEvaluated(true)
        _ = machine.probeFinished(generation: 1, reachable: true)
        #expect(machine.linkLayerEvaluated(true) == [.startProbe(generation: 2)])
        #expect(machine.linkLayerEvaluated(false) == [.cancelProbe, .publish(false)])
        #expect(machine.probeFinished(generation: 2, reachable: true) == [])
        #expect(machine.probeTimerFired(generation: 1) == [])
        #expect(machine.reported == false)
    }

    @Test func stopUnsettlesButKeepsTheLastReport() {
        var machine = NetworkReachabilityStateMachine(probes: true)
        _ = machine.linkLayerEvaluated(true)
        _ = machine.probeFinished(generation: 1, reachable: true)
        machine.stopped()
        #expect(!machine.isSettled)
        #expect(machine.reported == true)
        #expect(machine.probeFinished(generation: 1, reachable: false) == [])
    }
}

// MARK: - The monitor, with the system side scripted

@Suite("NetworkReachabilityMonitor: streams, lifecycle, health probe", .timeLimit(.minutes(1)))
struct NetworkReachabilityMonitorTests {
    @Test func connectivityYieldsTheCurrentStateFirstThenEveryChangeOnce() async {
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(linkLayer: .scripted(events))
        feed.yield(.evaluated(false))
        await monitor.start()
        #expect(await monitor.isConnected == false)
        let first = StreamRecorder(await monitor.connectivity)
        #expect(await first.next() == false)
        for verdict in [true, true, false, false, true] { feed.yield(.evaluated(verdict)) }
        #expect(await first.next() == true)
        #expect(await first.next() == false)
        #expect(await first.next() == true)
        #expect(await monitor.isConnected)
        let second = StreamRecorder(await monitor.connectivity)
        #expect(await second.next() == true)  // a new stream starts from the current state
        await monitor.stop()
        #expect(await first.next() == nil)
        #expect(await second.next() == nil)
        #expect(await first.received == [false, true, false, true])
    }

    @Test func readingConnectivityStartsAFreshMonitorWithoutStart() async {
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(linkLayer: .scripted(events))
        let values = StreamRecorder(await monitor.connectivity)
        feed.yield(.evaluated(true))
        #expect(await values.next() == true)
        await monitor.stop()
    }

    @Test func streamTakenAfterStopYieldsTheLastStateAndFinishes() async {
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(linkLayer: .scripted(events))
        feed.yield(.evaluated(true))
        await monitor.start()
        await monitor.stop()
        let values = StreamRecorder(await monitor.connectivity)
        #expect(await values.next() == true)
        #expect(await values.next() == nil)
        #expect(await monitor.isConnected)
    }

    @Test func whenTheSystemCannotBeWatchedTheNetworkIsAssumedUpAndTheErrorIsReported() async {
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(linkLayer: .scripted(events))
        let error = NetworkReachabilityMonitor.MonitoringError.subscriptionFailed(call: "socket", errno: EACCES)
        feed.yield(.unavailable(error))
        await monitor.start()
        #expect(await monitor.isConnected)
        #expect(await monitor.monitoringError == error)
        #expect(error.description.contains("socket failed"))
        await monitor.stop()
    }

    @Test func healthProbeConfirmsReachabilityAndAShutDownServerIsUnreachable() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/health", .ok("fine"))
        let clock = ManualClock()
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(
            linkLayer: .scripted(events),
            healthCheckURL: server.url("/health"),
            session: URLSession(configuration: .ephemeral),
            probeInterval: .seconds(30),
            clock: clock
        )
        feed.yield(.evaluated(true))
        await monitor.start()
        #expect(await monitor.isConnected)
        #expect(server.hits("/health") == 1)
        let values = StreamRecorder(await monitor.connectivity)
        #expect(await values.next() == true)

        // The periodic probe finds the server gone.
        server.shutdown()
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(30))
        #expect(await values.next() == false)
        #expect(await monitor.isConnected == false)
        await monitor.stop()
    }

    @Test func anyHTTPStatusFromTheHealthURLMeansReachable() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/health", .status(503))
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(
            linkLayer: .scripted(events),
            healthCheckURL: server.url("/health"),
            session: URLSession(configuration: .ephemeral),
            clock: ManualClock()
        )
        feed.yield(.evaluated(true))
        await monitor.start()
        #expect(await monitor.isConnected)
        await monitor.stop()
    }

    @Test func healthURLThatRefusesConnectionsIsUnreachableAndLinkDownIsNotProbed() async throws {
        let closed = try ClosedPort()
        defer { closed.close() }
        let refusedURL = try #require(URL(string: "http://127.0.0.1:\(closed.port)/health"))
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(
            linkLayer: .scripted(events),
            healthCheckURL: refusedURL,
            session: URLSession(configuration: .ephemeral),
            clock: ManualClock()
        )
        feed.yield(.evaluated(true))
        await monitor.start()
        #expect(await monitor.isConnected == false)

        let live = try LoopbackHTTPServer()
        defer { live.shutdown() }
        let linkDown = NetworkReachabilityMonitor(
            linkLayer: .scripted(AsyncStream { $0.yield(.evaluated(false)) }),
            healthCheckURL: live.url("/health"),
            session: URLSession(configuration: .ephemeral),
            clock: ManualClock()
        )
        await linkDown.start()
        #expect(await linkDown.isConnected == false)
        #expect(live.totalHits == 0)
        await monitor.stop()
        await linkDown.stop()
    }

    @Test func probeThatDoesNotAnswerWithinTheTimeoutIsUnreachable() async throws {
        let server = try LoopbackHTTPServer()
        defer { server.shutdown() }
        server.route("/health", LoopbackResponse.ok().held())
        let clock = ManualClock()
        let (events, feed) = AsyncStream<LinkLayerEvent>.makeStream()
        let monitor = NetworkReachabilityMonitor(
            linkLayer: .scripted(events),
            healthCheckURL: server.url("/health"),
            session: URLSession(configuration: .ephemeral),
            probeTimeout: .seconds(5),
            clock: clock
        )
        feed.yield(.evaluated(true))
        let values = StreamRecorder(await monitor.connectivity)
        await server.waitForHits("/health", atLeast: 1)
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(5))
        #expect(await values.next() == false)
        server.releaseHeld()
        await monitor.stop()
    }
}

// MARK: - Linux: rtnetlink

#if os(Linux)
@Suite("NetworkReachabilityMonitor: rtnetlink on Linux", .timeLimit(.minutes(1)))
struct NetlinkReachabilityTests {
    @Test func parserReadsLinksRoutesAndMultipathNextHopsAndStopsAtDone() {
        var message = NetlinkMessageBuilder()
        message.link(sequence: 9, index: 3, flags: 0x41, name: "veth0", operState: 6)
        message.route(sequence: 9, family: 2, destinationLength: 0, type: 1, flags: 0x10, outputInterface: 3, table: 1000)
        message.multipathRoute(sequence: 9, family: 10, hops: [(interface: 3, flags: 0), (interface: 4, flags: 1)])
        message.link(sequence: 8, index: 99, flags: 0x41, name: "stale", operState: 6)  // another request's answer
        message.done(sequence: 9)
        message.link(sequence: 9, index: 100, flags: 0, name: "after-done", operState: nil)
        let parsed = message.bytes.withUnsafeMutableBytes { NetlinkParser.parse($0, sequence: 9) }

        #expect(parsed.isDone)
        #expect(parsed.errno == nil)
        #expect(parsed.links == [NetlinkLink(index: 3, name: "veth0", flags: 0x41, operState: 6)])
        #expect(
            parsed.routes == [
                NetlinkRoute(
                    family: 2, destinationLength: 0, table: 1000, type: 1,
                    nextHops: [.init(interfaceIndex: 3, flags: 0x10)], nextHopObjectID: nil),
                NetlinkRoute(
                    family: 10, destinationLength: 0, table: 254, type: 1,
                    nextHops: [.init(interfaceIndex: 3, flags: 0), .init(interfaceIndex: 4, flags: 1)], nextHopObjectID: nil),
            ])
    }

    @Test func parserReportsKernelErrorsAndSkipsTruncatedMessages() {
        var error = NetlinkMessageBuilder()
        error.error(sequence: 4, errno: EPERM)
        #expect(error.bytes.withUnsafeMutableBytes { NetlinkParser.parse($0, sequence: 4) }.errno == EPERM)

        var truncated = NetlinkMessageBuilder()
        truncated.link(sequence: 4, index: 3, flags: 0x41, name: "veth0", operState: 6)
        let cut = Array(truncated.bytes.dropLast(12))  // the header's length now runs past the datagram
        var bytes = cut
        let parsed = bytes.withUnsafeMutableBytes { NetlinkParser.parse($0, sequence: 4) }
        #expect(parsed.links.isEmpty)
        #expect(!parsed.isDone)
    }

    @Test func monitorOfThisHostStartsReportsAndStops() async {
        let monitor = NetworkReachabilityMonitor()
        let values = StreamRecorder(await monitor.connectivity, waitingAtMost: .seconds(10))  // starts it
        let first = await values.next()
        #expect(first != nil)
        if let error = await monitor.monitoringError {
            print("NetworkReachabilityMonitor on this host: \(error) — assuming connected")
            #expect(await monitor.isConnected)
        }
        await monitor.stop()
        #expect(await values.next() == nil)
    }

    @Test func namespaceThatCannotBeEnteredIsReportedAndTheNetworkAssumedUp() async {
        let path = "/var/run/netns/resilience-missing-\(UUID().uuidString)"
        let monitor = NetworkReachabilityMonitor(linkLayer: .netlink(namespacePath: path))
        await monitor.start()
        #expect(await monitor.monitoringError == .subscriptionFailed(call: "open \(path)", errno: ENOENT))
        #expect(await monitor.isConnected)
        await monitor.stop()
    }

    /// A network namespace with lo only, then a veth pair (one end in it, the other in a peer
    /// namespace acting as the gateway), addresses and a default route; the monitor watches the
    /// namespace through a netlink socket opened inside it.
    @Test(.enabled(if: NetworkNamespaceLab.isAvailable, "needs root, iproute2 and permission to create network namespaces"))
    func linkDownAndUpInANetworkNamespaceAreReported() async throws {
        let lab = try #require(NetworkNamespaceLab.make(), "the namespace probe passed but the lab could not be built")
        defer { lab.remove() }
        let monitor = NetworkReachabilityMonitor(linkLayer: .netlink(namespacePath: lab.namespacePath))
        await monitor.start()
        #expect(await monitor.monitoringError == nil)
        #expect(await monitor.isConnected == false, "loopback alone is not connected")
        let values = StreamRecorder(await monitor.connectivity, waitingAtMost: .seconds(10))
        #expect(await values.next() == false)

        try lab.connect()
        #expect(await values.next() == true, "veth up with an address and a default route")
        #expect(await monitor.isConnected)

        try lab.ip("-n", lab.namespace, "link", "set", lab.inside, "down")
        #expect(await values.next() == false, "link down")
        #expect(await monitor.isConnected == false)

        try lab.ip("-n", lab.namespace, "link", "set", lab.inside, "up")
        try lab.ip("-n", lab.namespace, "route", "replace", "default", "via", lab.gateway)
        #expect(await values.next() == true, "link up and route restored")
        #expect(await monitor.isConnected)

        try lab.ip("-n", lab.peerNamespace, "link", "set", lab.outside, "down")
        #expect(await values.next() == false, "carrier lost: the far end went down")
        try lab.ip("-n", lab.peerNamespace, "link", "set", lab.outside, "up")
        #expect(await values.next() == true, "carrier back")

        await monitor.stop()
        #expect(await values.next() == nil)
        #expect(await values.received == [false, true, false, true, false, true])
    }
}

/// Two network namespaces for one test, removed (with their veth pair) by `remove()`.
struct NetworkNamespaceLab {
    let namespace: String
    let peerNamespace: String
    let inside: String
    let outside: String
    let gateway = "198.51.100.1"  // TEST-NET-2: documentation addresses, inside our namespaces only
    let address = "198.51.100.2/24"
    let ipPath: String

    var namespacePath: String { "/var/run/netns/\(namespace)" }

    /// The lab with the observed namespace holding only `lo` (up), or `nil` after printing why
    /// namespaces cannot be made here.
    /// Whether a lab can be made here: tried once, with a namespace made and removed at once.
    static let isAvailable: Bool = {
        guard let lab = make() else { return false }
        lab.remove()
        return true
    }()

    static func make() -> NetworkNamespaceLab? {
        func skip(_ reason: String) -> NetworkNamespaceLab? {
            print("Skipping the network namespace test: \(reason)")
            return nil
        }
        guard getuid() == 0 else { return skip("not running as root") }
        guard let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            return skip("no `ip` command (install iproute2)")
        }
        let tag = String(UUID().uuidString.prefix(6)).lowercased()
        let lab = NetworkNamespaceLab(
            namespace: "resilience-reach-\(tag)", peerNamespace: "resilience-reach-\(tag)-peer",
            inside: "rri\(tag)", outside: "rro\(tag)", ipPath: ip
        )
        do {
            try lab.ip("netns", "add", lab.namespace)
        } catch {
            return skip("cannot create a network namespace: \(error)")
        }
        do {
            try lab.ip("netns", "add", lab.peerNamespace)
            try lab.ip("-n", lab.namespace, "link", "set", "lo", "up")
        } catch {
            lab.remove()
            return skip("cannot set up the network namespaces: \(error)")
        }
        return lab
    }

    /// A veth pair made here, one end moved into the namespace and the other into the peer;
    /// addresses on both, both up, and a default route via the peer.
    func connect() throws {
        try ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        try ip("link", "set", inside, "netns", namespace)
        try ip("link", "set", outside, "netns", peerNamespace)
        try ip("-n", peerNamespace, "address", "add", gateway + "/24", "dev", outside)
        try ip("-n", peerNamespace, "link", "set", outside, "up")
        try ip("-n", namespace, "address", "add", address, "dev", inside)
        try ip("-n", namespace, "link", "set", inside, "up")
        try ip("-n", namespace, "route", "add", "default", "via", gateway)
    }

    struct CommandFailed: Error, CustomStringConvertible {
        var description: String
    }

    /// Runs `ip` with `arguments`; throws with its output when it fails.
    func ip(_ arguments: String...) throws {
        // SpawnedProcess, not Foundation.Process, whose run() can crash on Linux (see SpawnedProcess).
        let (termination, data) = try SpawnedProcess.run(ipPath, arguments)
        guard termination == .exited(0) else {
            throw CommandFailed(description: "ip \(arguments.joined(separator: " ")): \(String(decoding: data, as: UTF8.self))")
        }
    }

    /// Deletes both namespaces (which destroys the veth pair) and the host end if it never moved.
    func remove() {
        try? ip("netns", "delete", namespace)
        try? ip("netns", "delete", peerNamespace)
        if FileManager.default.fileExists(atPath: "/sys/class/net/\(outside)") { try? ip("link", "delete", outside) }
    }
}

/// Builds rtnetlink datagrams byte by byte, as the kernel lays them out.
struct NetlinkMessageBuilder {
    var bytes: [UInt8] = []

    private mutating func append<T>(_ value: T) {
        withUnsafeBytes(of: value) { bytes.append(contentsOf: $0) }
    }

    private mutating func pad() {
        while bytes.count % 4 != 0 { bytes.append(0) }
    }

    private static func attribute(_ type: UInt16, _ payload: [UInt8]) -> [UInt8] {
        var result: [UInt8] = []
        withUnsafeBytes(of: UInt16(4 + payload.count)) { result.append(contentsOf: $0) }
        withUnsafeBytes(of: type) { result.append(contentsOf: $0) }
        result += payload
        while result.count % 4 != 0 { result.append(0) }
        return result
    }

    private static func bytes<T>(of value: T) -> [UInt8] {
        withUnsafeBytes(of: value) { Array($0) }
    }

    private mutating func message(type: UInt16, sequence: UInt32, body: [UInt8]) {
        var header = nlmsghdr()
        header.nlmsg_len = UInt32(MemoryLayout<nlmsghdr>.size + body.count)
        header.nlmsg_type = type
        header.nlmsg_flags = UInt16(NLM_F_MULTI)
        header.nlmsg_seq = sequence
        append(header)
        bytes += body
        pad()
    }

    mutating func link(sequence: UInt32, index: Int32, flags: UInt32, name: String, operState: UInt8?) {
        var info = ifinfomsg()
        info.ifi_index = index
        info.ifi_flags = flags
        var body = Self.bytes(of: info)
        body += Self.attribute(UInt16(IFLA_IFNAME), Array(name.utf8) + [0])
        if let operState { body += Self.attribute(UInt16(IFLA_OPERSTATE), [operState]) }
        message(type: UInt16(RTM_NEWLINK), sequence: sequence, body: body)
    }

    mutating func route(sequence: UInt32, family: UInt8, destinationLength: UInt8, type: UInt8, flags: UInt32, outputInterface: Int32, table: UInt32) {
        var header = rtmsg()
        header.rtm_family = family
        header.rtm_dst_len = destinationLength
        header.rtm_table = 252  // RT_TABLE_COMPAT: the real table is in RTA_TABLE
        header.rtm_type = type
        header.rtm_flags = flags
        var body = Self.bytes(of: header)
        body += Self.attribute(UInt16(RTA_TABLE.rawValue), Self.bytes(of: table))
        body += Self.attribute(UInt16(RTA_OIF.rawValue), Self.bytes(of: outputInterface))
        message(type: UInt16(RTM_NEWROUTE), sequence: sequence, body: body)
    }

    mutating func multipathRoute(sequence: UInt32, family: UInt8, hops: [(interface: Int32, flags: UInt8)]) {
        var header = rtmsg()
        header.rtm_family = family
        header.rtm_table = 254
        header.rtm_type = 1
        var nested: [UInt8] = []
        for hop in hops {
            var entry = rtnexthop()
            entry.rtnh_len = UInt16(MemoryLayout<rtnexthop>.size)
            entry.rtnh_flags = hop.flags
            entry.rtnh_ifindex = hop.interface
            nested += Self.bytes(of: entry)
        }
        message(type: UInt16(RTM_NEWROUTE), sequence: sequence, body: Self.bytes(of: header) + Self.attribute(UInt16(RTA_MULTIPATH.rawValue), nested))
    }

    mutating func done(sequence: UInt32) {
        message(type: UInt16(NLMSG_DONE), sequence: sequence, body: Self.bytes(of: Int32(0)))
    }

    mutating func error(sequence: UInt32, errno code: Int32) {
        var failure = nlmsgerr()
        failure.error = -code
        message(type: UInt16(NLMSG_ERROR), sequence: sequence, body: Self.bytes(of: failure))
    }
}
#endif

// MARK: - Support

/// A port on 127.0.0.1 that refuses connections for as long as this value is open: bound without
/// SO_REUSEADDR and never listening, so no other test's server can take it meanwhile (a port freed
/// by shutting a server down could be handed to another test's server and answer 404).
struct ClosedPort {
    struct Failed: Error {}
    let fd: Int32
    let port: Int

    init() throws {
        #if os(Linux)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
        let fd = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Failed() }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard bound == 0, named == 0 else {
            _ = closeDescriptor(fd)
            throw Failed()
        }
        self.fd = fd
        self.port = Int(UInt16(bigEndian: address.sin_port))
    }

    func close() {
        _ = closeDescriptor(fd)
    }
}

private func closeDescriptor(_ fd: Int32) -> Int32 {
    #if os(Linux)
    Glibc.close(fd)
    #else
    Darwin.close(fd)
    #endif
}

/// Collects a stream's values so a test can wait for the next one. Unit tests wait without a
/// timer (their suite's time limit is the safety net). Tests of real kernel events pass
/// `waitingAtMost:`, a wall-clock bound used only as a safety net: a timeout is recorded as a
/// failure and yields `nil`.
actor StreamRecorder {
    private(set) var received: [Bool] = []
    private var finished = false
    private var consumed = 0
    private var waiter: (id: Int, continuation: CheckedContinuation<Void, Never>)?
    private var nextWaiter = 0
    private let bound: Duration?

    init(_ stream: AsyncStream<Bool>, waitingAtMost bound: Duration? = nil) {
        self.bound = bound
        Task { await self.consume(stream) }
    }

    private func consume(_ stream: AsyncStream<Bool>) async {
        for await value in stream {
            received.append(value)
            wake()
        }
        finished = true
        wake()
    }

    /// The next value not returned yet, or `nil` once the stream has finished (or after the bound).
    func next(sourceLocation: SourceLocation = #_sourceLocation) async -> Bool? {
        let deadline = bound.map { ContinuousClock.now.advanced(by: $0) }
        while consumed >= received.count, !finished {
            if let deadline, ContinuousClock.now >= deadline {
                Issue.record("no connectivity value within \(bound!) (received so far: \(received))", sourceLocation: sourceLocation)
                return nil
            }
            nextWaiter += 1
            let id = nextWaiter
            let timer = deadline.map { deadline in
                Task {
                    try? await Task.sleep(until: deadline, clock: .continuous)
                    self.timeOut(id)
                }
            }
            await withCheckedContinuation { waiter = (id, $0) }
            timer?.cancel()
        }
        guard consumed < received.count else { return nil }
        consumed += 1
        return received[consumed - 1]
    }

    private func wake() {
        waiter?.continuation.resume()
        waiter = nil
    }

    private func timeOut(_ id: Int) {
        guard waiter?.id == id else { return }
        wake()
    }
}
