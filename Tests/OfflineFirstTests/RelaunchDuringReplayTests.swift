import Foundation
import OfflineFirst
import OfflineQueue
import Reachability
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import ResponseCache
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// "A relaunch — offline, in a new process — shows the same screen", held under SIGKILL while the
/// queue replays: some entries delivered, the list refetched and stored with them in it, their
/// files not yet deleted (deletions go in batches). Every relaunch must show each write once.
///
/// Real parts only: a notes server on 127.0.0.1, URLSession, the queue and cache folders, and a
/// child process per launch (an exit test) that kills itself with SIGKILL at a moment drawn
/// from its cycle number. Public API only, so it keeps compiling while the layers' internals change.
@Suite("A relaunch after SIGKILL during replay shows each write once", .timeLimit(.minutes(5)))
struct RelaunchDuringReplayTests {
    /// Children killed; one more child then opens the folders, drains and settles.
    static let kills = 20

    @Test(.timeLimit(.minutes(5)))
    func aRelaunchAfterAKillDuringReplayShowsEachAcknowledgedWriteOnce() async throws {
        #if os(Linux) || os(macOS)
        let notes = try NotesServer(notes: ["seed"])
        defer { notes.server.shutdown() }
        let folder = TemporaryDirectory()
        let scratch = TemporaryDirectory()
        try FileManager.default.createDirectory(at: scratch.url, withIntermediateDirectories: true)
        let files = Files(directory: scratch.url.path)
        let url = notes.server.url("/notes").absoluteString
        var acknowledged: [String] = []
        var seenDelivered: Set<String> = []
        var tally = Tally()

        for cycle in 0...Self.kills {
            let (path, directory) = (folder.url.path, files.directory)
            if cycle < Self.kills {
                try await ExitTests.oneAtATime {
                    await #expect(processExitsWith: .signal(SIGKILL)) { [cycle = cycle as Int, path = path as String, url = url as String, directory = directory as String] in
                        try await RelaunchDuringReplayTests.launch(cycle: cycle, folder: path, url: url, files: directory)
                    }
                }
            } else {
                try await ExitTests.oneAtATime {
                    await #expect(processExitsWith: .success) { [cycle = cycle as Int, path = path as String, url = url as String, directory = directory as String] in
                        try await RelaunchDuringReplayTests.finalLaunch(cycle: cycle, folder: path, url: url, files: directory)
                    }
                }
            }
            // This child's first screen is the relaunch after the previous child's kill.
            let log = files.lines(files.log(cycle - 1))
            seenDelivered.formUnion(log.filter { $0.hasPrefix("D ") }.map { String($0.dropFirst(2)) })
            let screen = try #require(files.screen(cycle), "cycle \(cycle): the launch wrote no screen")
            let relaunch = Relaunch(screen: screen.notes, acknowledged: acknowledged, seenDelivered: seenDelivered)
            let moment = log.last { $0.hasPrefix("K ") }.map { String($0.dropFirst(2)) } ?? (cycle == 0 ? "first launch" : "no kill recorded")
            if cycle > 0 { tally.record(relaunch, moment: moment) }
            #expect(
                relaunch.shownTwice.isEmpty && relaunch.inFlight.isEmpty && relaunch.missing.isEmpty,
                """
                relaunch \(cycle) (after: \(moment); \(screen.pending) pending, GET #\(screen.served ?? "-") from the \(screen.source)): \
                shown twice \(relaunch.shownTwice), missing \(relaunch.missing), in flight at the kill \(relaunch.inFlight)
                """
            )
            acknowledged += files.lines(files.acks(cycle))
        }

        // The last child drained the queue and settled: the server holds every acknowledged note
        // once (replays carried their Idempotency-Key), and the screen is the server's list.
        let held = notes.notes
        let lostOnServer = acknowledged.filter { note in !held.contains(note) }
        let twiceOnServer = Set(held.filter { note in held.filter { $0 == note }.count > 1 })
        #expect(lostOnServer.isEmpty && twiceOnServer.isEmpty, "server: lost \(lostOnServer), twice \(twiceOnServer.sorted())")
        let settled = try #require(files.finalScreen, "the final launch wrote no settled screen")
        #expect(settled.notes == held, "the settled screen \(settled.notes) is not the server's list \(held)")
        let resent = notes.posts.count - Set(notes.posts.map(\.key)).count
        print(
            "relaunch-during-replay test: \(Self.kills) SIGKILLs (\(tally.moments)), \(acknowledged.count) acknowledged notes, "
                + "\(tally.screens) relaunch screens checked, \(tally.failed) wrong: \(tally.shownTwice) notes shown twice, \(tally.missing) missing, "
                + "\(tally.inFlight) in flight at the kill shown twice; \(resent) replays re-sent a key the server had"
        )
        #endif
    }
}

