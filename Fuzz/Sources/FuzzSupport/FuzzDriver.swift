import CLibFuzzer
import Foundation

/// Runs libFuzzer over a harness: the process's command line goes to libFuzzer
/// (`-max_total_time=60 corpus/`, a crash file to replay, ...), and `body` is called once per input.
///
/// A target is built with SanitizerCoverage and AddressSanitizer (`Scripts/fuzz.sh`) and linked
/// with libFuzzer's no-main library: SwiftPM names an executable's entry point after its module,
/// which clashes with the `main` that `-sanitize=fuzzer` links in, so each target has its own
/// `@main` that calls this.
public enum FuzzDriver {
    public static func run(_ body: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> Never {
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, body))
    }
}

/// Stops the run when a parser breaks its contract: the message goes to standard error and the
/// process aborts, so libFuzzer keeps the input as a crash file.
public func fuzzCheck(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
    guard !condition else { return }
    FileHandle.standardError.write(Data("\(file):\(line): contract broken: \(message())\n".utf8))
    abort()
}

/// One input: its bytes, and views a harness cuts from them.
public struct FuzzInput {
    public let bytes: UnsafeBufferPointer<UInt8>

    public init(_ data: UnsafePointer<UInt8>?, _ size: Int) {
        bytes = UnsafeBufferPointer(start: size > 0 ? data : nil, count: size)
    }

    /// The bytes as text, invalid UTF-8 replaced (as `String(decoding:as:)` does on the wire side).
    public var text: String { String(decoding: bytes, as: UTF8.self) }

    /// The bytes as lines (split at LF, kept empty), at least `count` of them (missing ones empty).
    public func lines(atLeast count: Int) -> [String] {
        var lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
        while lines.count < count { lines.append("") }
        return lines
    }
}
