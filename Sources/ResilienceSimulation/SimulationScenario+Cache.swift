import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResponseCache

/// The cache scenario: two users' `CachedRequestEngine`s (partitions `alice` and `bob`) on one
/// `DiskResponseCache` (its files on the simulation's disk) read documents the server keeps
/// changing, over a faulty host, while the device goes on and off line, the disk fails writes,
/// renames and unlinks, and the power goes once or twice (the cache is opened again from what the
/// disk kept: files it never fsyncs may come back cut). Some reads carry the caller's own
/// `If-None-Match` (an app revalidating what it holds), which the cache must pass through
/// without touching what it stores.
///
/// Invariants: a response served as fresh is a version the origin answered or confirmed within
/// its lifetime (`max-age=5`, plus a second of transit) — a 304 applied to the wrong stored
/// response breaks this; a body served is one the origin sent, whole (never a file a crash cut);
/// a `no-store` response is never served twice; a response is never served to another
/// partition's user. The app also edits documents itself and marks what each edit changed stale
/// (`markStale(where:)`, as a delivered write's invalidation does): a read begun after that, with
/// no crash between, is never served a version older than the edit as fresh — an exchange in
/// flight when the mark came must not store what it brings from before the edit as fresh.
struct CacheWorkload {
    let simulation: Simulation

    static let host = "api.sim"
    static let readers = 6
    static let reads = 15
    static let documents = 4  // d0…d3 max-age=5; d4 is no-store
    static let lifetime = Duration.seconds(5)

    private struct Served {
        var name: String
        var user: String
        var document: String
        var body: String
        var started: Duration
        var at: Duration
        var fresh: Bool
        var status: Int
    }

    /// An edit the app made itself: `document` reached `version` on the server, and its reads were
    /// marked stale by `at`.
    private struct OwnEdit {
        var document: String
        var version: Int
        var at: Duration
    }