// MARK: - The parent's side

extension RelaunchDuringReplayTests {
    /// A notes server: `GET /notes` answers the list (`max-age=60`, and `X-Served: <n>` numbering
    /// the GETs), `POST /notes` appends its body once per `Idempotency-Key` (201). Every POST is
    /// logged.
    final class NotesServer: Sendable {
        struct Post: Sendable {
            let note: String
            let key: String
        }

        private struct State: Sendable {
            var notes: [String]
            var keys: Set<String> = []
            var posts: [Post] = []
            var served = 0
        }

        let server: LoopbackHTTPServer
        private let state: Locked<State>

        init(notes: [String]) throws {
            server = try LoopbackHTTPServer()
            let state = Locked(State(notes: notes))
            self.state = state
            server.route(
                "/notes",
                handler: { request in
                    if request.method == "POST" {
                        let note = String(decoding: request.body, as: UTF8.self)
                        let key = request.header("idempotency-key") ?? ""
                        state.withLock { state in
                            if state.keys.insert(key).inserted { state.notes.append(note) }
                            state.posts.append(Post(note: note, key: key))
                        }
                        return .status(201)
                    }
                    let (notes, served) = state.withLock { state in
                        state.served += 1
                        return (state.notes, state.served)
                    }
                    return .status(
                        200, headers: ["Cache-Control": "max-age=60", "Content-Type": "application/json", "X-Served": "\(served)"],
                        body: String(decoding: Notes.encode(notes), as: UTF8.self))
                })
        }

        var notes: [String] { state.withLock { $0.notes } }
        var posts: [Post] { state.withLock { $0.posts } }
    }

    /// What one relaunch screen shows against what was acknowledged before the kill.
    struct Relaunch {
        /// Notes shown more than once that some launch saw delivered (`D` in its log): an
        /// entry whose delivery the queue had taken in, overlaid on a list that has it.
        var shownTwice: [String] = []
        /// Shown twice, never seen delivered: a launch sent it and was killed between the server
        /// applying the POST and reading its answer. The queue notes the entry on the wire, and no
        /// list is stored while such a write is of unknown fate, so this too is a failure.
        var inFlight: [String] = []
        /// Acknowledged (`mutate` returned) and not shown.
        var missing: [String] = []

        init(screen: [String], acknowledged: [String], seenDelivered: Set<String>) {
            var counts: [String: Int] = [:]
            for note in screen { counts[note, default: 0] += 1 }
            for (note, count) in counts.sorted(by: { $0.key < $1.key }) where count > 1 {
                if seenDelivered.contains(note) {
                    shownTwice.append(note)
                } else {
                    inFlight.append(note)
                }
            }
            missing = acknowledged.filter { counts[$0] == nil }
        }
    }

    struct Tally {
        var screens = 0
        var failed = 0
        var shownTwice = 0
        var inFlight = 0
        var missing = 0
        private var byMoment: [String: Int] = [:]

        mutating func record(_ relaunch: Relaunch, moment: String) {
            screens += 1
            if !relaunch.shownTwice.isEmpty || !relaunch.inFlight.isEmpty || !relaunch.missing.isEmpty { failed += 1 }
            shownTwice += relaunch.shownTwice.count
            inFlight += relaunch.inFlight.count
            missing += relaunch.missing.count
            let kind = moment.prefix { $0 != "#" && $0 != ":" }.trimmingCharacters(in: .whitespaces)
            byMoment[kind, default: 0] += 1
        }

        var moments: String { byMoment.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ") }
    }

