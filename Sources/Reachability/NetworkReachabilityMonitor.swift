import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Network)
import Network
#endif

/// Reports whether the system has a usable network path, from the operating system's own view:
/// `NWPathMonitor` on Apple platforms, the kernel's link and route tables over rtnetlink on Linux.
/// Optionally, a health URL must answer before the network counts as reachable.
///
/// ```swift
/// let monitor = NetworkReachabilityMonitor(healthCheckURL: URL(string: "https://api.example.com/health"))
/// await monitor.start()                      // returns once the first state is known
/// for await connected in await monitor.connectivity { … }
/// ```
///
/// **When connected.** On Apple platforms: the path is `.satisfied`. On Linux: some IPv4 or IPv6
/// default route is usable — a unicast default route through an interface that is not loopback,
/// is up and running (carrier present, RFC 2863 state up or unknown), and whose next hop is not
/// dead or link-down. A subnet route alone (a Docker bridge, a LAN without a gateway) does not
/// count, nor does loopback.
///
/// **Health probe.** With a `healthCheckURL`, `true` is reported only after a GET to it gets any
/// HTTP response (any status: the server was reached); a transport failure (refused, DNS,
/// timeout after `probeTimeout`) reports `false`. The URL is probed whenever the system reports a
/// change while the network is up, and every `probeInterval` while it stays up. When the system
/// says the network is down, `false` is reported at once and no probe is sent.
///
/// **Lifecycle.** Monitoring starts with `start()`, or by itself the first time `isConnected` or
/// `connectivity` is read, so a fresh monitor handed to `OfflineQueueEngine` works without a
/// `start()` call. `stop()` ends monitoring and finishes every `connectivity` stream; `start()`
/// afterwards monitors again.
///
/// **When the system cannot be watched** (a sandbox that forbids netlink sockets, an unsupported
/// platform) nothing crashes: `monitoringError` says why, and the monitor assumes the network is
/// up — so `isConnected` is `true`, or with a health URL, whatever the periodic probe finds. The
/// offline queue still learns of outages passively, from `NetworkError.noConnection`.
public actor NetworkReachabilityMonitor: ReachabilityMonitoring {
    /// Why the system's network state could not be watched. See `monitoringError`.
    public enum MonitoringError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Subscribing to the kernel's notifications failed: `call` is the failed system call
        /// (`"socket"` in a sandbox that forbids AF_NETLINK sockets, `"bind"`, …). The monitor
        /// then assumes the network is up.
        case subscriptionFailed(call: String, errno: Int32)
        /// Reading the kernel's link and route tables failed. Until a read succeeds (it is retried
        /// every second), the last state stands — or, if there is none yet, the network is assumed up.
        case dumpFailed(errno: Int32)
        /// This platform has neither `NWPathMonitor` nor rtnetlink; the network is assumed up.
        case unsupportedPlatform

        /// The failed call and the system's message for its `errno`.
        public var description: String {
            switch self {
            case .subscriptionFailed(let call, let code):
                return "NetworkReachabilityMonitor: \(call) failed: \(String(cString: strerror(code))) (errno \(code))"
            case .dumpFailed(let code):
                return "NetworkReachabilityMonitor: reading the link and route tables failed: \(String(cString: strerror(code))) (errno \(code))"
            case .unsupportedPlatform:
                return "NetworkReachabilityMonitor: no network monitoring on this platform"
            }
        }
    }

    #if canImport(Network)
    /// Creates a monitor that reports `monitor`'s path status (`.satisfied` is connected).
    ///
    /// - Parameters:
    ///   - monitor: the path monitor to use for the first `start()` (an `NWPathMonitor` cannot be
    ///     restarted, so a `start()` after `stop()` uses a new `NWPathMonitor()`).
    ///   - healthCheckURL: when set, the network counts as reachable only once a GET to this URL
    ///     gets an HTTP response; `nil` (default): the system's view alone decides.
    ///   - session: sends the probe (default `URLSession.shared`).
    ///   - probeTimeout: how long a probe may take before it counts as a failure (default 5 s).
    ///   - probeInterval: how often the URL is probed again while the network is up (default 30 s).
    ///   - clock: the clock the probe timeout and interval run on.
    public init(
        monitor: NWPathMonitor = NWPathMonitor(),
        healthCheckURL: URL? = nil,
        session: any NetworkSession = URLSession.shared,
        probeTimeout: Duration = .seconds(5),
        probeInterval: Duration = .seconds(30),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.init(
            linkLayer: .pathMonitor(PathMonitorBox(monitor)),
            healthCheckURL: healthCheckURL,
            session: session,
            probeTimeout: probeTimeout,
            probeInterval: probeInterval,
            clock: clock
        )
    }
    #else
    /// Creates a monitor of this system's network (rtnetlink on Linux).
    ///
    /// - Parameters:
    ///   - healthCheckURL: when set, the network counts as reachable only once a GET to this URL
    ///     gets an HTTP response; `nil` (default): the system's view alone decides.
    ///   - session: sends the probe (default `URLSession.shared`).
    ///   - probeTimeout: how long a probe may take before it counts as a failure (default 5 s).
    ///   - probeInterval: how often the URL is probed again while the network is up (default 30 s).
    ///   - clock: the clock the probe timeout and interval run on.
    public init(
        healthCheckURL: URL? = nil,
        session: any NetworkSession = URLSession.shared,
        probeTimeout: Duration = .seconds(5),
        probeInterval: Duration = .seconds(30),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        self.init(
            linkLayer: .netlink(namespacePath: nil),
            healthCheckURL: healthCheckURL,
            session: session,
            probeTimeout: probeTimeout,
            probeInterval: probeInterval,
            clock: clock
        )
    }
    #endif

    /// Whether the network is usable, as last determined; `false` until the first determination
    /// (`await start()` returns after it). After `stop()`, the last state. Reading it starts
    /// monitoring if it was never started.
    public var isConnected: Bool {
        startIfNeverStarted()
        return machine.reported ?? false
    }

    /// A new stream for each access: it yields the current state first (as soon as it is known),
    /// then every change, never the same value twice in a row, and finishes on `stop()`. Reading
    /// it starts monitoring if it was never started; after `stop()` the stream yields the last
    /// state and finishes at once.
    public var connectivity: AsyncStream<Bool> {
        startIfNeverStarted()
        guard phase == .running else {
            let (stream, continuation) = AsyncStream<Bool>.makeStream()
            if let reported = machine.reported { continuation.yield(reported) }
            continuation.finish()
            return stream
        }
        return subscribers.stream(first: machine.reported)
    }

    /// Why the system's network state cannot be watched right now, or `nil` when it is being
    /// watched (or monitoring has not started).
    public private(set) var monitoringError: MonitoringError?

    /// Starts monitoring and returns once the first state is known (with a health URL, once the
    /// first probe has answered or timed out). Does nothing more while already started; after
    /// `stop()`, monitors again. A cancelled caller returns at once; monitoring goes on.
    public func start() async {
        startMonitoring()
        guard !machine.isSettled else { return }
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if machine.isSettled || phase != .running || Task.isCancelled {
                    continuation.resume()
                } else {
                    startWaiters[id] = continuation
                }
            }
        } onCancel: {
            Task { await self.resumeStartWaiter(id) }
        }
    }

    /// Stops monitoring: no more system events or probes, every `connectivity` stream finishes,
    /// and `isConnected` keeps its last value. `start()` may be called again afterwards.
    public func stop() {
        guard phase == .running else { return }
        phase = .stopped
        linkLayerHandle?.stop()
        linkLayerHandle = nil
        consumer?.cancel()
        consumer = nil
        probeTask?.cancel()
        probeTask = nil
        machine.stopped()
        subscribers.finishAll()
        resumeStartWaiters()
    }

    // MARK: - Internals

    /// Where the system's view of the network comes from.
    enum LinkLayerSource: Sendable {
        #if canImport(Network)
        /// `NWPathMonitor` (Apple platforms).
        case pathMonitor(PathMonitorBox)
        #endif
        /// rtnetlink (Linux), in the network namespace at `namespacePath` (for tests: e.g.
        /// `/var/run/netns/NAME`), or in the process's own when `nil`.
        case netlink(namespacePath: String?)
        /// Events fed by hand (tests).
        case scripted(AsyncStream<LinkLayerEvent>)
    }

    private enum Phase {
        case idle, running, stopped
    }

    private var linkLayer: LinkLayerSource
    private let probe: HealthProbe?
    private let time: TimeSource
    private var machine: NetworkReachabilityStateMachine
    private var phase = Phase.idle
    private var run: UInt64 = 0
    private var linkLayerHandle: LinkLayerHandle?
    private var consumer: Task<Void, Never>?
    private var probeTask: Task<Void, Never>?
    private nonisolated let subscribers = StreamSubscribers<Bool>()
    private var startWaiters: [UUID: CheckedContinuation<Void, Never>] = [:]

    init(
        linkLayer: LinkLayerSource,
        healthCheckURL: URL? = nil,
        session: any NetworkSession = URLSession.shared,
        probeTimeout: Duration = .seconds(5),
        probeInterval: Duration = .seconds(30),
        clock: some Clock<Duration> = ContinuousClock()
    ) {
        let time = TimeSource(clock)
        self.linkLayer = linkLayer
        self.time = time
        self.probe = healthCheckURL.map {
            HealthProbe(
                url: $0,
                session: session,
                timeout: max(.milliseconds(1), probeTimeout),
                interval: max(.milliseconds(1), probeInterval),
                time: time
            )
        }
        self.machine = NetworkReachabilityStateMachine(probes: healthCheckURL != nil)
    }

    deinit {
        linkLayerHandle?.stop()
        consumer?.cancel()
        probeTask?.cancel()
        subscribers.finishAll()
        for waiter in startWaiters.values { waiter.resume() }
    }

    private func startIfNeverStarted() {
        if phase == .idle { startMonitoring() }
    }

    private func startMonitoring() {
        guard phase != .running else { return }
        phase = .running
        run &+= 1
        let run = self.run
        let (events, handle) = openLinkLayer()
        linkLayerHandle = handle
        // One consumer, so events are handled in the order the system produced them.
        consumer = Task { [weak self] in
            for await event in events {
                guard let self else { return }
                await self.handle(event, run: run)
            }
        }
    }

    private func openLinkLayer() -> (AsyncStream<LinkLayerEvent>, LinkLayerHandle) {
        switch linkLayer {
        #if canImport(Network)
        case .pathMonitor(let box):
            // An NWPathMonitor cannot be started twice: the next start() gets a new one.
            linkLayer = .pathMonitor(PathMonitorBox(NWPathMonitor()))
            let (events, continuation) = AsyncStream<LinkLayerEvent>.makeStream()
            box.monitor.pathUpdateHandler = { path in
                continuation.yield(.evaluated(path.status == .satisfied))
            }
            box.monitor.start(queue: DispatchQueue(label: "resilience.reachability.path"))
            return (
                events,
                LinkLayerHandle {
                    box.monitor.cancel()
                    continuation.finish()
                }
            )
        #endif
        case .netlink(let namespacePath):
            let (events, continuation) = AsyncStream<LinkLayerEvent>.makeStream()
            #if os(Linux)
            let watcher = NetlinkWatcher.start(namespacePath: namespacePath, events: continuation)
            return (events, LinkLayerHandle { watcher.stop() })
            #else
            _ = namespacePath
            continuation.yield(.unavailable(.unsupportedPlatform))
            continuation.finish()
            return (events, LinkLayerHandle {})
            #endif
        case .scripted(let events):
            return (events, LinkLayerHandle {})
        }
    }

    private func handle(_ event: LinkLayerEvent, run: UInt64) {
        guard run == self.run, phase == .running else { return }
        switch event {
        case .evaluated(let up):
            monitoringError = nil
            perform(machine.linkLayerEvaluated(up))
        case .unavailable(let error):
            monitoringError = error
            // Without any verdict yet, assume the network is up (see the type's documentation);
            // with one, it stands until the system can be read again.
            if machine.linkLayerUp == nil { perform(machine.linkLayerEvaluated(true)) }
        }
    }

    private func perform(_ actions: [NetworkReachabilityStateMachine.Action]) {
        for action in actions {
            switch action {
            case .publish(let connected):
                subscribers.yield(connected)
            case .startProbe(let generation):
                probeTask?.cancel()
                guard let probe else { break }
                probeTask = Task { [weak self] in
                    let reachable = await probe.run()
                    guard !Task.isCancelled else { return }
                    await self?.probeFinished(generation: generation, reachable: reachable)
                }
            case .cancelProbe:
                probeTask?.cancel()
                probeTask = nil
            case .scheduleProbe(let generation):
                probeTask?.cancel()
                guard let probe else { break }
                let time = self.time
                probeTask = Task { [weak self] in
                    do { try await time.sleep(probe.interval) } catch { return }
                    await self?.probeTimerFired(generation: generation)
                }
            }
        }
        if machine.isSettled { resumeStartWaiters() }
    }

    private func probeFinished(generation: UInt64, reachable: Bool) {
        guard phase == .running else { return }
        perform(machine.probeFinished(generation: generation, reachable: reachable))
    }

    private func probeTimerFired(generation: UInt64) {
        guard phase == .running else { return }
        perform(machine.probeTimerFired(generation: generation))
    }

    private func resumeStartWaiters() {
        let waiters = startWaiters.values
        startWaiters.removeAll()
        for waiter in waiters { waiter.resume() }
    }

    private func resumeStartWaiter(_ id: UUID) {
        startWaiters.removeValue(forKey: id)?.resume()
    }
}

