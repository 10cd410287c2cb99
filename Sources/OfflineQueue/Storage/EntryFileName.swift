import Foundation

/// The file name of an entry with this id: `uuidString` + `.json`, written without `uuidString`.
///
/// On Linux, Foundation formats `uuidString` with `snprintf`, and the store names a file at every
/// open (to check each name is canonical) and at every removal: that formatting was a visible
/// share of a replayed entry's CPU (Benchmarks/README.md, "OfflineQueue"). This writes the same
/// 36 upper-case characters from a table.
enum EntryFileName {
    private static let digits: [UInt8] = Array("0123456789ABCDEF".utf8)

    /// `"\(id.uuidString).json"`.
    static func of(_ id: UUID) -> String {
        let bytes = id.uuid
        return String(unsafeUninitializedCapacity: 41) { buffer in
            var at = 0
            func put(_ byte: UInt8) {
                buffer[at] = digits[Int(byte >> 4)]
                buffer[at + 1] = digits[Int(byte & 0x0F)]
                at += 2
            }
            func dash() {
                buffer[at] = UInt8(ascii: "-")
                at += 1
            }
            put(bytes.0); put(bytes.1); put(bytes.2); put(bytes.3)
            dash()
            put(bytes.4); put(bytes.5)
            dash()
            put(bytes.6); put(bytes.7)
            dash()
            put(bytes.8); put(bytes.9)
            dash()
            put(bytes.10); put(bytes.11); put(bytes.12); put(bytes.13); put(bytes.14); put(bytes.15)
            for byte in ".json".utf8 {
                buffer[at] = byte
                at += 1
            }
            return at
        }
    }
}