    func run() async -> [String] {
        let simulation = simulation
        let folder = URL(fileURLWithPath: "/simulation/cache", isDirectory: true)
        simulation.network.setHost(
            Self.host,
            .init(latency: .milliseconds(5)...(.milliseconds(150)), faults: .init(refused: 0.03, resetBefore: 0.03, timeout: 0.03, serverError: 0.05))
        )
        for index in 0..<Self.documents { simulation.origin.setCacheControl("max-age=5", for: "d\(index)") }
        simulation.origin.setCacheControl("no-store", for: "d\(Self.documents)")
        let requestEngine = simulation.makeRequestEngine()
        // The users' engines on the cache now open: nil while the app restarts after a crash.
        let engines = Locked<[(user: String, engine: CachedRequestEngine)]?>(nil)
        do {
            let opened = try open(folder, requestEngine: requestEngine)
            engines.withLock { $0 = opened }
        } catch {
            return ["the cache folder could not be opened: \(error)"]
        }
        if simulation.chance(0.5) { simulation.disk.faults = .init(write: 0.03, rename: 0.03, unlink: 0.03) }
        let served = Locked<[Served]>([])
        let ownEdits = Locked<[OwnEdit]>([])
        let crashTimes = Locked<[Duration]>([])
        let restartFailures = Locked<[String]>([])
        let finished = Locked(false)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                // Other clients change documents on the server.
                while !finished.withLock({ $0 }) {
                    try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(300)...(.seconds(3))))
                    let document = "d\(simulation.random(in: 0...Self.documents))"
                    simulation.origin.bump(document)
                    simulation.record("server changes \(document) to \(simulation.origin.version(of: document))")
                }
            }
            group.addTask {
                // The app's own edits: each reaches the server, then the app marks the reads it
                // changed stale.
                for _ in 0..<simulation.random(in: 0...6) {
                    try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(200)...(.seconds(4))))
                    guard let cache = engines.withLock({ $0?.first?.engine.cache }) else { continue }
                    let document = "d\(simulation.random(in: 0...(Self.documents - 1)))"
                    simulation.origin.bump(document)
                    let version = simulation.origin.version(of: document)
                    let path = "/docs/\(document)"
                    cache.markStale { _, url in url.path == path }
                    ownEdits.withLock { $0.append(OwnEdit(document: document, version: version, at: simulation.now)) }
                    simulation.record("app edits \(document) to \(version); its reads marked stale")
                }
            }
            let crashes = simulation.random(in: 0...2)
            group.addTask {
                // The power goes: every engine in use is dropped, and the app opens the cache
                // again from what the disk kept once the old one is gone.
                for _ in 0..<crashes {
                    try? await simulation.clock.sleep(for: simulation.random(in: .seconds(1)...(.seconds(8))))
                    simulation.disk.crash()
                    crashTimes.withLock { $0.append(simulation.now) }
                    weak let old = engines.withLock { current -> DiskResponseCache? in
                        defer { current = nil }
                        return current?.first?.engine.cache
                    }
                    var waited = Duration.zero
                    while old != nil, waited < .seconds(600) {
                        try? await simulation.clock.sleep(for: .seconds(1))
                        waited += .seconds(1)
                    }
                    simulation.disk.restart()
                    if old != nil { return restartFailures.withLock { $0.append("the crashed cache was still alive 10 minutes later") } }
                    do {
                        let reopened = try open(folder, requestEngine: requestEngine)
                        engines.withLock { $0 = reopened }
                        simulation.record("cache reopened after a crash")
                    } catch {
                        return restartFailures.withLock { $0.append("reopening the cache after a crash failed: \(error)") }
                    }
                }
            }
            group.addTask {
                // Connectivity flips, and ends online.
                for _ in 0..<simulation.random(in: 0...4) {
                    try? await simulation.clock.sleep(for: simulation.random(in: .milliseconds(200)...(.seconds(5))))
                    await simulation.setOnline(simulation.isOffline)
                }
                if simulation.isOffline { await simulation.setOnline(true) }
            }
            await withTaskGroup(of: Void.self) { readers in
                for reader in 0..<Self.readers {
                    readers.addTask {
                        for index in 0..<Self.reads {
                            try? await simulation.clock.sleep(for: simulation.random(in: .zero...(.seconds(1))))
                            // While the app restarts there is no cache to read through.
                            guard let (user, engine) = engines.withLock({ $0.map { $0[reader % $0.count] } }) else { continue }
                            if let one = await readDocument(name: "r\(reader).\(index)", user: user, engine: engine) {
                                served.withLock { $0.append(one) }
                            }
                        }
                    }
                }
            }
            finished.withLock { $0 = true }
        }
        simulation.disk.faults = .none
        return restartFailures.withLock { $0 } + check(served.withLock { $0 }, ownEdits: ownEdits.withLock { $0 }, crashes: crashTimes.withLock { $0 })
    }

    /// Opens the cache in `folder` and one `CachedRequestEngine` per user on it.
    private func open(_ folder: URL, requestEngine: AsyncRequestEngine) throws -> [(user: String, engine: CachedRequestEngine)] {
        let cache = try DiskResponseCache(directory: folder, maxBytes: 1 << 20)
        return ["alice", "bob"].map { user in
            (
                user,
                CachedRequestEngine(
                    requestEngine: requestEngine,
                    cache: cache,
                    reachabilityMonitor: simulation.connectivity,
                    configuration: .init(partition: user),
                    clock: simulation.clock
                )
            )
        }
    }

    private func readDocument(name: String, user: String, engine: CachedRequestEngine) async -> Served? {
        let simulation = simulation
        let document = "d\(simulation.random(in: 0...Self.documents))"
        var request = SimulatedRequest(url: URL(string: "https://\(Self.host)/docs/\(document)")!, method: .get)
        request.headers = ["Authorization": "Bearer \(user)", "X-Sim-User": user]
        if simulation.chance(0.2) {
            // The app revalidates a version it holds itself.
            let held = max(0, simulation.origin.version(of: document) - simulation.random(in: 0...2))
            request.headers["If-None-Match"] = "\"\(document)-\(held)\""
        }
        let mode = simulation.pick([NetworkMode.online, .online, .offlineFirst, .always])
        let started = simulation.now
        do {
            let answer = try await engine.response(for: request, mode: mode, staleTime: .http)
            let body = String(decoding: answer.data, as: UTF8.self)
            let fresh = !answer.isStale
            simulation.record(
                "\(name) \(user) GET \(document) \(mode)\(request.headers["If-None-Match"].map { " if-none-match \($0)" } ?? "") -> \(answer.response.statusCode) \(answer.source) \(fresh ? "fresh" : "stale") \(body)"
            )
            return Served(
                name: name, user: user, document: document, body: body, started: started, at: simulation.now, fresh: fresh,
                status: answer.response.statusCode
            )
        } catch {
            simulation.record("\(name) \(user) GET \(document) \(mode) -> error \(error)")
            return nil
        }
    }

    private func check(_ served: [Served], ownEdits: [OwnEdit], crashes: [Duration]) -> [String] {
        var violations: [String] = []
        // A no-store response may answer every caller whose identical request shared its fetch
        // (deduplication), but none that asked after it had arrived.
        var serials: [String: Served] = [:]
        for one in served.sorted(by: { $0.at < $1.at }) where one.status == 200 {
            // "ID=VERSION#SERIAL@USER"
            guard let equals = one.body.firstIndex(of: "="), let hash = one.body.firstIndex(of: "#"), let at = one.body.firstIndex(of: "@"),
                let version = Int(one.body[one.body.index(after: equals)..<hash])
            else {
                violations.append("\(one.name): a body the origin never sent: \(one.body)")
                continue
            }
            let serial = String(one.body[one.body.index(after: hash)..<at])
            let owner = String(one.body[one.body.index(after: at)...])
            if owner != one.user { violations.append("\(one.name): \(one.user) was served \(owner)'s response (\(one.body))") }
            if one.document == "d\(Self.documents)" {
                if let first = serials[serial], one.started > first.at {
                    violations.append(
                        "\(one.name): the no-store response \(one.body) was served again, asked at \(one.started) after it reached \(first.name) at \(first.at)"
                    )
                }
                if serials[serial] == nil { serials[serial] = one }
            }
            // (A crash between the edit and the read may lose the mark, which is not fsynced.)
            if one.fresh,
                let edit = ownEdits.last(where: { edit in
                    edit.document == one.document && edit.at < one.started && !crashes.contains { edit.at <= $0 && $0 <= one.started }
                }), version < edit.version
            {
                violations.append(
                    "\(one.name): served \(one.body) as fresh, asked at \(one.started) after the app's edit made \(one.document) version \(edit.version) at \(edit.at)"
                )
            }
            if one.fresh, one.document != "d\(Self.documents)" {
                let confirmed = simulation.origin.lastConfirmed(one.document, version: version)
                if confirmed.map({ one.at - $0 > Self.lifetime + .seconds(1) }) ?? true {
                    violations.append(
                        "\(one.name): served \(one.body) as fresh at \(one.at), but the origin last confirmed that version at \(confirmed.map { "\($0)" } ?? "no time")"
                    )
                }
            }
        }
        return violations
    }
}
