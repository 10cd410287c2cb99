import Foundation

/// A fast reader for queue entry files, used when a folder is opened.
///
/// Opening 100 000 entries with `JSONDecoder` costs about 18 µs per file on a small Linux VM,
/// which alone takes well over a second. Entry files are flat JSON objects this library writes
/// itself, so this reader parses exactly that shape straight from the bytes (full JSON string
/// escapes included). Anything it does not recognise — an unknown or repeated key, a nested value
/// where none belongs, a number where a string belongs, a number or string that is not JSON —
/// makes it return `nil`, and the caller falls back to `JSONDecoder`, which stays the authority on
/// what is a valid entry: what this reader reads, `JSONDecoder` reads the same (Fuzz/, queue-entry).
enum QueueEntryDecoder {
    /// Parses a canonical UUID string (8-4-4-4-12 hex digits) without `sscanf`, which
    /// `UUID(uuidString:)` uses on Linux.
    static func parseUUID(_ text: String) -> UUID? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        var high: UInt8?
        var count = 0
        for byte in text.utf8 {
            count += 1
            if byte == UInt8(ascii: "-") {
                guard count == 9 || count == 14 || count == 19 || count == 24 else { return nil }
                continue
            }
            let nibble: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibble = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            if let first = high {
                bytes.append(first << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        guard count == 36, bytes.count == 16, high == nil else { return nil }
        return UUID(
            uuid: (
                bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
            ))
    }

    static func decode(_ data: Data) -> QueueEntry? {
        data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> QueueEntry? in
            decode(raw.bindMemory(to: UInt8.self))
        }
    }

    static func decode(_ bytes: UnsafeBufferPointer<UInt8>) -> QueueEntry? {
        var parser = Parser(bytes: bytes)
        return parser.entry()
    }

    private enum Value {
        case string(String)
        case number(Double)
        case null
        case object([String: String])
    }

    private struct Parser {
        let bytes: UnsafeBufferPointer<UInt8>
        var position = 0

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        /// The raw values by field, filled as keys are met (no dictionary: hashing 18 keys per
        /// file was a visible share of opening a large folder).
        private struct Fields {
            var id: Value?, url: Value?, method: Value?, headers: Value?, body: Value?, timeout: Value?
            var enqueuedAt: Value?, ttl: Value?, priority: Value?, idempotencyKey: Value?, orderingKey: Value?
            var coalescingKey: Value?, sequence: Value?, attempts: Value?, nextAttemptAt: Value?
            var lastError: Value?, revision: Value?, formatVersion: Value?, maximumResponseBodySize: Value?
            var deadlineSeconds: Value?, baseETag: Value?, baseLastModified: Value?, operationID: Value?

            /// Stores `value` under `key`; `false` for a key an entry does not have, or one already
            /// met (JSON leaves a repeated key's meaning open: JSONDecoder reads the first, so this
            /// reader leaves such a file to it).
            mutating func set(_ key: String, _ value: Value) -> Bool {
                func store(_ field: inout Value?) -> Bool {
                    guard field == nil else { return false }
                    field = value
                    return true
                }
                switch key {
                case "id": return store(&id)
                case "url": return store(&url)
                case "method": return store(&method)
                case "headers": return store(&headers)
                case "body": return store(&body)
                case "timeout": return store(&timeout)
                case "enqueuedAt": return store(&enqueuedAt)
                case "ttl": return store(&ttl)
                case "priority": return store(&priority)
                case "idempotencyKey": return store(&idempotencyKey)
                case "orderingKey": return store(&orderingKey)
                case "coalescingKey": return store(&coalescingKey)
                case "sequence": return store(&sequence)
                case "attempts": return store(&attempts)
                case "nextAttemptAt": return store(&nextAttemptAt)
                case "lastError": return store(&lastError)
                case "revision": return store(&revision)
                case "formatVersion": return store(&formatVersion)
                case "maximumResponseBodySize": return store(&maximumResponseBodySize)
                case "deadlineSeconds": return store(&deadlineSeconds)
                case "baseETag": return store(&baseETag)
                case "baseLastModified": return store(&baseLastModified)
                case "operationID": return store(&operationID)
                default: return false
                }
            }
        }

        mutating func entry() -> QueueEntry? {
            skipWhitespace()
            guard consume(UInt8(ascii: "{")) else { return nil }
            var fields = Fields()
            skipWhitespace()
            if !consume(UInt8(ascii: "}")) {
                while true {
                    skipWhitespace()
                    guard let key = string() else { return nil }
                    skipWhitespace()
                    guard consume(UInt8(ascii: ":")) else { return nil }
                    skipWhitespace()
                    guard let value = value(allowObject: key == "headers"), fields.set(key, value) else { return nil }
                    skipWhitespace()
                    if consume(UInt8(ascii: ",")) { continue }
                    guard consume(UInt8(ascii: "}")) else { return nil }
                    break
                }
            }
            skipWhitespace()
            guard position == bytes.count else { return nil }
            return Self.makeEntry(fields)
        }

        private static func makeEntry(_ fields: Fields) -> QueueEntry? {
            func string(_ value: Value?) -> String? {
                if case .string(let text) = value { return text }
                return nil
            }
            func optionalString(_ value: Value?) -> String?? {
                switch value {
                case nil, .null?: return .some(nil)
                case .string(let text)?: return .some(text)
                default: return nil
                }
            }
            func double(_ value: Value?) -> Double? {
                switch value {
                case .number(let number)?: return number
                case .string("inf")?: return .infinity
                case .string("-inf")?: return -.infinity
                case .string("nan")?: return .nan
                default: return nil
                }
            }
            func integer(_ value: Value?) -> Int? {
                guard let number = double(value), number.isFinite, number == number.rounded(),
                    abs(number) < 9.0e15
                else { return nil }
                return Int(number)
            }
            guard let idText = string(fields.id), let id = QueueEntryDecoder.parseUUID(idText),
                let urlText = string(fields.url), let url = URL(string: urlText),
                let method = string(fields.method),
                let timeout = double(fields.timeout),
                // A date is a plain number: JSONDecoder reads no "inf" or "nan" string as a `Date`.
                case .number(let enqueuedAt)? = fields.enqueuedAt,
                let ttl = double(fields.ttl),
                let priority = integer(fields.priority),
                let idempotencyKey = string(fields.idempotencyKey),
                let orderingKey = optionalString(fields.orderingKey),
                let coalescingKey = optionalString(fields.coalescingKey),
                let sequence = integer(fields.sequence), sequence >= 0,
                let attempts = integer(fields.attempts),
                let lastError = optionalString(fields.lastError),
                let revision = integer(fields.revision),
                let formatVersion = integer(fields.formatVersion),
                let baseETag = optionalString(fields.baseETag),
                let baseLastModified = optionalString(fields.baseLastModified),
                let operationID = optionalString(fields.operationID),
                case .object(let headers)? = fields.headers
            else { return nil }
            var body: Data?
            switch fields.body {
            case nil, .null?: body = nil
            case .string(let base64)?:
                guard let decoded = Data(base64Encoded: base64) else { return nil }
                body = decoded
            default: return nil
            }
            var maximumResponseBodySize: Int?
            switch fields.maximumResponseBodySize {
            case nil, .null?: maximumResponseBodySize = nil
            case let value?:
                guard let limit = integer(value) else { return nil }
                maximumResponseBodySize = limit
            }
            var deadlineSeconds: Double?
            switch fields.deadlineSeconds {
            case nil, .null?: deadlineSeconds = nil
            case let value?:
                // We write only positive deadlines (a queued request with none left is refused).
                guard let seconds = double(value), seconds > 0 else { return nil }
                deadlineSeconds = seconds
            }
            var nextAttemptAt: Date?
            switch fields.nextAttemptAt {
            case nil, .null?: nextAttemptAt = nil
            case .number(let seconds)?: nextAttemptAt = Date(timeIntervalSinceReferenceDate: seconds)
            default: return nil
            }
            return QueueEntry(
                id: id, url: url, method: method, headers: headers, body: body, timeout: timeout,
                enqueuedAt: Date(timeIntervalSinceReferenceDate: enqueuedAt), ttl: ttl, priority: priority,
                idempotencyKey: idempotencyKey, orderingKey: orderingKey, coalescingKey: coalescingKey,
                sequence: UInt64(sequence), attempts: attempts, nextAttemptAt: nextAttemptAt,
                lastError: lastError, revision: revision, formatVersion: formatVersion,
                maximumResponseBodySize: maximumResponseBodySize, deadlineSeconds: deadlineSeconds,
                baseETag: baseETag, baseLastModified: baseLastModified, operationID: operationID
            )
        }

        private mutating func value(allowObject: Bool) -> Value? {
            guard position < bytes.count else { return nil }
            switch bytes[position] {
            case UInt8(ascii: "\""):
                return string().map(Value.string)
            case UInt8(ascii: "n"):
                return literal("null") ? .null : nil
            case UInt8(ascii: "{"):
                return allowObject ? stringObject().map(Value.object) : nil
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                return number().map(Value.number)
            default:
                return nil
            }
        }

        private mutating func stringObject() -> [String: String]? {
            guard consume(UInt8(ascii: "{")) else { return nil }
            var object: [String: String] = [:]
            skipWhitespace()
            if consume(UInt8(ascii: "}")) { return object }
            while true {
                skipWhitespace()
                guard let key = string() else { return nil }
                skipWhitespace()
                guard consume(UInt8(ascii: ":")) else { return nil }
                skipWhitespace()
                // A repeated name (as Swift compares strings) is left to JSONDecoder too.
                guard let value = string(), object[key] == nil else { return nil }
                object[key] = value
                skipWhitespace()
                if consume(UInt8(ascii: ",")) { continue }
                return consume(UInt8(ascii: "}")) ? object : nil
            }
        }

        private mutating func string() -> String? {
            guard consume(UInt8(ascii: "\"")) else { return nil }
            let start = position
            // Fast path: no escapes.
            while position < bytes.count {
                let byte = bytes[position]
                if byte == UInt8(ascii: "\"") {
                    guard let text = Self.validString(UnsafeBufferPointer(rebasing: bytes[start..<position])) else { return nil }
                    position += 1
                    return text
                }
                if byte == UInt8(ascii: "\\") { break }
                if byte < 0x20 { return nil }
                position += 1
            }
            // Slow path: decode escapes.
            var utf8 = Array(UnsafeBufferPointer(rebasing: bytes[start..<position]))
            while position < bytes.count {
                let byte = bytes[position]
                position += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return utf8.withUnsafeBufferPointer { Self.validString($0) }
                case UInt8(ascii: "\\"):
                    guard position < bytes.count else { return nil }
                    let escape = bytes[position]
                    position += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): utf8.append(escape)
                    case UInt8(ascii: "b"): utf8.append(0x08)
                    case UInt8(ascii: "f"): utf8.append(0x0C)
                    case UInt8(ascii: "n"): utf8.append(0x0A)
                    case UInt8(ascii: "r"): utf8.append(0x0D)
                    case UInt8(ascii: "t"): utf8.append(0x09)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return nil }
                        if (0xD800...0xDBFF).contains(scalar) {
                            guard consume(UInt8(ascii: "\\")), consume(UInt8(ascii: "u")), let low = hex4(),
                                (0xDC00...0xDFFF).contains(low)
                            else { return nil }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let unicode = Unicode.Scalar(scalar) else { return nil }
                        utf8.append(contentsOf: Array(String(Character(unicode)).utf8))
                    default:
                        return nil
                    }
                default:
                    if byte < 0x20 { return nil }
                    utf8.append(byte)
                }
            }
            return nil
        }

        /// `bytes` as text, or nil when they are not UTF-8. JSONDecoder rejects a file with a
        /// byte that is not (RFC 8259 §8.1), where `String(decoding:as:)` would read U+FFFD in its
        /// place: a corrupt file would then be read as an entry with another URL or key.
        private static func validString(_ bytes: UnsafeBufferPointer<UInt8>) -> String? {
            if bytes.contains(where: { $0 >= 0x80 }) {
                var parser = Unicode.UTF8.ForwardParser()
                var iterator = bytes.makeIterator()
                scalars: while true {
                    switch parser.parseScalar(from: &iterator) {
                    case .valid: continue
                    case .emptyInput: break scalars
                    case .error: return nil
                    }
                }
            }
            return String(decoding: bytes, as: UTF8.self)
        }

        private mutating func hex4() -> UInt32? {
            guard position + 4 <= bytes.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[position]
                position += 1
                let digit: UInt32
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
                default: return nil
                }
                value = value << 4 | digit
            }
            return value
        }

        /// A number as JSON writes it (RFC 8259 §6: `-? (0 | [1-9] digits) [. digits] [e [+-] digits]`).
        /// Anything else `Double(_:)` would also read — a leading zero (`06400`), a bare point
        /// (`1.`), a sign in front (`+1`) — is not JSON, and JSONDecoder, the authority, rejects it.
        private mutating func number() -> Double? {
            let start = position
            _ = consume(UInt8(ascii: "-"))
            if !consume(UInt8(ascii: "0")) {
                guard position < bytes.count, (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(bytes[position]) else { return nil }
                skipDigits()
            }
            if consume(UInt8(ascii: ".")) {
                guard skipDigits() > 0 else { return nil }
            }
            if consume(UInt8(ascii: "e")) || consume(UInt8(ascii: "E")) {
                _ = consume(UInt8(ascii: "+")) || consume(UInt8(ascii: "-"))
                guard skipDigits() > 0 else { return nil }
            }
            return Self.parseDouble(bytes[start..<position])
        }

        /// Moves past ASCII digits; how many there were.
        @discardableResult
        private mutating func skipDigits() -> Int {
            let start = position
            while position < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[position]) { position += 1 }
            return position - start
        }

        /// The value of a JSON number; nil when `Double` cannot hold it — past its range (`1e400`,
        /// which `Double(_:)` reads as infinity) or so small that it rounds to zero (`1e-400`) —
        /// since JSONDecoder rejects both.
        private static func parseDouble(_ slice: Slice<UnsafeBufferPointer<UInt8>>) -> Double? {
            guard !slice.isEmpty, slice.count < 64,
                let value = Double(String(decoding: UnsafeBufferPointer(rebasing: slice), as: UTF8.self)), value.isFinite
            else { return nil }
            if value == 0 {
                let mantissa = slice.prefix { $0 != UInt8(ascii: "e") && $0 != UInt8(ascii: "E") }
                guard mantissa.allSatisfy({ !(UInt8(ascii: "1")...UInt8(ascii: "9")).contains($0) }) else { return nil }
            }
            return value
        }

        private mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard position + count <= bytes.count else { return false }
            for offset in 0..<count where bytes[position + offset] != word.utf8Start[offset] { return false }
            position += count
            return true
        }

        private mutating func consume(_ byte: UInt8) -> Bool {
            guard position < bytes.count, bytes[position] == byte else { return false }
            position += 1
            return true
        }

        private mutating func skipWhitespace() {
            while position < bytes.count {
                switch bytes[position] {
                case 0x20, 0x09, 0x0A, 0x0D: position += 1
                default: return
                }
            }
        }
    }
}