    /// Where the children write what the parent reads: each line with one `write` (survives SIGKILL).
    struct Files: Sendable {
        let directory: String

        /// The screen a launch showed first, offline, before doing anything.
        func screenPath(_ cycle: Int) -> String { "\(directory)/screen-\(cycle).json" }
        /// Notes whose `mutate` returned, one a line.
        func acks(_ cycle: Int) -> String { "\(directory)/acks-\(cycle)" }
        /// `P <plan>` first, `D <note>` for each delivery the child saw on the queue's changes,
        /// `K <moment>` just before the kill.
        func log(_ cycle: Int) -> String { "\(directory)/log-\(cycle)" }
        var settledPath: String { "\(directory)/settled.json" }

        func lines(_ path: String) -> [String] {
            ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        func screen(_ cycle: Int) -> Screen? { read(screenPath(cycle)) }
        var finalScreen: Screen? { read(settledPath) }

        private func read(_ path: String) -> Screen? {
            FileManager.default.contents(atPath: path).flatMap { try? JSONDecoder().decode(Screen.self, from: $0) }
        }
    }

    struct Screen: Codable, Sendable {
        let notes: [String]
        let source: String
        let pending: Int
        let settling: Int
        /// The `X-Served` number of the GET the body came from.
        let served: String?
        /// The queue's entries (their notes) in replay order when the screen was taken.
        let queued: [String]

        init(_ snapshot: QuerySnapshot, queued: [QueueEntry]) {
            self.queued = queued.map { String(decoding: $0.body ?? Data(), as: UTF8.self) }
            notes = Notes.decode(snapshot.data) ?? []
            source = "\(snapshot.source)"
            pending = snapshot.pendingEntryIDs.count
            settling = snapshot.settlingEntryIDs.count
            served = snapshot.response?.value(forHTTPHeaderField: "X-Served")
        }

        func write(to path: String) {
            guard let json = try? JSONEncoder().encode(self) else { return }
            ExitTests.append(String(decoding: json, as: UTF8.self), toFileAt: path)
        }
    }
}

// MARK: - The children's side

extension RelaunchDuringReplayTests {
    /// When a launch kills itself: after the k-th event of a kind, or after a delay, or once its
    /// work is done (the queue drained).
    enum Trigger: Sendable, CustomStringConvertible {
        /// The k-th delivery seen on `queue.changes` (its file's deletion batched, or not yet run).
        case delivery(Int)
        /// The k-th attempt started (a POST in flight).
        case attempt(Int)
        /// The k-th GET that landed in the live read (`source == .network`, a new `X-Served`)
        /// after a delivery, with the deliveries before it in it, while the pass goes on; the
        /// cache may still be writing it to its file.
        case refetch(Int)
        /// The same, once the cache has written it to its file (`waitForWrites()`): the list is
        /// stored with the writes in it, their entries' files possibly not yet deleted.
        case stored(Int)
        case wallClock(milliseconds: Int)
        case drained

        var description: String {
            switch self {
            case .delivery(let k): "delivery #\(k)"
            case .attempt(let k): "attempt #\(k)"
            case .refetch(let k): "refetch #\(k)"
            case .stored(let k): "stored refetch #\(k)"
            case .wallClock(let milliseconds): "wall-clock: \(milliseconds) ms online"
            case .drained: "drained"
            }
        }
    }

    /// What a launch does, drawn from its cycle number.
    struct Plan: Sendable {
        /// Notes saved offline before going online: more than a batch of deletions (16).
        let queuedOffline: Int
        let onlineWhileReplaying: Int
        /// Deliveries seen before connectivity drops for a while.
        let flipAfter: Int
        let queuedWhileFlipped: Int
        let onlineAfterFlip: Int
        let trigger: Trigger

        init(cycle: Int) {
            var random = SplitMix64(seed: 0x4B11_7E57 &+ UInt64(cycle) &* 0x9E37_79B9)
            func draw(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &random) }
            queuedOffline = draw(18...26)
            onlineWhileReplaying = draw(1...2)
            flipAfter = draw(2...10)
            queuedWhileFlipped = draw(1...3)
            onlineAfterFlip = draw(1...2)
            // Each kind of moment in turn (four kills each in twenty), its event count drawn. A
            // count the launch never reaches ends in a kill once the queue drained.
            trigger =
                switch cycle % 5 {
                case 0: .stored(draw(1...3))
                case 1: .delivery(draw(1...queuedOffline))
                case 2: .refetch(draw(1...3))
                case 3: .attempt(draw(1...queuedOffline))
                default: .wallClock(milliseconds: draw(5...150))
                }
        }
    }

