import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// When a queued response may be written.
private enum LoopbackGate {
    case ready
    /// Waiting for `releaseHeld`; the response's delay starts at the release.
    case held(id: Int)
    case delayed(until: ContinuousClock.Instant)
}

/// A response waiting its turn on a connection.
private struct LoopbackQueuedResponse {
    var response: LoopbackResponse
    var isHEAD: Bool
    /// Close the connection once this response is written.
    var closesConnection: Bool
    /// HTTP/1.0 client that asked for keep-alive: say `Connection: keep-alive`.
    var confirmsKeepAlive: Bool
    var gate: LoopbackGate
}

private enum LoopbackQueueItem {
    /// `100 Continue` (always ready, keeps its place in the pipeline).
    case interim([UInt8])
    case response(LoopbackQueuedResponse)
}

private enum LoopbackCloseMode {
    /// FIN after the last byte, then read and discard until the peer closes (or a deadline):
    /// closing with unread input would make the kernel send RST and could destroy the response.
    case graceful
    /// `close()` at once, nothing written.
    case abrupt
    /// `SO_LINGER {1, 0}` then `close()`: RST.
    case reset
}

/// An endless chunked body being written: the framed chunk, and when the next one may go.
private struct LoopbackEndlessBody {
    let frame: [UInt8]
    /// Zero: as fast as the socket takes them.
    let interval: Duration
    var next: ContinuousClock.Instant
}

/// One accepted TCP connection; touched only by the loop thread.
private final class LoopbackConnection {
    let id: Int
    let fd: Int32
    var parser = LoopbackRequestParser()
    /// Responses in request order; only the first may be written (pipelining keeps order).
    var queue: [LoopbackQueueItem] = []
    var output: [UInt8] = []
    var outputOffset = 0
    /// False once a request asked to close or the stream could not be parsed: later bytes are ignored.
    var acceptsRequests = true
    var closeAfterFlush: LoopbackCloseMode?
    /// Set once our write side is shut: input is discarded until EOF or this deadline.
    var drainDeadline: ContinuousClock.Instant?
    /// Set once an endless body's head is queued: chunks follow until the connection closes.
    var endlessBody: LoopbackEndlessBody?
    var isClosed = false

    init(id: Int, fd: Int32) {
        self.id = id
        self.fd = fd
    }

    var hasPendingOutput: Bool { outputOffset < output.count }

    /// Whether the socket is polled for writability: output is pending, or an endless body goes as
    /// fast as the client reads.
    var wantsToWrite: Bool { hasPendingOutput || endlessBody?.interval == .zero }

    var heldIDs: [Int] {
        queue.compactMap { item in
            if case .response(let queued) = item, case .held(let id) = queued.gate { return id }
            return nil
        }
    }
}

/// The server's single event-loop thread: `poll()` over the listening socket, the wake pipe and
/// every connection, all non-blocking. Confined to the thread that calls `run()`; it is created
/// on that thread too, so nothing here is shared.
final class LoopbackEventLoop {
    private let listenFD: Int32
    private let wake: LoopbackWakePipe
    private let state: LoopbackServerState
    private let clock = ContinuousClock()

    private var connections: [Int: LoopbackConnection] = [:]
    /// Held id -> connection id, to find the response `releaseHeld` released.
    private var heldLocations: [Int: Int] = [:]
    /// Wake-ups for delayed responses and drain deadlines (connection id); stale ones are ignored.
    private var timers: [(deadline: ContinuousClock.Instant, connectionID: Int)] = []
    private var nextConnectionID = 0
    /// Out of descriptors: the listener is not polled until a connection closes or this instant
    /// passes (polling it meanwhile would spin, as it stays readable).
    private var acceptPausedUntil: ContinuousClock.Instant?
    private var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
    private var cachedDate: (second: Int, text: String) = (-1, "")

    /// How long accepting pauses after running out of descriptors, unless a connection closes first.
    private static let acceptPause: Duration = .milliseconds(50)
    /// How long a gracefully closing connection may keep sending before it is closed anyway.
    private static let drainTimeout: Duration = .seconds(2)
    private static let continueBytes = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    init(listenFD: Int32, wake: LoopbackWakePipe, state: LoopbackServerState) {
        self.listenFD = listenFD
        self.wake = wake
        self.state = state
    }

