import Foundation
import ResilienceTestSupport
import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `FileSystem.makeDirectoryTree`: one `mkdir(2)` per missing folder, so a failure carries the
/// folder and the `errno` the kernel gave.
@Suite("FileSystem.makeDirectoryTree")
struct FileSystemTests {
    private func mode(_ path: String) -> mode_t? {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_mode : nil
    }

    @Test func createsEveryMissingFolderWithMode0700AndAcceptsOneThatExists() throws {
        let root = TemporaryDirectory()
        let deep = root.url.appendingPathComponent("a/b/c").path
        try FileSystem.makeDirectoryTree(deep + "/")
        for path in [root.url.path, root.url.appendingPathComponent("a").path, root.url.appendingPathComponent("a/b").path, deep] {
            let mode = try #require(self.mode(path))
            #expect(mode & S_IFMT == S_IFDIR)
            #expect(mode & 0o777 == 0o700)
        }
        try FileSystem.makeDirectoryTree(deep)  // there already: fine
        let link = root.url.appendingPathComponent("link").path
        #expect(symlink(deep, link) == 0)
        try FileSystem.makeDirectoryTree(link)  // a link to a folder is a folder
    }

    @Test func aFileInTheWayIsNotADirectoryError() throws {
        let root = TemporaryDirectory()
        try FileSystem.makeDirectoryTree(root.url.path)
        let file = root.url.appendingPathComponent("file").path
        #expect(FileManager.default.createFile(atPath: file, contents: Data()))
        #expect(throws: FileSystemError(operation: "mkdir", path: file, errno: ENOTDIR)) {
            try FileSystem.makeDirectoryTree(file)
        }
        #expect(throws: FileSystemError(operation: "mkdir", path: file + "/below/deeper", errno: ENOTDIR)) {
            try FileSystem.makeDirectoryTree(file + "/below/deeper")
        }
    }
}
