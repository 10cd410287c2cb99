import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A fresh folder under the system temp directory,
/// removed when the value is deinitialised.
package final class TemporaryDirectory: Sendable {
    package let url: URL

    package init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-test-\(UUID().uuidString)", isDirectory: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    /// Names of files directly in the folder (no subfolders), sorted.
    package var fileNames: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []).filter { name in
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path, isDirectory: &isDirectory)
            return !isDirectory.boolValue
        }.sorted()
    }
}

/// A size-limited tmpfs mounted for one test (Linux, root only).
package struct SmallFileSystem {
    package let path: String

    /// Whether a tmpfs can be mounted here (tried once, on a scratch folder).
    package static let isAvailable: Bool = {
        let probe = TemporaryDirectory()
        guard (try? FileManager.default.createDirectory(at: probe.url, withIntermediateDirectories: true)) != nil,
            let mounted = SmallFileSystem(at: probe.url.path, kilobytes: 16)
        else { return false }
        mounted.unmount()
        return true
    }()

    /// Mounts a tmpfs of `kilobytes` at `path`, with at most `inodes` files and folders when
    /// given (its root folder takes one).
    package init?(at path: String, kilobytes: Int, inodes: Int? = nil) {
        #if os(Linux)
        let options = "size=\(kilobytes)k,mode=0700" + (inodes.map { ",nr_inodes=\($0)" } ?? "")
        guard geteuid() == 0, mount("tmpfs", path, "tmpfs", 0, options) == 0 else { return nil }
        self.path = path
        #else
        return nil
        #endif
    }

    /// Makes the file system read-only (or writable again); every write then fails with EROFS.
    package func remount(readOnly: Bool) -> Bool {
        #if os(Linux)
        let flags = UInt(MS_REMOUNT) | (readOnly ? UInt(MS_RDONLY) : 0)
        return mount("tmpfs", path, "tmpfs", flags, nil) == 0
        #else
        return false
        #endif
    }

    /// Fills the file system with one file until a write fails with ENOSPC; returns its path.
    package func fill() -> String {
        let filler = path + "/filler"
        let fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { return filler }
        let chunk = [UInt8](repeating: 0x20, count: 512)
        while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
        close(fd)
        return filler
    }

    /// Creates empty files until the file system has no inode left (creating one fails with
    /// ENOSPC), at most 10 000 (mount with `inodes:`); returns how many it created.
    @discardableResult
    package func useUpInodes() -> Int {
        var created = 0
        while created < 10_000 {
            let fd = open(path + "/inode-\(created)", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return created }
            close(fd)
            created += 1
        }
        return created
    }

    package func unmount() {
        #if os(Linux)
        umount2(path, 2)  // MNT_DETACH
        #endif
    }
}

/// For this package's own tests (package access): runs exit tests (`#expect(processExitsWith:)`)
/// one at a time.
///
