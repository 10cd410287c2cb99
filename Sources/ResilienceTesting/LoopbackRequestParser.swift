import Foundation

/// One request head and body as read off the wire, before routing.
struct LoopbackParsedRequest {
    var method: String
    var target: String
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    var minorVersion: Int
    /// Lower-cased names, repeated headers joined with ", ".
    var headers: [String: String]
    var body: Data

    /// Tokens of the `Connection` header, lower-cased.
    var connectionTokens: [String] {
        guard let value = headers["connection"] else { return [] }
        return value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
    }

    /// HTTP/1.1 keeps the connection unless the client sent `Connection: close`;
    /// HTTP/1.0 keeps it only when the client sent `Connection: keep-alive`.
    var wantsKeepAlive: Bool {
        let tokens = connectionTokens
        if tokens.contains("close") { return false }
        return minorVersion >= 1 || tokens.contains("keep-alive")
    }
}

/// Incremental HTTP/1.x request parser: bytes go in with `append(_:)`, events come out of `next()`.
///
/// A value-type state machine with no I/O, so the event loop only performs what it returns.
/// After `.failure` the parser stays failed: the connection answers with that status and closes,
/// because the byte stream can no longer be framed.
struct LoopbackRequestParser {
    enum Event {
        /// Not enough bytes buffered for the next event.
        case needMore
        /// The head of a request with `Expect: 100-continue` is complete and its body has not started
        /// arriving: the server should write `100 Continue` before the final response.
        case expectContinue
        /// A complete request.
        case request(LoopbackParsedRequest)
        /// The stream cannot be parsed: answer with this status and close.
        case failure(status: Int)
    }

    /// The most bytes a request line plus headers may take (431 beyond).
    static let maxHeadBytes = 64 * 1024
    /// The most bytes a chunk-size line or a trailer line may take before its CRLF (400 beyond),
    /// whether the line arrives in one read or in many.
    static let maxChunkLineBytes = 8 * 1024

    private enum ChunkPhase {
        case size
        case data(remaining: Int)
        case dataEnd
        case trailers
    }

    private enum State {
        case head
        case fixedBody(LoopbackParsedRequest, length: Int)
        case chunkedBody(LoopbackParsedRequest, ChunkPhase)
        case failed(status: Int)
    }

    private var buffer: [UInt8] = []
    /// Index of the first unconsumed byte in `buffer`.
    private var readIndex = 0
    /// Where the search for the end of the head resumes (bytes before it hold no CRLFCRLF).
    private var scanIndex = 0
    private var state: State = .head

    private static let cr = UInt8(ascii: "\r")
    private static let lf = UInt8(ascii: "\n")

    var bufferedByteCount: Int { buffer.count - readIndex }

    mutating func append(_ bytes: some Sequence<UInt8>) {
        if readIndex > 0 && readIndex >= buffer.count / 2 {
            buffer.removeSubrange(0..<readIndex)
            scanIndex = max(0, scanIndex - readIndex)
            readIndex = 0
        }
        buffer.append(contentsOf: bytes)
    }

    mutating func next() -> Event {
        switch state {
        case .failed(let status):
            return .failure(status: status)
        case .head:
            return parseHead()
        case .fixedBody(let request, let length):
            guard bufferedByteCount >= length else { return .needMore }
            var complete = request
            complete.body = Data(buffer[readIndex..<(readIndex + length)])
            readIndex += length
            state = .head
            return .request(complete)
        case .chunkedBody(let request, let phase):
            state = .head  // drop the state's copy so appending to the body does not copy it
            return parseChunked(request, phase)
        }
    }

    private mutating func fail(_ status: Int) -> Event {
        state = .failed(status: status)
        return .failure(status: status)
    }

    /// Index of the CRLF that ends the line at `readIndex`, if it has arrived. The search resumes
    /// where the last one stopped (`scanIndex`), so a line read a byte at a time costs linear time.
    private mutating func findLineEnd() -> Int? {
        var index = max(readIndex, scanIndex)
        while index + 1 < buffer.count {
            if buffer[index] == Self.cr && buffer[index + 1] == Self.lf {
                scanIndex = index + 2
                return index
            }
            index += 1
        }
        scanIndex = max(readIndex, buffer.count - 1)
        return nil
    }