    func run() {
        state.loopStarted()
        var pollSet: [pollfd] = []
        var pollIDs: [Int] = []
        while true {
            let commands = state.takeCommands()
            if commands.shutdown { break }
            for id in commands.releases { release(heldID: id) }
            fireTimers()
            if let until = acceptPausedUntil, until <= clock.now { acceptPausedUntil = nil }

            pollSet.removeAll(keepingCapacity: true)
            pollIDs.removeAll(keepingCapacity: true)
            pollSet.append(pollfd(fd: wake.readFD, events: Int16(POLLIN), revents: 0))
            pollSet.append(pollfd(fd: listenFD, events: acceptPausedUntil == nil ? Int16(POLLIN) : 0, revents: 0))
            for (id, connection) in connections {
                var events = Int16(POLLIN)
                if connection.wantsToWrite { events |= Int16(POLLOUT) }
                pollSet.append(pollfd(fd: connection.fd, events: events, revents: 0))
                pollIDs.append(id)
            }

            let ready = poll(&pollSet, nfds_t(pollSet.count), pollTimeout())
            if ready < 0 {
                let error = LoopbackSocket.currentErrno
                if error == EINTR || error == EAGAIN || error == ENOMEM { continue }
                break
            }
            if ready == 0 { continue }
            if pollSet[0].revents != 0 { wake.drain() }
            if pollSet[1].revents & Int16(POLLIN) != 0 { acceptConnections() }
            for index in 2..<pollSet.count {
                let revents = pollSet[index].revents
                guard revents != 0, let connection = connections[pollIDs[index - 2]] else { continue }
                if revents & Int16(POLLNVAL) != 0 {
                    closeConnection(connection)
                    continue
                }
                if revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { readAvailable(connection) }
                if revents & Int16(POLLOUT) != 0 && !connection.isClosed { flush(connection) }
            }
        }
        tearDown()
    }

    private func tearDown() {
        for connection in connections.values {
            LoopbackSocket.closeDescriptor(connection.fd)
        }
        connections.removeAll()
        heldLocations.removeAll()
        timers.removeAll()
        LoopbackSocket.stopListening(listenFD)
        LoopbackSocket.closeDescriptor(listenFD)
        state.loopFinished()
    }

    // MARK: Timers

