#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Thin wrappers over the POSIX calls the loopback server makes, with the platform differences
/// (constant types, SIGPIPE suppression) kept in one place.
enum LoopbackSocket {
    static var streamType: Int32 {
        #if canImport(Glibc)
        Int32(SOCK_STREAM.rawValue)
        #else
        SOCK_STREAM
        #endif
    }

    /// Flags for `send`: Linux suppresses SIGPIPE per call; Darwin uses `SO_NOSIGPIPE` per socket instead.
    static var sendFlags: Int32 {
        #if canImport(Darwin)
        0
        #else
        Int32(MSG_NOSIGNAL)
        #endif
    }

    enum IOResult {
        case transferred(Int)
        case wouldBlock
        case endOfFile
        case failed(errno: Int32)
    }

    /// A non-blocking, close-on-exec TCP socket listening on 127.0.0.1 with an ephemeral port.
    static func makeListener(backlog: Int32, port: Int = 0) throws -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, streamType, 0)
        guard fd >= 0 else { throw LoopbackHTTPServer.Error.socket(errno: errno) }
        do {
            var one: Int32 = 1
            guard setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) == 0 else {
                throw LoopbackHTTPServer.Error.socket(errno: errno)
            }
            try configure(fd)

            var address = sockaddr_in()
            #if canImport(Darwin)
            address.sin_len = UInt8(MemoryLayout<sockaddr_in>.size)
            #endif
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(truncatingIfNeeded: port).bigEndian)
            guard inet_pton(AF_INET, "127.0.0.1", &address.sin_addr) == 1 else {
                throw LoopbackHTTPServer.Error.bind(errno: errno)
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard bound == 0 else { throw LoopbackHTTPServer.Error.bind(errno: errno) }
            guard listen(fd, backlog) == 0 else { throw LoopbackHTTPServer.Error.listen(errno: errno) }

            var boundAddress = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let named = withUnsafeMutablePointer(to: &boundAddress) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            guard named == 0 else { throw LoopbackHTTPServer.Error.getsockname(errno: errno) }
            return (fd, Int(UInt16(bigEndian: boundAddress.sin_port)))
        } catch {
            close(fd)
            throw error
        }
    }

    /// Makes `fd` non-blocking and close-on-exec.
    static func configure(_ fd: Int32) throws {
        let flags = fcntl(fd, F_GETFL, 0)
        guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else {
            throw LoopbackHTTPServer.Error.fcntl(errno: errno)
        }
        let descriptorFlags = fcntl(fd, F_GETFD, 0)
        guard descriptorFlags >= 0, fcntl(fd, F_SETFD, descriptorFlags | FD_CLOEXEC) == 0 else {
            throw LoopbackHTTPServer.Error.fcntl(errno: errno)
        }
    }

    enum AcceptResult {
        case accepted(Int32)
        case wouldBlock
        /// The process or system is out of descriptors: stop accepting until one is closed.
        case outOfDescriptors
        /// A failure tied to one pending connection (e.g. it was aborted): try the next one.
        case skipped
        /// Any other failure: stop accepting for this round.
        case failed
    }

    /// Accepts one pending connection and prepares it: non-blocking, close-on-exec, TCP_NODELAY,
    /// and `SO_NOSIGPIPE` on Darwin.
    static func accept(_ listenFD: Int32) -> AcceptResult {
        while true {
            let fd = Self.acceptCall(listenFD)
            if fd < 0 {
                switch errno {
                case EINTR: continue
                case EAGAIN, EWOULDBLOCK: return .wouldBlock
                case EMFILE, ENFILE, ENOBUFS, ENOMEM: return .outOfDescriptors
                case ECONNABORTED, EPROTO, EPERM: return .skipped
                default: return .failed
                }
            }
            do {
                try configure(fd)
            } catch {
                close(fd)
                return .skipped
            }
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            #if canImport(Darwin)
            _ = setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
            #endif
            return .accepted(fd)
        }
    }

    private static func acceptCall(_ listenFD: Int32) -> Int32 {
        #if canImport(Darwin)
        Darwin.accept(listenFD, nil, nil)
        #elseif canImport(Glibc)
        Glibc.accept(listenFD, nil, nil)
        #else
        Musl.accept(listenFD, nil, nil)
        #endif
    }

    /// Reads into `buffer` without blocking.
    static func read(_ fd: Int32, into buffer: inout [UInt8]) -> IOResult {
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 { return .transferred(count) }
            if count == 0 { return .endOfFile }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: return .wouldBlock
            default: return .failed(errno: errno)
            }
        }
    }

    /// Writes as much of `bytes[offset...]` as the socket takes without blocking; never raises SIGPIPE.
    static func send(_ fd: Int32, _ bytes: [UInt8], from offset: Int) -> IOResult {
        while true {
            let count = bytes.withUnsafeBytes { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                return sendCall(fd, base + offset, raw.count - offset, sendFlags)
            }
            if count >= 0 { return .transferred(count) }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: return .wouldBlock
            default: return .failed(errno: errno)
            }
        }
    }

    private static func sendCall(_ fd: Int32, _ pointer: UnsafeRawPointer, _ count: Int, _ flags: Int32) -> Int {
        #if canImport(Darwin)
        Darwin.send(fd, pointer, count, flags)
        #elseif canImport(Glibc)
        Glibc.send(fd, pointer, count, flags)
        #else
        Musl.send(fd, pointer, count, flags)
        #endif
    }

    /// Sends FIN (no more data from us) while still allowing reads.
    static func shutdownWrite(_ fd: Int32) {
        _ = shutdown(fd, Int32(SHUT_WR))
    }

    /// Arms `SO_LINGER {1, 0}` so that the next `close` sends RST instead of FIN.
    static func armReset(_ fd: Int32) {
        var option = linger(l_onoff: 1, l_linger: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
    }

    /// Stops a listening socket at once, so that connecting is refused from now on. Closing it is
    /// not enough on Linux while a child process that another thread is spawning still holds a
    /// copy (between `posix_spawn`'s clone and its exec): until then the kernel would keep
    /// completing connections into the backlog, and reset them afterwards.
    static func stopListening(_ fd: Int32) {
        _ = shutdown(fd, Int32(SHUT_RDWR))
    }

    static func closeDescriptor(_ fd: Int32) {
        _ = close(fd)
    }

    static var currentErrno: Int32 { errno }
}

