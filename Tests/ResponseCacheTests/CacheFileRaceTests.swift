import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import ResponseCache

/// Stores, removals, evictions and corrupt-file deletions of the same keys from several threads at
/// once: only a key's owner touches its file, so the files and the index always agree once the
/// writes are done — no stored response loses its file to an older deletion, and no removed one
/// leaves a file behind (which a relaunch would bring back).
@Suite("DiskResponseCache: concurrent stores and deletions of one key", .timeLimit(.minutes(2)))
struct CacheFileRaceTests {
    /// The folder's `.rc` files and their sizes.
    static func files(_ directory: TemporaryDirectory) -> [String: Int] {
        var files: [String: Int] = [:]
        for name in directory.fileNames where name.hasSuffix(".rc") {
            let path = directory.url.appendingPathComponent(name).path
            files[name] = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? -1
        }
        return files
    }

    /// Whether the index and the folder hold exactly the same files, with the same sizes.
    static func agree(_ cache: DiskResponseCache, _ directory: TemporaryDirectory) -> String? {
        let files = files(directory)
        let indexed = cache.indexedFiles()
        return files == indexed ? nil : "on disk \(files.count) files (\(files.values.reduce(0, +)) bytes), indexed \(indexed.count) (\(cache.totalBytes) bytes)"
    }

    @Test func storesAndRemovalsOfOneKeyFromTwoThreadsLeaveTheFilesAndTheIndexInAgreement() async throws {
        let directory = TemporaryDirectory()
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 1 << 24, memoryBytes: 0)
        for round in 0..<300 {
            let paths = (0..<4).map { "/key-\($0)" }
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for (number, path) in paths.enumerated() {
                        cache.store(storedResponse(path, body: String(repeating: "a", count: 100 + round + number)))
                    }
                }
                group.addTask {
                    for path in paths { cache.remove(url: URL(string: "https://example.test" + path)!) }
                }
                group.addTask {
                    for (number, path) in paths.enumerated().reversed() {
                        cache.store(storedResponse(path, body: String(repeating: "b", count: 200 + round + number)))
                    }
                }
            }
            await cache.waitForWrites()
            if let broken = Self.agree(cache, directory) {
                Issue.record("round \(round): \(broken)")
                return
            }
        }
    }

    @Test func evictionsRacingStoresOfTheirVictimsLeaveTheFilesAndTheIndexInAgreement() async throws {
        let directory = TemporaryDirectory()
        // Room for about ten of these responses: every store evicts, and victims are stored again.
        let cache = try DiskResponseCache(directory: directory.url, maxBytes: 12_000, memoryBytes: 0)
        var generator = SplitMix64(seed: 11)
        for round in 0..<300 {
            let sizes = (0..<6).map { _ in Int.random(in: 500..<1_500, using: &generator) }
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<3 {
                    group.addTask {
                        for step in 0..<6 {
                            let key = (worker * 5 + step + round) % 16
                            cache.store(storedResponse("/e\(key)", body: String(repeating: "c", count: sizes[(step + worker) % 6])))
                        }
                    }
                }
            }
            await cache.waitForWrites()
            if let broken = Self.agree(cache, directory) {
                Issue.record("round \(round): \(broken)")
                return
            }
            #expect(cache.totalBytes <= 12_000)
        }
    }
}