/// What the system-facing side reports to the monitor.
enum LinkLayerEvent: Sendable, Equatable {
    /// The system's state was read: is there a usable path?
    case evaluated(Bool)
    /// The system's state cannot be read (see `NetworkReachabilityMonitor.MonitoringError`).
    case unavailable(NetworkReachabilityMonitor.MonitoringError)
}

/// Stops a link-layer source: the netlink thread, or the path monitor.
struct LinkLayerHandle: Sendable {
    let stop: @Sendable () -> Void
}

/// One GET to the health URL: any HTTP response means reachable; a transport failure or no answer
/// within `timeout` (on the injected clock, or URLSession's own timer) means not.
struct HealthProbe: Sendable {
    let url: URL
    let session: any NetworkSession
    let timeout: Duration
    let interval: Duration
    let time: TimeSource

    func run() async -> Bool {
        var request = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalAndRemoteCacheData, timeoutInterval: timeout.seconds)
        request.httpMethod = "GET"
        let probeRequest = request
        let session = self.session
        let time = self.time
        let timeout = self.timeout
        return await withTaskGroup(of: Bool?.self) { group in
            group.addTask {
                do {
                    let (_, response) = try await session.data(for: probeRequest)
                    return response is HTTPURLResponse
                } catch {
                    return false
                }
            }
            group.addTask {
                do {
                    try await time.sleep(timeout)
                    return false
                } catch {
                    return nil  // cancelled: the request finished first
                }
            }
            for await outcome in group {
                if let outcome {
                    group.cancelAll()
                    return outcome
                }
            }
            return false
        }
    }
}

#if canImport(Network)
/// Carries an `NWPathMonitor` into the `@Sendable` stop closure.
// @unchecked Sendable: NWPathMonitor wraps a thread-safe nw_path_monitor_t (current SDKs declare it
// Sendable); the box is immutable, and only start(queue:) and cancel() are called on the monitor,
// each once, from the actor and from the stop closure.
final class PathMonitorBox: @unchecked Sendable {
    let monitor: NWPathMonitor
    init(_ monitor: NWPathMonitor) { self.monitor = monitor }
}
#endif
