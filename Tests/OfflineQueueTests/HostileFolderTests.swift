import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A queue folder prepared by someone else: planted special files, numbers that overflow,
/// starved descriptors, a second owner. Real files, real descriptors, real processes.
///
/// Five minutes: its exit tests wait in `ExitTests`' line, behind every other one of the run.
@Suite("DiskQueueStore against a hostile folder", .timeLimit(.minutes(5)))
struct HostileFolderTests {
    /// Writes `count` acknowledged entries through a real store, then lets the store go.
    private func prepareFolder(_ directory: TemporaryDirectory, count: Int, coalescingKey: String? = nil) async throws -> [UUID] {
        let store = try DiskQueueStore(directory: directory.url)
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: ScriptedNetworkSession([.ok()])),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: false),
            store: store,
            maxQueueSize: 100_000
        )
        var ids: [UUID] = []
        for index in 0..<count {
            var request = Mutation("/items/\(index)", body: "body \(index)")
            request.coalescingKey = coalescingKey
            ids.append(try #require(try await engine.enqueue(request, sending: .onNextDrain).queuedID))
        }
        return ids
    }

    /// The bytes of a valid entry file with `field` set to the literal JSON `value`.
    private func entryFile(id: UUID = UUID(), sequence: UInt64 = 7, replacing field: String, with value: String) throws -> (name: String, data: Data) {
        let entry = QueueEntry(
            id: id,
            request: Mutation("/planted", body: "x"),
            idempotencyKey: "k",
            enqueuedAt: Date(),
            sequence: sequence,
            revision: 3,
            attempts: 2
        )
        var text = String(decoding: try QueueEntry.makeEncoder().encode(entry), as: UTF8.self)
        let original: String
        switch field {
        case "sequence": original = "\"sequence\":\(sequence)"
        case "revision": original = "\"revision\":3"
        case "attempts": original = "\"attempts\":2"
        default: original = ""
        }
        #expect(text.contains(original), "the encoder's output changed shape: \(text)")
        text = text.replacingOccurrences(of: original, with: "\"\(field)\":\(value)")
        return ("\(id.uuidString).json", Data(text.utf8))
    }

    // MARK: Item 3: numbers from a file

    @Test func aSequenceAtUInt64MaxIsQuarantinedInsteadOfTrappingAtOpen() async throws {
        let directory = TemporaryDirectory()
        let good = try await prepareFolder(directory, count: 2)
        let planted = try entryFile(replacing: "sequence", with: "18446744073709551615")
        try planted.data.write(to: directory.url.appendingPathComponent(planted.name))

        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.quarantined.map(\.name) == [planted.name])
        #expect(store.openReport.quarantined.first?.reason.contains("out of range") == true)
        #expect(await store.load().map(\.id) == good)
        // New entries still get increasing sequence numbers after the good ones.
        #expect(store.makeSequence() > (store.entry(id: good[1])?.sequence ?? .max))
    }

    @Test func attemptsAndRevisionAtIntMaxAreClampedAndAReplayOrAnEditCannotTrap() async throws {
        let directory = TemporaryDirectory()
        let attemptsFile = try entryFile(sequence: 1, replacing: "attempts", with: "\(Int.max)")
        try FileManager.default.createDirectory(at: directory.url, withIntermediateDirectories: true)
        try attemptsFile.data.write(to: directory.url.appendingPathComponent(attemptsFile.name))
        // A coalesced entry whose revision is Int.max, then an edit of its key.
        let revisionEntry = QueueEntry(
            request: {
                var m = Mutation("/profile", body: "old"); m.coalescingKey = "profile"; return m
            }(),
            idempotencyKey: "k2", enqueuedAt: Date(), sequence: 2, revision: 5
        )
        var revisionText = String(decoding: try QueueEntry.makeEncoder().encode(revisionEntry), as: UTF8.self)
        revisionText = revisionText.replacingOccurrences(of: "\"revision\":5", with: "\"revision\":\(Int.max)")
        try Data(revisionText.utf8).write(to: directory.url.appendingPathComponent("\(revisionEntry.id.uuidString).json"))

        let clock = ManualClock()
        let session = ScriptedNetworkSession([.status(503)])
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.quarantined.isEmpty)
        let attemptsID = try #require(UUID(uuidString: String(attemptsFile.name.dropLast(5))))
        let loaded = try #require(store.entry(id: attemptsID))
        #expect(loaded.attempts == Int(QueueEntry.maximumCounter))
        let engine = OfflineQueueEngine(
            requestEngine: AsyncRequestEngine(session: session, clock: clock),
            reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
            store: store,
            configuration: .init(retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10)),
            clock: clock
        )
        // A replay after a 503 counts one more attempt: saturates instead of trapping.
        let report = await engine.flush()
        #expect(report.kept.contains(loaded.id))
        #expect(store.entry(id: loaded.id)?.attempts == Int(QueueEntry.maximumCounter))
        // An edit of the coalescing key replaces the Int.max revision without arithmetic on it.
        var edit = Mutation("/profile", body: "new")
        edit.coalescingKey = "profile"
        let newID = try #require(try await engine.enqueue(edit, sending: .onNextDrain).queuedID)
        #expect(store.entry(id: revisionEntry.id) == nil)
        #expect(store.entry(id: newID)?.body == Data("new".utf8))
    }

    // MARK: Item 4: special files

    @Test func plantedSpecialFilesAreQuarantinedWithoutBlockingOrReadingThemAtOpenAndInspect() async throws {
        let directory = TemporaryDirectory()
        let good = try await prepareFolder(directory, count: 3)
        let folder = directory.url.path
        let fifo = "\(UUID().uuidString).json", zero = "\(UUID().uuidString).json", random = "\(UUID().uuidString).json"
        let linkToEntry = "\(UUID().uuidString).json", subfolder = "\(UUID().uuidString).json", huge = "\(UUID().uuidString).json"
        #expect(mkfifo(folder + "/" + fifo, 0o600) == 0)
        #expect(symlink("/dev/zero", folder + "/" + zero) == 0)
        #expect(symlink("/dev/urandom", folder + "/" + random) == 0)
        // A link to a valid entry elsewhere is not followed either.
        let elsewhere = TemporaryDirectory()
        try FileManager.default.createDirectory(at: elsewhere.url, withIntermediateDirectories: true)
        let foreign = try entryFile(replacing: "attempts", with: "0")
        try foreign.data.write(to: elsewhere.url.appendingPathComponent(foreign.name))
        #expect(symlink(elsewhere.url.appendingPathComponent(foreign.name).path, folder + "/" + linkToEntry) == 0)
        #expect(mkdir(folder + "/" + subfolder, 0o700) == 0)
        // A sparse regular file just over the limit: refused by size, never read.
        let fd = open(folder + "/" + huge, O_WRONLY | O_CREAT, 0o600)
        #expect(fd >= 0)
        #expect(ftruncate(fd, off_t(DiskQueueStore.maximumEntrySize + 1)) == 0)
        close(fd)
        let planted: Set<String> = [fifo, zero, random, linkToEntry, subfolder, huge]

        let inspection = try DiskQueueStore.inspect(directory: directory.url)
        #expect(Set(inspection.unreadable.map(\.name)) == planted)
        #expect(inspection.entries.map(\.id) == good)

        let store = try DiskQueueStore(directory: directory.url)
        #expect(Set(store.openReport.quarantined.map(\.name)) == planted)
        let reasons = Dictionary(uniqueKeysWithValues: store.openReport.quarantined.map { ($0.name, $0.reason) })
        #expect(reasons[fifo]?.contains("FIFO") == true)
        #expect(reasons[zero]?.contains("symbolic link") == true)
        #expect(reasons[subfolder]?.contains("directory") == true)
        #expect(reasons[huge]?.contains("larger than") == true)
        #expect(await store.load().map(\.id) == good)
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: store.quarantineDirectory.path)) == planted)
        // The link itself was moved, not its target.
        #expect(FileManager.default.fileExists(atPath: elsewhere.url.appendingPathComponent(foreign.name).path))
    }

    @Test func aRegularFileNamedQuarantineOrDeadLetterIsMovedAsideAndTheQueueOpens() async throws {
        let directory = TemporaryDirectory()
        let good = try await prepareFolder(directory, count: 1)
        try FileManager.default.removeItem(at: directory.url.appendingPathComponent("quarantine"))
        try FileManager.default.removeItem(at: directory.url.appendingPathComponent("dead-letter"))
        try Data("not a folder".utf8).write(to: directory.url.appendingPathComponent("quarantine"))
        try Data("nor this".utf8).write(to: directory.url.appendingPathComponent("dead-letter"))
        let garbage = "\(UUID().uuidString).json"
        try Data("{".utf8).write(to: directory.url.appendingPathComponent(garbage))

        let store = try DiskQueueStore(directory: directory.url)
        #expect(await store.load().map(\.id) == good)
        #expect(store.openReport.quarantined.map(\.name) == [garbage])
        #expect(try FileManager.default.contentsOfDirectory(atPath: store.quarantineDirectory.path) == [garbage])
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.url.path)
        #expect(names.filter { $0.hasPrefix(".quarantine.displaced-") }.count == 1)
        #expect(names.filter { $0.hasPrefix(".dead-letter.displaced-") }.count == 1)
    }

    // MARK: A file another user left

    /// A file the process may not read (another user's, mode 0600) is moved aside and reported,
    /// like a corrupt one, rather than thrown at open (which would make the whole queue unopenable).
    /// Run in a child that drops from root to `nobody`: root reads any file.
    @Test(.enabled(if: getuid() == 0, "needs root, to drop to another user in a child process"))
    func aFileThisProcessMayNotReadIsQuarantinedAndTheRestLoads() async throws {
        #if os(Linux)
        let outer = TemporaryDirectory()
        let folder = outer.url.appendingPathComponent("queue")
        try FileManager.default.createDirectory(at: outer.url, withIntermediateDirectories: true)
        chmod(outer.url.path, 0o755)
        let owner = try DiskQueueStore(directory: folder)
        let mine = QueueEntry(Mutation("/mine"))
        let foreign = QueueEntry(Mutation("/foreign"))
        try await owner.save(mine)
        try await owner.save(foreign)
        owner.releaseLock()
        let nobody: uid_t = 65_534
        for path in [folder.path, folder.path + "/quarantine", folder.path + "/dead-letter", folder.path + "/\(mine.id.uuidString).json"] {
            #expect(chown(path, nobody, gid_t(nobody)) == 0)
        }
        let foreignName = "\(foreign.id.uuidString).json"
        #expect(chmod(folder.path + "/" + foreignName, 0o600) == 0)  // root's, unreadable to nobody
        let path = folder.path
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = path as String, foreignName = foreignName as String, mine = mine.id as UUID] in
                guard setgid(65_534) == 0, setuid(65_534) == 0 else { exit(1) }
                do {
                    let store = try DiskQueueStore(directory: URL(fileURLWithPath: path))
                    guard store.openReport.loaded == 1, store.entry(id: mine) != nil else { exit(2) }
                    guard store.openReport.quarantined.map(\.name) == [foreignName] else { exit(3) }
                    guard store.openReport.quarantined[0].reason.contains("permission denied") else { exit(4) }
                } catch {
                    exit(5)  // the open threw: one foreign file made the whole queue unusable
                }
                exit(0)
            }
        }
        // Moved aside, never deleted.
        #expect(FileManager.default.fileExists(atPath: folder.path + "/quarantine/" + foreignName))
        #expect(!FileManager.default.fileExists(atPath: folder.path + "/" + foreignName))
        #endif
    }

    // MARK: Item 6: names in another letter case

    @Test func anEntryFileWithALowerCaseNameIsDeliveredOnceAndThenGone() async throws {
        let directory = TemporaryDirectory()
        let ids = try await prepareFolder(directory, count: 1)
        let upper = directory.url.appendingPathComponent("\(ids[0].uuidString).json")
        let lower = directory.url.appendingPathComponent("\(ids[0].uuidString.lowercased()).json")
        try FileManager.default.moveItem(at: upper, to: lower)

        do {
            let session = ScriptedNetworkSession([.ok()])
            let store = try DiskQueueStore(directory: directory.url)
            let engine = OfflineQueueEngine(
                requestEngine: AsyncRequestEngine(session: session),
                reachabilityMonitor: ManualReachabilityMonitor(isConnected: true),
                store: store
            )
            #expect(await engine.flush().delivered == ids)
        }
        #expect(!FileManager.default.fileExists(atPath: lower.path))
        #expect(!FileManager.default.fileExists(atPath: upper.path))
        let reopened = try DiskQueueStore(directory: directory.url)
        #expect(reopened.openReport.loaded == 0)
    }

    @Test func aLowerCaseCopyBesideTheCanonicalFileIsQuarantinedAsADuplicate() async throws {
        let directory = TemporaryDirectory()
        let ids = try await prepareFolder(directory, count: 1)
        try FileManager.default.copyItem(
            at: directory.url.appendingPathComponent("\(ids[0].uuidString).json"),
            to: directory.url.appendingPathComponent("\(ids[0].uuidString.lowercased()).json")
        )
        let store = try DiskQueueStore(directory: directory.url)
        #expect(await store.load().map(\.id) == ids)
        #expect(store.openReport.quarantined.map(\.reason) == ["duplicate of \(ids[0].uuidString).json"])
    }

    // MARK: Item 5: one owner per folder

    @Test func aSecondStoreOnTheSameFolderInThisProcessIsRefusedWhileTheFirstLives() async throws {
        let directory = TemporaryDirectory()
        let first = try DiskQueueStore(directory: directory.url)
        #expect(throws: OfflineQueueError.folderInUse(path: directory.url.path)) {
            try DiskQueueStore(directory: directory.url)
        }
        #expect(first.entryCount == 0)
        first.releaseLock()
        let second = try DiskQueueStore(directory: directory.url)
        #expect(second.openReport.loaded == 0)
    }

    @Test func aStoreAskedToWaitOpensWhenTheOwnerLetsGo() async throws {
        let directory = TemporaryDirectory()
        let first = try DiskQueueStore(directory: directory.url)
        let clock = ManualClock()
        let url = directory.url
        let opened = Task { try await DiskQueueStore.open(directory: url, lockTimeout: .seconds(60), clock: clock) }
        await clock.waitForSleepers(1)  // it found the folder taken and waits
        clock.advance(by: .milliseconds(10))
        await clock.waitForSleepers(1)  // still taken: still waiting
        first.releaseLock()
        clock.advance(by: .milliseconds(10))
        let second = try await opened.value
        #expect(second.openReport.loaded == 0)
    }

    @Test func aStoreAskedToWaitGivesUpTypedAtItsTimeout() async throws {
        let directory = TemporaryDirectory()
        let owner = try DiskQueueStore(directory: directory.url)
        let clock = ManualClock()
        let url = directory.url
        let opened = Task { try await DiskQueueStore.open(directory: url, lockTimeout: .milliseconds(25), clock: clock) }
        for _ in 0..<3 {
            await clock.waitForSleepers(1)
            clock.advance(by: .milliseconds(10))
        }
        await #expect(throws: OfflineQueueError.folderInUse(path: url.path)) { try await opened.value }
        #expect(owner.entryCount == 0)
    }

    @Test func anotherProcessCannotOpenAFolderThisProcessOwns() async throws {
        let directory = TemporaryDirectory()
        let owner = try DiskQueueStore(directory: directory.url)
        let path = directory.url.path
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .exitCode(42)) { [path = path as String] in
                do {
                    _ = try DiskQueueStore(directory: URL(fileURLWithPath: path))
                    exit(1)
                } catch OfflineQueueError.folderInUse {
                    exit(42)
                } catch {
                    exit(2)
                }
            }
        }
        #expect(owner.entryCount == 0)
    }

    // MARK: Item 2: I/O errors at open are not corruption

    @Test func openingWithStarvedDescriptorsFailsTypedOrLoadsAllAndNeverQuarantines() async throws {
        let directory = TemporaryDirectory()
        let ids = try await prepareFolder(directory, count: 200)
        let path = directory.url.path
        for free in [0, 1, 2, 3, 5, 8] {
            // In a child process: this one's descriptors are shared by every test running in it.
            try await ExitTests.oneAtATime {
                await #expect(processExitsWith: .success, "with \(free) descriptors free") { [path = path as String, free = free as Int] in
                    var held: [Int32] = []
                    while true {
                        let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
                        if fd < 0 { break }
                        held.append(fd)
                    }
                    for _ in 0..<free { if let fd = held.popLast() { close(fd) } }
                    var code: Int32 = 0
                    do {
                        let store = try DiskQueueStore(directory: URL(fileURLWithPath: path))
                        if store.openReport.loaded != 200 || !store.openReport.quarantined.isEmpty { code = 10 }
                    } catch let error as OfflineQueueError {
                        if case .storage = error {} else { code = 11 }  // a typed storage error is the allowed failure
                    } catch {
                        code = 12
                    }
                    for fd in held { close(fd) }
                    let quarantined = (try? FileManager.default.contentsOfDirectory(atPath: path + "/quarantine")) ?? []
                    if !quarantined.isEmpty { code += 20 }
                    exit(code)
                }
            }
        }
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.quarantined.isEmpty)
        #expect(await store.load().map(\.id) == ids)
    }

    /// A file this process may not read, in a folder where it may not move it either (root's
    /// folder, mode 0755, opened as nobody): skipped and reported, never thrown for — one foreign
    /// file must not make the queue unopenable (issue 28) — and, left where it was, loaded again by
    /// a process that may read it.
    @Test func anUnreadableEntryFileThatCannotBeMovedIsSkippedAndReported() async throws {
        let directory = TemporaryDirectory()
        let ids = try await prepareFolder(directory, count: 3)
        // A name that exists but cannot be opened for reading: a file this process may not read.
        // Root reads everything, so drop to nobody's rights in a child.
        let path = directory.url.path
        let victimName = "\(ids[1].uuidString).json"
        let victim = directory.url.appendingPathComponent(victimName).path
        #expect(chmod(victim, 0o000) == 0)
        #expect(chmod(path, 0o755) == 0)
        for id in [ids[0], ids[2]] {  // the others are nobody's (entry files are written 0600)
            #expect(chown(directory.url.appendingPathComponent("\(id.uuidString).json").path, 65534, 65534) == 0)
        }
        try await ExitTests.oneAtATime {
            await #expect(processExitsWith: .success) { [path = path as String, victimName = victimName as String] in
                if geteuid() == 0 {
                    guard setgid(65534) == 0, setuid(65534) == 0 else { exit(3) }
                }
                let url = URL(fileURLWithPath: path)
                do {
                    let inspection = try DiskQueueStore.inspect(directory: url)
                    guard inspection.entries.count == 2, inspection.unreadable.map(\.name) == [victimName] else { exit(4) }
                    guard inspection.unreadable[0].reason.contains("permission denied") else { exit(5) }
                } catch {
                    exit(6)
                }
                do {
                    let store = try DiskQueueStore(directory: url)
                    guard store.openReport.loaded == 2, store.openReport.quarantined.map(\.name) == [victimName] else { exit(7) }
                    guard store.openReport.quarantined[0].reason.contains("left in place") else { exit(8) }
                } catch {
                    exit(9)  // the open threw EACCES: one foreign file made the whole queue unusable
                }
                exit(0)
            }
        }
        #expect(chmod(victim, 0o600) == 0)
        let store = try DiskQueueStore(directory: directory.url)
        #expect(store.openReport.quarantined.isEmpty)
        #expect(await store.load().map(\.id) == ids)
    }
}