    /// Counts the events a trigger waits for and kills the process at its moment.
    final class Killer: Sendable {
        enum Event: Hashable, Sendable { case delivery, attempt, refetch }

        let trigger: Trigger
        let log: String
        let cache: DiskResponseCache
        private let counts = Locked([Event: Int]())

        init(trigger: Trigger, log: String, cache: DiskResponseCache) {
            self.trigger = trigger
            self.log = log
            self.cache = cache
        }

        func saw(_ event: Event) {
            guard let count = count(event) else { return }
            switch (trigger, event) {
            case (.delivery(let k), .delivery) where count == k, (.attempt(let k), .attempt) where count == k,
                (.refetch(let k), .refetch) where count == k:
                fire(trigger.description)
            default:
                break
            }
        }

        /// A GET landed in the live read: counted once a delivery was seen.
        func sawRefetch() async {
            guard let count = count(.refetch) else { return }
            switch trigger {
            case .refetch(let k) where count == k:
                fire(trigger.description)
            case .stored(let k) where count == k:
                await cache.waitForWrites()
                fire(trigger.description)
            default:
                break
            }
        }

        private func count(_ event: Event) -> Int? {
            counts.withLock { counts in
                if event == .refetch && counts[.delivery, default: 0] == 0 { return nil }
                counts[event, default: 0] += 1
                return counts[event, default: 0]
            }
        }

        /// Starts the wall-clock trigger's timer (the only trigger that sleeps).
        func wentOnline() {
            guard case .wallClock(let milliseconds) = trigger else { return }
            Thread { [self] in
                usleep(UInt32(milliseconds) * 1000)
                fire(trigger.description)
            }.start()
        }

        func fire(_ moment: String) -> Never {
            ExitTests.append("K \(moment)\n", toFileAt: log)
            kill(getpid(), SIGKILL)
            while true { pause() }
        }
    }

    /// A launch's live read, taken from a task of its own: the trigger sees each GET land, the
    /// launch waits for snapshots without polling.
    struct LiveScreen {
        let snapshots: StreamCollector<QuerySnapshot>
        let task: Task<Void, Never>

        init(_ stream: AsyncThrowingStream<QuerySnapshot, any Error>, killer: Killer?) {
            let (shown, input) = AsyncStream<QuerySnapshot>.makeStream()
            snapshots = StreamCollector(shown)
            task = Task {
                var served: Set<String> = []
                do {
                    for try await snapshot in stream {
                        input.yield(snapshot)
                        if snapshot.source == .network, let number = snapshot.response?.value(forHTTPHeaderField: "X-Served"),
                            served.insert(number).inserted
                        {
                            await killer?.sawRefetch()
                        }
                    }
                } catch {}
                input.finish()
            }
        }

        var first: QuerySnapshot {
            get async {
                await snapshots.wait(for: 1)
                return snapshots.items[0]
            }
        }

        /// Waits until the latest snapshot satisfies `condition`.
        func waitFor(_ condition: (QuerySnapshot) -> Bool) async -> QuerySnapshot {
            while true {
                let seen = snapshots.items
                if let latest = seen.last, condition(latest) { return latest }
                await snapshots.wait(for: seen.count + 1)
            }
        }
    }

    /// A child that stops itself if something hangs (it would otherwise hold the parent until
    /// the time limit): the killed launches by SIGKILL (logged), the final one by exiting 3.
    static func watchdog(log: String, exitCode: Int32?) {
        Thread {
            sleep(90)
            ExitTests.append("K watchdog: hung\n", toFileAt: log)
            if let exitCode { exit(exitCode) }
            kill(getpid(), SIGKILL)
        }.start()
    }