    private mutating func parseHead() -> Event {
        // RFC 9112 §2.2: ignore empty lines received before the request line.
        while bufferedByteCount >= 2 && buffer[readIndex] == Self.cr && buffer[readIndex + 1] == Self.lf {
            readIndex += 2
        }
        var index = max(readIndex, scanIndex)
        var headEnd: Int?
        while index + 3 < buffer.count {
            if buffer[index] == Self.cr && buffer[index + 1] == Self.lf
                && buffer[index + 2] == Self.cr && buffer[index + 3] == Self.lf
            {
                headEnd = index
                break
            }
            index += 1
        }
        guard let headEnd else {
            scanIndex = max(readIndex, buffer.count - 3)
            return bufferedByteCount > Self.maxHeadBytes ? fail(431) : .needMore
        }
        guard headEnd + 4 - readIndex <= Self.maxHeadBytes else { return fail(431) }
        let head = String(decoding: buffer[readIndex..<headEnd], as: UTF8.self)
        readIndex = headEnd + 4
        scanIndex = readIndex

        let lines = head.components(separatedBy: "\r\n")
        guard let requestLine = lines.first else { return fail(400) }
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3,
            !parts[0].isEmpty, parts[0].allSatisfy(Self.isTokenCharacter),
            !parts[1].isEmpty, !parts[1].contains(where: { $0.isWhitespace || $0.isNewline })
        else { return fail(400) }
        let minorVersion: Int
        switch parts[2] {
        case "HTTP/1.1": minorVersion = 1
        case "HTTP/1.0": minorVersion = 0
        default:
            let version = parts[2]
            let isWellFormed =
                version.count == 8 && version.hasPrefix("HTTP/")
                && version.dropFirst(5).enumerated().allSatisfy { offset, character in
                    offset == 1 ? character == "." : character.isASCII && character.isNumber
                }
            return fail(isWellFormed ? 505 : 400)
        }

        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            // Obsolete line folding and lines without a colon are rejected (RFC 9112 §5.2).
            guard let colon = line.firstIndex(of: ":"),
                let first = line.first, first != " ", first != "\t"
            else { return fail(400) }
            let name = line[..<colon]
            guard !name.isEmpty, name.allSatisfy(Self.isTokenCharacter) else { return fail(400) }
            let value = line[line.index(after: colon)...].trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
            let key = name.lowercased()
            if let existing = headers[key] {
                headers[key] = existing + ", " + value
            } else {
                headers[key] = value
            }
        }

        let request = LoopbackParsedRequest(
            method: String(parts[0]), target: String(parts[1]),
            minorVersion: minorVersion, headers: headers, body: Data()
        )
        let expectsContinue =
            minorVersion >= 1
            && headers["expect"]?.lowercased() == "100-continue"
            && bufferedByteCount == 0

        if let transferEncoding = headers["transfer-encoding"] {
            // RFC 9112 §6.3: with Transfer-Encoding, the body is chunked only if chunked is the final coding.
            let codings = transferEncoding.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
            guard codings.last == "chunked" else { return fail(400) }
            state = .chunkedBody(request, .size)
            return expectsContinue ? .expectContinue : next()
        }
        if let contentLength = headers["content-length"] {
            let values = Set(contentLength.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
            guard values.count == 1, let text = values.first, !text.isEmpty,
                text.allSatisfy({ $0.isASCII && $0.isNumber }), let length = Int(text)
            else { return fail(400) }
            if length == 0 {
                state = .head
                return .request(request)
            }
            state = .fixedBody(request, length: length)
            return expectsContinue ? .expectContinue : next()
        }
        state = .head
        return .request(request)
    }

    private mutating func parseChunked(_ request: LoopbackParsedRequest, _ phase: ChunkPhase) -> Event {
        var request = request
        var phase = phase
        while true {
            switch phase {
            case .size:
                // Without its CRLF yet, the line is at least all but the last byte buffered (which
                // may be the CR): too long once that passes the limit, whatever arrives next.
                guard let lineEnd = findLineEnd() else {
                    return bufferedByteCount > Self.maxChunkLineBytes + 1 ? fail(400) : suspend(request, phase)
                }
                guard lineEnd - readIndex <= Self.maxChunkLineBytes else { return fail(400) }
                let line = String(decoding: buffer[readIndex..<lineEnd], as: UTF8.self)
                readIndex = lineEnd + 2
                // chunk-size [ chunk-ext ]: the size ends at ";" or whitespace.
                let sizeText = line.prefix { $0.isHexDigit }
                let rest = line.dropFirst(sizeText.count).trimmingCharacters(in: CharacterSet(charactersIn: " \t"))
                guard !sizeText.isEmpty, sizeText.count <= 15, rest.isEmpty || rest.hasPrefix(";"),
                    let size = Int(sizeText, radix: 16)
                else { return fail(400) }
                phase = size == 0 ? .trailers : .data(remaining: size)
            case .data(let remaining):
                let available = min(remaining, bufferedByteCount)
                guard available > 0 else { return suspend(request, phase) }
                request.body.append(contentsOf: buffer[readIndex..<(readIndex + available)])
                readIndex += available
                phase = remaining == available ? .dataEnd : .data(remaining: remaining - available)
            case .dataEnd:
                guard bufferedByteCount >= 2 else { return suspend(request, phase) }
                guard buffer[readIndex] == Self.cr && buffer[readIndex + 1] == Self.lf else { return fail(400) }
                readIndex += 2
                phase = .size
            case .trailers:
                guard let lineEnd = findLineEnd() else {
                    return bufferedByteCount > Self.maxChunkLineBytes + 1 ? fail(400) : suspend(request, phase)
                }
                guard lineEnd - readIndex <= Self.maxChunkLineBytes else { return fail(400) }
                let isLastLine = lineEnd == readIndex
                readIndex = lineEnd + 2
                if isLastLine {
                    state = .head
                    scanIndex = readIndex
                    return .request(request)
                }
            // Trailer fields are read and ignored.
            }
        }
    }

    private mutating func suspend(_ request: LoopbackParsedRequest, _ phase: ChunkPhase) -> Event {
        state = .chunkedBody(request, phase)
        return .needMore
    }

    private static func isTokenCharacter(_ character: Character) -> Bool {
        guard let ascii = character.asciiValue, ascii > 32, ascii < 127 else { return false }
        return !"\"(),/:;<=>?@[\\]{}".contains(character)
    }
}