    private func pollTimeout() -> Int32 {
        var deadlines = timers.map(\.deadline)
        if let acceptPausedUntil { deadlines.append(acceptPausedUntil) }
        guard let earliest = deadlines.min() else { return -1 }
        let remaining = clock.now.duration(to: earliest)
        if remaining <= .zero { return 0 }
        let (seconds, attoseconds) = remaining.components
        let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: milliseconds)
    }

    private func addTimer(_ deadline: ContinuousClock.Instant, for connection: LoopbackConnection) {
        timers.append((deadline, connection.id))
    }

    private func fireTimers() {
        guard !timers.isEmpty else { return }
        let now = clock.now
        var due: [Int] = []
        timers.removeAll { timer in
            guard timer.deadline <= now else { return false }
            due.append(timer.connectionID)
            return true
        }
        for id in due {
            guard let connection = connections[id] else { continue }
            if let deadline = connection.drainDeadline {
                if deadline <= now { closeConnection(connection) }
            } else {
                advance(connection)
            }
        }
    }

    // MARK: Accepting and reading

    private func acceptConnections() {
        while true {
            switch LoopbackSocket.accept(listenFD) {
            case .accepted(let fd):
                nextConnectionID += 1
                connections[nextConnectionID] = LoopbackConnection(id: nextConnectionID, fd: fd)
                state.connectionOpened()
            case .wouldBlock:
                return
            case .outOfDescriptors:
                acceptPausedUntil = clock.now.advanced(by: Self.acceptPause)
                return
            case .skipped:
                continue
            case .failed:
                return
            }
        }
    }

    private func readAvailable(_ connection: LoopbackConnection) {
        var reachedEnd = false
        reading: while true {
            switch LoopbackSocket.read(connection.fd, into: &readBuffer) {
            case .transferred(let count):
                if connection.drainDeadline == nil && connection.acceptsRequests {
                    connection.parser.append(readBuffer[0..<count])
                }
                if count < readBuffer.count { break reading }
            case .wouldBlock:
                break reading
            case .endOfFile:
                reachedEnd = true
                break reading
            case .failed:
                closeConnection(connection)
                return
            }
        }
        if connection.drainDeadline == nil {
            parseRequests(connection)
            advance(connection)
        }
        // The peer is gone (or at least done sending): whatever is still held or delayed is dropped.
        if reachedEnd { closeConnection(connection) }
    }

    private func parseRequests(_ connection: LoopbackConnection) {
        while connection.acceptsRequests && !connection.isClosed {
            switch connection.parser.next() {
            case .needMore:
                return
            case .expectContinue:
                connection.queue.append(.interim(Self.continueBytes))
            case .failure(let status):
                connection.acceptsRequests = false
                connection.queue.append(
                    .response(
                        LoopbackQueuedResponse(
                            response: LoopbackResponse(status: status), isHEAD: false,
                            closesConnection: true, confirmsKeepAlive: false, gate: .ready
                        )))
            case .request(let parsed):
                enqueueResponse(to: parsed, on: connection)
            }
        }
    }

    private func enqueueResponse(to parsed: LoopbackParsedRequest, on connection: LoopbackConnection) {
        let request = LoopbackRequest(
            method: parsed.method, target: parsed.target, headers: parsed.headers,
            body: parsed.body, connectionID: connection.id
        )
        let (response, heldID) = state.respond(to: request)
        let responseCloses =
            response.kind != .http
            || response.headers.contains { name, value in
                name.lowercased() == "connection"
                    && value.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).lowercased() == "close" }
            }
        let keepAlive = parsed.wantsKeepAlive && !responseCloses
        if !keepAlive { connection.acceptsRequests = false }

        let gate: LoopbackGate
        if let heldID {
            heldLocations[heldID] = connection.id
            gate = .held(id: heldID)
        } else if response.delay > .zero {
            let deadline = clock.now.advanced(by: response.delay)
            addTimer(deadline, for: connection)
            gate = .delayed(until: deadline)
        } else {
            gate = .ready
        }
        connection.queue.append(
            .response(
                LoopbackQueuedResponse(
                    response: response, isHEAD: parsed.method == "HEAD", closesConnection: !keepAlive,
                    confirmsKeepAlive: keepAlive && parsed.minorVersion == 0, gate: gate
                )))
    }

    private func release(heldID: Int) {
        guard let connectionID = heldLocations.removeValue(forKey: heldID),
            let connection = connections[connectionID]
        else { return }
        for index in connection.queue.indices {
            guard case .response(var queued) = connection.queue[index], case .held(heldID) = queued.gate else { continue }
            if queued.response.delay > .zero {
                let deadline = clock.now.advanced(by: queued.response.delay)
                addTimer(deadline, for: connection)
                queued.gate = .delayed(until: deadline)
            } else {
                queued.gate = .ready
            }
            connection.queue[index] = .response(queued)
            break
        }
        advance(connection)
    }

    // MARK: Writing

    /// Moves every response that may go now from the head of the queue to the output, then flushes.
    private func advance(_ connection: LoopbackConnection) {
        guard !connection.isClosed, connection.drainDeadline == nil else { return }
        var now: ContinuousClock.Instant?
        draining: while let first = connection.queue.first, connection.closeAfterFlush == nil {
            switch first {
            case .interim(let bytes):
                connection.output.append(contentsOf: bytes)
            case .response(let queued):
                switch queued.gate {
                case .held:
                    break draining
                case .delayed(let deadline):
                    let current = now ?? clock.now
                    now = current
                    if deadline > current { break draining }
                case .ready:
                    break
                }
                write(queued, to: connection)
            }
            connection.queue.removeFirst()
        }
        if connection.closeAfterFlush != nil && !connection.queue.isEmpty {
            // Nothing after a closing response is ever written; forget held ones.
            let dropped = connection.heldIDs
            for id in dropped { heldLocations.removeValue(forKey: id) }
            connection.queue.removeAll()
            if !dropped.isEmpty { state.withLock { fields in for id in dropped { fields.held.removeValue(forKey: id) } } }
        }
        flush(connection)
    }

    private func write(_ queued: LoopbackQueuedResponse, to connection: LoopbackConnection) {
        let response = queued.response
        switch response.kind {
        case .http:
            connection.output.append(contentsOf: head(for: queued, closing: queued.closesConnection))
            if !queued.isHEAD && Self.statusAllowsBody(response.status) {
                connection.output.append(contentsOf: response.body)
            }
            if queued.closesConnection { connection.closeAfterFlush = .graceful }
        case .closeWithoutResponse:
            connection.closeAfterFlush = .abrupt
        case .reset:
            connection.closeAfterFlush = .reset
        case .raw(let bytes):
            connection.output.append(contentsOf: bytes)
            connection.closeAfterFlush = .graceful
        case .partialBodyThenClose:
            connection.output.append(contentsOf: head(for: queued, closing: false))
            if !queued.isHEAD {
                connection.output.append(contentsOf: response.body.prefix(response.body.count / 2))
            }
            connection.closeAfterFlush = .graceful
        case .endlessChunkedBody(let chunk, let interval):
            connection.output.append(contentsOf: head(for: queued, closing: false, chunked: true))
            guard !queued.isHEAD else {
                connection.closeAfterFlush = .graceful
                return
            }
            let frame = Array(String(chunk.count, radix: 16).utf8) + [0x0D, 0x0A] + Array(chunk) + [0x0D, 0x0A]
            connection.endlessBody = LoopbackEndlessBody(frame: frame, interval: interval, next: clock.now)
        }
    }

    /// How many chunks of an as-fast-as-possible endless body one flush writes before the loop
    /// serves other connections (writability brings it back).
    private static let endlessChunksPerFlush = 16

    /// Writes as much output as the socket takes (and an endless body's next chunks); once all is
    /// out, performs a pending close.
    private func flush(_ connection: LoopbackConnection) {
        guard !connection.isClosed else { return }
        var chunks = 0
        while true {
            while connection.hasPendingOutput {
                switch LoopbackSocket.send(connection.fd, connection.output, from: connection.outputOffset) {
                case .transferred(let count):
                    connection.outputOffset += count
                    state.sent(count)
                case .wouldBlock:
                    return
                case .endOfFile, .failed:
                    closeConnection(connection)
                    return
                }
            }
            guard var endless = connection.endlessBody else { break }
            if endless.interval > .zero {
                let now = clock.now
                guard endless.next <= now else { return }  // a timer is armed for `next`
                endless.next = now.advanced(by: endless.interval)
                addTimer(endless.next, for: connection)
                connection.endlessBody = endless
            } else {
                chunks += 1
                if chunks > Self.endlessChunksPerFlush { return }
            }
            connection.output.removeAll(keepingCapacity: true)
            connection.output.append(contentsOf: endless.frame)
            connection.outputOffset = 0
        }
        if !connection.output.isEmpty {
            connection.output.removeAll(keepingCapacity: connection.output.count <= 64 * 1024)
            connection.outputOffset = 0
        }
        guard let mode = connection.closeAfterFlush, connection.drainDeadline == nil else { return }
        switch mode {
        case .abrupt:
            closeConnection(connection)
        case .reset:
            LoopbackSocket.armReset(connection.fd)
            closeConnection(connection)
        case .graceful:
            LoopbackSocket.shutdownWrite(connection.fd)
            let deadline = clock.now.advanced(by: Self.drainTimeout)
            connection.drainDeadline = deadline
            addTimer(deadline, for: connection)
        }
    }

    private func closeConnection(_ connection: LoopbackConnection) {
        guard !connection.isClosed else { return }
        connection.isClosed = true
        LoopbackSocket.closeDescriptor(connection.fd)
        connections.removeValue(forKey: connection.id)
        let dropped = connection.heldIDs
        for id in dropped { heldLocations.removeValue(forKey: id) }
        connection.queue.removeAll()
        connection.output.removeAll()
        acceptPausedUntil = nil
        state.connectionClosed(droppingHeld: dropped)
    }

    // MARK: Serialisation

    private func head(for queued: LoopbackQueuedResponse, closing: Bool, chunked: Bool = false) -> [UInt8] {
        let response = queued.response
        var hasDate = false
        var hasLength = false
        var hasConnection = false
        for name in response.headers.keys {
            switch name.lowercased() {
            case "date": hasDate = true
            case "content-length": hasLength = true
            case "connection": hasConnection = true
            default: break
            }
        }
        var text = "HTTP/1.1 \(response.status) \(Self.reasonPhrase(for: response.status))\r\n"
        if !hasDate { text += "Date: \(httpDate())\r\n" }
        // RFC 9110 §8.6: no Content-Length in 1xx and 204 responses.
        if chunked {
            text += "Transfer-Encoding: chunked\r\n"
        } else if !hasLength && !(100..<200).contains(response.status) && response.status != 204 {
            text += "Content-Length: \(response.body.count)\r\n"
        }
        for (name, value) in response.headers.sorted(by: { $0.key < $1.key }) {
            text += "\(name): \(value)\r\n"
        }
        if !hasConnection {
            if closing {
                text += "Connection: close\r\n"
            } else if queued.confirmsKeepAlive {
                text += "Connection: keep-alive\r\n"
            }
        }
        text += "\r\n"
        return Array(text.utf8)
    }

    private static func statusAllowsBody(_ status: Int) -> Bool {
        !(100..<200).contains(status) && status != 204 && status != 304
    }

    static func reasonPhrase(for status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 206: "Partial Content"
        case 301: "Moved Permanently"
        case 302: "Found"
        case 304: "Not Modified"
        case 307: "Temporary Redirect"
        case 308: "Permanent Redirect"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 410: "Gone"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 422: "Unprocessable Content"
        case 429: "Too Many Requests"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        case 505: "HTTP Version Not Supported"
        default: "Status"
        }
    }

    /// IMF-fixdate (RFC 9110 §5.6.7) for the current second, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
    private func httpDate() -> String {
        var now = time(nil)
        if now == cachedDate.second { return cachedDate.text }
        var parts = tm()
        guard gmtime_r(&now, &parts) != nil else { return cachedDate.text }
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func twoDigits(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let text =
            "\(days[Int(parts.tm_wday) % 7]), \(twoDigits(parts.tm_mday)) \(months[Int(parts.tm_mon) % 12]) "
            + "\(parts.tm_year + 1900) \(twoDigits(parts.tm_hour)):\(twoDigits(parts.tm_min)):\(twoDigits(parts.tm_sec)) GMT"
        cachedDate = (now, text)
        return text
    }
}