    /// One launch that is killed: shows its first screen offline, then saves notes offline, goes
    /// online while the queue replays them (saving more, online and offline), and kills itself
    /// at its plan's moment.
    static func launch(cycle: Int, folder: String, url: String, files: String) async throws {
        let files = Files(directory: files)
        let log = files.log(cycle)
        watchdog(log: log, exitCode: nil)
        let plan = Plan(cycle: cycle)
        let notesURL = try #require(URL(string: url))
        let app = try await NotesApp(folder: folder, connected: false)
        let killer = Killer(trigger: plan.trigger, log: log, cache: app.cache)
        ExitTests.append("P \(plan.trigger), \(plan.queuedOffline) notes queued offline\n", toFileAt: log)

        let changes = app.queue.changes
        let (delivered, deliveredInput) = AsyncStream<String>.makeStream()
        let deliveries = StreamCollector(delivered)
        let following = Task {
            for await change in changes {
                switch change {
                case .removed(let entry, .delivered):
                    let note = String(decoding: entry.body ?? Data(), as: UTF8.self)
                    ExitTests.append("D \(note)\n", toFileAt: log)
                    deliveredInput.yield(note)
                    killer.saw(.delivery)
                case .attemptStarted:
                    killer.saw(.attempt)
                default:
                    break
                }
            }
        }
        defer { following.cancel() }
        let screen = LiveScreen(app.client.snapshots(for: NotesRead(url: notesURL), mode: .offlineFirst, staleTime: .http), killer: killer)
        defer { screen.task.cancel() }

        // The relaunch's screen: offline, before anything is fetched or sent.
        Screen(await screen.first, queued: await app.queue.items).write(to: files.screenPath(cycle))

        let save: (String) async throws -> Void = { text in
            try await app.client.mutate(NewNote(url: notesURL, text: text))
            ExitTests.append(text + "\n", toFileAt: files.acks(cycle))
        }
        for index in 0..<plan.queuedOffline { try await save("c\(cycle)q\(index)") }
        await app.queue.start()
        killer.wentOnline()
        await app.monitor.setConnected(true)
        for index in 0..<plan.onlineWhileReplaying { try await save("c\(cycle)o\(index)") }
        await deliveries.wait(for: plan.flipAfter)
        await app.monitor.setConnected(false)
        for index in 0..<plan.queuedWhileFlipped { try await save("c\(cycle)f\(index)") }
        await app.monitor.setConnected(true)
        for index in 0..<plan.onlineAfterFlip { try await save("c\(cycle)p\(index)") }
        var passes = 0
        while await app.queue.pendingCount() > 0, passes < 50 {
            _ = await app.queue.flush()
            passes += 1
        }
        killer.fire(Trigger.drained.description)
    }

    /// The last launch: shows its first screen offline (the relaunch after the last kill), goes
    /// online, drains the queue, and writes the list once a fetch made after every delivery landed.
    static func finalLaunch(cycle: Int, folder: String, url: String, files: String) async throws {
        let files = Files(directory: files)
        watchdog(log: files.log(cycle), exitCode: 3)
        let notesURL = try #require(URL(string: url))
        let app = try await NotesApp(folder: folder, connected: false)
        let screen = LiveScreen(app.client.snapshots(for: NotesRead(url: notesURL), mode: .offlineFirst, staleTime: .http), killer: nil)
        defer { screen.task.cancel() }
        Screen(await screen.first, queued: await app.queue.items).write(to: files.screenPath(cycle))

        await app.queue.start()
        await app.monitor.setConnected(true)
        var passes = 0
        while await app.queue.pendingCount() > 0 {
            let report = await app.queue.flush()
            passes += 1
            try #require(passes < 50, "the queue does not drain: \(report.results)")
        }
        // A read that fetches at once, whatever the cache holds: the server's list, with no
        // write pending or settling.
        let fresh = LiveScreen(app.client.snapshots(for: NotesRead(url: notesURL), mode: .always, staleTime: .http), killer: nil)
        defer { fresh.task.cancel() }
        let settled = await fresh.waitFor { !$0.hasPendingWrites && $0.settlingEntryIDs.isEmpty && !$0.isFetching && $0.source == .network }
        Screen(settled, queued: await app.queue.items).write(to: files.settledPath)
    }
}
