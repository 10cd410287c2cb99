import Foundation
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A child process started with `posix_spawn`, for tests and tools that run commands
/// (`ip`, `promtool`, …).
///
/// Why not `Foundation.Process`: on Linux, swift-corelibs-foundation as shipped with Swift 6.3.1
/// over-reads a buffer in `findMaximumOpenFromProcSelfFD()` while `Process.run()` scans
/// `/proc/self/fd`, which intermittently crashes the calling process with SIGSEGV (in about one
/// run in five of suites that spawn children; fixed upstream by
/// swiftlang/swift-corelibs-foundation#5472). This package cannot pick its Foundation, so it
/// must not use `Foundation.Process` anywhere; this type is the replacement.
///
/// The child gets the parent's environment, standard input from `/dev/null` (or a pipe, with
/// `standardInput: true`), and standard output and standard error both on one pipe that
/// ``readLine()`` and ``readToEnd()`` read. All pipe ends are close-on-exec, so children that
/// other threads spawn at the same time never inherit them (which would delay end-of-file), and
/// the child closes every other descriptor from 3 up, close-on-exec or not. It starts with all
/// signals at their default action and an empty signal mask.
///
/// Call ``wait()`` exactly when the child should be reaped: it closes standard input first (so a
/// child reading it sees end-of-file), so write all input before. Read the output before waiting
/// when the child may write more than a pipe holds (64 KiB on Linux), or both sides block;
/// ``run(_:_:input:)`` does it in the right order. The pipe ends are closed when read to the end
/// (output), on ``closeInput()`` / ``wait()`` (input), or when the last copy of the value goes
/// away; never twice.
package struct SpawnedProcess: Sendable {
    /// The child's process ID.
    package let pid: pid_t
    private let channel: Channel

    /// Why a child could not be started.
    package enum Error: Swift.Error, Equatable, CustomStringConvertible {
        /// Creating a pipe failed.
        case pipe(errno: Int32)
        /// `posix_spawn` failed, e.g. `ENOENT` (no such file) or `EACCES` (not executable).
        case spawn(path: String, errno: Int32)

        package var description: String {
            switch self {
            case .pipe(let code): "cannot create a pipe: \(String(cString: strerror(code)))"
            case .spawn(let path, let code): "cannot spawn \(path): \(String(cString: strerror(code)))"
            }
        }
    }

    /// How the child ended.
    package enum Termination: Sendable, Equatable, CustomStringConvertible {
        /// It exited with this status (0 to 255).
        case exited(Int32)
        /// A signal ended it.
        case signalled(Int32)

        /// Decodes a `waitpid` status by hand: `WIFEXITED` and friends are macros Swift cannot import.
        init(waitStatus status: Int32) {
            if status & 0x7f == 0 {
                self = .exited((status >> 8) & 0xff)
            } else {
                self = .signalled(status & 0x7f)
            }
        }

        package var description: String {
            switch self {
            case .exited(let code): "exited with status \(code)"
            case .signalled(let signal): "killed by signal \(signal)"
            }
        }
    }

    /// Starts `executablePath` (an absolute path; `PATH` is not searched) with `arguments`
    /// (not including argv[0], which is the path).
    ///
    /// - Parameter standardInput: give the child a pipe for standard input, written with
    ///   ``writeInput(_:)`` and closed with ``closeInput()``; otherwise it reads `/dev/null`.
    package static func spawn(_ executablePath: String, _ arguments: [String], standardInput: Bool = false) throws -> SpawnedProcess {
        let output = try makePipe()
        var input: (read: Int32, write: Int32)?
        if standardInput {
            do {
                input = try makePipe()
            } catch {
                close(output.read)
                close(output.write)
                throw error
            }
        }
        // The child's ends: closed here whatever happens, the child has its own copies.
        defer {
            close(output.write)
            if let input { close(input.read) }
        }

        #if canImport(Darwin)
        var actions: posix_spawn_file_actions_t?
        var attributes: posix_spawnattr_t?
        #else
        var actions = posix_spawn_file_actions_t()
        var attributes = posix_spawnattr_t()
        #endif
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }

        if let input {
            posix_spawn_file_actions_adddup2(&actions, input.read, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        posix_spawn_file_actions_adddup2(&actions, output.write, 1)
        posix_spawn_file_actions_adddup2(&actions, output.write, 2)
        #if !canImport(Darwin)
        addCloseOtherDescriptors(&actions)
        #endif

        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        var flags = Int32(POSIX_SPAWN_SETSIGMASK) | Int32(POSIX_SPAWN_SETSIGDEF)
        #if canImport(Darwin)
        // Darwin closes every descriptor the file actions do not mention (see
        // addCloseOtherDescriptors for why), which also covers the window between `pipe` and
        // `fcntl(FD_CLOEXEC)` in another thread.
        flags |= Int32(POSIX_SPAWN_CLOEXEC_DEFAULT)
        #endif
        posix_spawnattr_setflags(&attributes, Int16(flags))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executablePath] + arguments).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }

        var pid: pid_t = 0
        let result = posix_spawn(&pid, executablePath, &actions, &attributes, argv, environment())
        guard result == 0 else {
            close(output.read)
            if let input { close(input.write) }
            throw Error.spawn(path: executablePath, errno: result)
        }
        return SpawnedProcess(pid: pid, channel: Channel(inputFD: input?.write, outputFD: output.read))
    }

    /// Runs `executablePath` to completion: writes `input` (if any) to its standard input, then
    /// collects its standard output and standard error (interleaved) until it exits.
    package static func run(_ executablePath: String, _ arguments: [String], input: Data? = nil) throws -> (termination: Termination, output: Data) {
        let process = try spawn(executablePath, arguments, standardInput: input != nil)
        if let input {
            // Written from another thread: a child that writes a lot before reading all of its
            // input would otherwise block on a full output pipe while we block on a full input pipe.
            let writer = Thread {
                process.writeInput(input)
                process.closeInput()
            }
            writer.start()
        }
        let output = process.readToEnd()
        return (process.wait(), output)
    }

    /// Writes all of `data` to the child's standard input (blocking while the pipe is full).
    /// Does nothing without `standardInput: true`, after ``closeInput()``, or once the child has
    /// closed its end (the child's output and ``wait()`` tell why; there is no SIGPIPE).
    package func writeInput(_ data: Data) {
        channel.write(data)
    }

    /// Closes the child's standard input, so that it reads end-of-file. Idempotent.
    package func closeInput() {
        channel.closeInput()
    }

    /// The next line of output without its line feed (blocking until one is complete), the last
    /// unterminated line at end-of-file, or `nil` at end-of-file. Bytes after the line stay
    /// buffered for the next read.
    package func readLine() -> String? {
        channel.readLine()
    }

    /// All remaining output (blocking until end-of-file, i.e. until the child and anything it
    /// started with the pipe have exited), including anything ``readLine()`` buffered. Closes
    /// the pipe; later calls return empty data.
    package func readToEnd() -> Data {
        channel.readToEnd()
    }

    /// Sends `signal` to the child, unless it has already been reaped by ``wait()`` (when its
    /// process ID may belong to someone else).
    package func send(_ signal: Int32) {
        channel.signal(pid, signal)
    }

    /// Closes standard input, waits for the child to end and reaps it. Later calls (from any
    /// copy or thread) return the same termination.
    package func wait() -> Termination {
        channel.closeInput()
        return channel.wait(pid)
    }

    // MARK: - Plumbing

    /// A pipe whose ends are both close-on-exec.
    private static func makePipe() throws -> (read: Int32, write: Int32) {
        var fds: [Int32] = [-1, -1]
        #if !canImport(Darwin)
        if let pipe2 = Self.pipe2 {
            guard pipe2(&fds, Int32(O_CLOEXEC)) == 0 else { throw Error.pipe(errno: errno) }
            return (fds[0], fds[1])
        }
        #endif
        // Darwin (where POSIX_SPAWN_CLOEXEC_DEFAULT closes the window between the two calls),
        // or a C library without pipe2.
        guard pipe(&fds) == 0 else { throw Error.pipe(errno: errno) }
        for fd in fds where fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 {
            let code = errno
            close(fds[0])
            close(fds[1])
            throw Error.pipe(errno: code)
        }
        return (fds[0], fds[1])
    }

    #if !canImport(Darwin)
    /// Makes the child close every descriptor from 3 up, as `Foundation.Process` does. Being
    /// close-on-exec is not enough: code that marks a descriptor only after creating it (like
    /// `LoopbackSocket`, with `fcntl`) leaves a window in which a child spawned by another thread
    /// inherits it, and a child holding, say, a test server's listening socket keeps its port open.
    private static func addCloseOtherDescriptors(_ actions: inout posix_spawn_file_actions_t) {
        if let addCloseFrom, addCloseFrom(&actions, 3) == 0 { return }
        // A C library without posix_spawn_file_actions_addclosefrom_np (glibc before 2.34):
        // close the descriptors open now. Closing one that is gone by then is not an error.
        let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        for fd in open.compactMap({ Int32($0) }) where fd > 2 {
            posix_spawn_file_actions_addclose(&actions, fd)
        }
    }

    /// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34), looked up at run time because
    /// the C library declares it only under `_GNU_SOURCE` and older ones lack it.
    private static let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32)? = {
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32).self)
    }()

    /// `pipe2(2)`, which creates both ends close-on-exec atomically (`pipe` then `fcntl` would
    /// leave a window in which a child spawned by another thread inherits them). The C library
    /// has it, but declares it only under `_GNU_SOURCE`, which the Swift module does not set.
    private static let pipe2: (@convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32)? = {
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "pipe2") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32).self)
    }()
    #endif

    /// The parent's current environment, as `posix_spawn` takes it.
    private static func environment() -> UnsafePointer<UnsafeMutablePointer<CChar>?>? {
        #if canImport(Darwin)
        return UnsafePointer(_NSGetEnviron().pointee)
        #else
        return UnsafePointer(environ)
        #endif
    }

    /// The pipe ends and the reaping state, shared by every copy of a `SpawnedProcess`.
    private final class Channel: @unchecked Sendable {
        // @unchecked Sendable: each mutable property is only touched while holding the lock
        // named next to it. NSLock (not `Locked`) because holders block in read/write/waitid.
        private let inputLock = NSLock()
        private var inputFD: Int32?  // inputLock
        private let outputLock = NSLock()
        private var outputFD: Int32?  // outputLock
        private var buffer: [UInt8] = []  // outputLock
        private let waitLock = NSLock()
        /// Set (under the lock) in the same critical section that reaps the child, so that
        /// `signal` never reaches a reaped process ID.
        private let termination = Locked<Termination?>(nil)

        init(inputFD: Int32?, outputFD: Int32) {
            self.inputFD = inputFD
            self.outputFD = outputFD
        }

        deinit {
            if let inputFD { close(inputFD) }
            if let outputFD { close(outputFD) }
        }

        func write(_ data: Data) {
            inputLock.withLock {
                guard let fd = inputFD else { return }
                data.withUnsafeBytes { bytes in
                    guard var next = bytes.baseAddress else { return }
                    var remaining = bytes.count
                    while remaining > 0 {
                        let written = Self.writeWithoutSIGPIPE(fd, next, remaining)
                        if written < 0 {
                            if errno == EINTR { continue }
                            return  // EPIPE: the child closed its standard input
                        }
                        next += written
                        remaining -= written
                    }
                }
            }
        }

        /// `write`, with the SIGPIPE a closed pipe raises blocked and discarded rather than
        /// killing the whole process. That signal goes to the calling thread, so masking it
        /// there is enough; a SIGPIPE that was already pending is left alone. The signal comes
        /// with EPIPE, but also with a partial count when the reader goes away mid-write.
        private static func writeWithoutSIGPIPE(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
            var pipeSignal = sigset_t()
            sigemptyset(&pipeSignal)
            sigaddset(&pipeSignal, SIGPIPE)
            var previousMask = sigset_t()
            pthread_sigmask(SIG_BLOCK, &pipeSignal, &previousMask)
            defer { pthread_sigmask(SIG_SETMASK, &previousMask, nil) }
            var pending = sigset_t()
            sigpending(&pending)
            let wasPending = sigismember(&pending, SIGPIPE) == 1

            let written = systemWrite(fd, bytes, count)
            let code = errno
            if !wasPending {
                sigpending(&pending)
                if sigismember(&pending, SIGPIPE) == 1 {
                    var received: Int32 = 0
                    sigwait(&pipeSignal, &received)
                }
            }
            errno = code
            return written
        }

        func closeInput() {
            inputLock.withLock {
                if let fd = inputFD { close(fd) }
                inputFD = nil
            }
        }

        func readLine() -> String? {
            outputLock.withLock {
                var searchFrom = 0
                while true {
                    if let newline = buffer[searchFrom...].firstIndex(of: UInt8(ascii: "\n")) {
                        let line = String(decoding: buffer[..<newline], as: UTF8.self)
                        buffer.removeSubrange(...newline)
                        return line
                    }
                    searchFrom = buffer.count
                    if !fill() {
                        guard !buffer.isEmpty else { return nil }
                        let line = String(decoding: buffer, as: UTF8.self)
                        buffer.removeAll()
                        return line
                    }
                }
            }
        }

        func readToEnd() -> Data {
            outputLock.withLock {
                while fill() {}
                let data = Data(buffer)
                buffer.removeAll()
                return data
            }
        }

        /// Appends one `read` worth of output to the buffer; at end-of-file (or on an error)
        /// closes the pipe and returns `false`. Call with `outputLock` held.
        private func fill() -> Bool {
            guard let fd = outputFD else { return false }
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count > 0 {
                    buffer.append(contentsOf: chunk[..<count])
                    return true
                }
                if count < 0, errno == EINTR { continue }
                close(fd)
                outputFD = nil
                return false
            }
        }

        func signal(_ pid: pid_t, _ signal: Int32) {
            termination.withLock { termination in
                if termination == nil { kill(pid, signal) }
            }
        }

        func wait(_ pid: pid_t) -> Termination {
            waitLock.withLock {
                if let known = termination.withLock({ $0 }) { return known }
                // Block until the child has ended without reaping it, so that `signal` can still
                // tell a live (or zombie) child from a reaped one...
                var info = siginfo_t()
                while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0, errno == EINTR {}
                // ...then reap it (at once: it has ended) while `signal` is locked out.
                return termination.withLock { termination in
                    var status: Int32 = 0
                    var reaped: pid_t
                    repeat {
                        reaped = waitpid(pid, &status, 0)
                    } while reaped == -1 && errno == EINTR
                    precondition(reaped == pid, "waitpid(\(pid)) failed: \(String(cString: strerror(errno))); did something else reap the child?")
                    let ended = Termination(waitStatus: status)
                    termination = ended
                    return ended
                }
            }
        }
    }
}

/// `write(2)`, out of reach of `Channel.write(_:)`, which would shadow it inside the class.
private func systemWrite(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    write(fd, bytes, count)
}