/// A non-blocking self-pipe that wakes the event loop's `poll` from other threads.
///
/// Both ends stay open until the last owner (server or loop) releases it, so a late `signal()`
/// never writes to a closed pipe (which would raise SIGPIPE).
final class LoopbackWakePipe: Sendable {
    let readFD: Int32
    let writeFD: Int32

    init() throws {
        var descriptors: [Int32] = [0, 0]
        guard pipe(&descriptors) == 0 else { throw LoopbackHTTPServer.Error.pipe(errno: errno) }
        do {
            try LoopbackSocket.configure(descriptors[0])
            try LoopbackSocket.configure(descriptors[1])
        } catch {
            close(descriptors[0])
            close(descriptors[1])
            throw error
        }
        readFD = descriptors[0]
        writeFD = descriptors[1]
    }

    /// Makes the next (or current) `poll` on `readFD` return. Never blocks: a full pipe already wakes the loop.
    func signal() {
        var byte: UInt8 = 1
        _ = write(writeFD, &byte, 1)
    }

    /// Empties the pipe so `poll` blocks again.
    func drain() {
        var scratch = [UInt8](repeating: 0, count: 256)
        while scratch.withUnsafeMutableBytes({ read(readFD, $0.baseAddress, $0.count) }) > 0 {}
    }

    deinit {
        close(readFD)
        close(writeFD)
    }
}
