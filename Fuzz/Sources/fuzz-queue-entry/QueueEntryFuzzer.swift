import Foundation
import FuzzSupport

@testable import OfflineQueue

/// Queue entry files (`<id>.json`), read at open by `QueueEntryDecoder` with `JSONDecoder` behind it.
///
/// Contract: no input crashes either reader; whatever the fast reader accepts, `JSONDecoder` (the
/// authority on what is a valid entry) accepts too and reads the same entry; an entry either
/// reader returns is written by the store's encoder in a form `JSONDecoder` reads back unchanged
/// and the fast reader reads back unchanged or leaves to `JSONDecoder`; `parseUUID` agrees with
/// `UUID(uuidString:)` on what it accepts.
@main
enum QueueEntryFuzzer {
    static func main() {
        FuzzDriver.run { data, size in
            QueueEntryFuzzer.check(FuzzInput(data, size))
            return 0
        }
    }

    static func check(_ input: FuzzInput) {
        let fast = QueueEntryDecoder.decode(input.bytes)
        let slow = try? QueueEntry.makeDecoder().decode(QueueEntry.self, from: Data(input.bytes))
        if let fast {
            fuzzCheck(slow != nil, "the fast reader accepted an entry JSONDecoder rejects: \(canonical(fast))")
            if let slow {
                fuzzCheck(canonical(fast) == canonical(slow), "the readers disagree:\n fast \(canonical(fast))\n JSON \(canonical(slow))")
            }
        }
        for entry in [fast, slow].compactMap({ $0 }) {
            guard let written = try? QueueEntry.makeEncoder().encode(entry) else {
                fuzzCheck(false, "the store's encoder cannot write an entry it read: \(canonical(entry))")
                return
            }
            let reread = try? QueueEntry.makeDecoder().decode(QueueEntry.self, from: written)
            fuzzCheck(reread.map(canonical) == canonical(entry), "JSONDecoder does not read back what was written: \(canonical(entry))")
            if let fastReread = QueueEntryDecoder.decode(written) {
                fuzzCheck(canonical(fastReread) == canonical(entry), "the fast reader misreads what was written: \(canonical(entry))")
            }
        }
        let text = input.text
        if let id = QueueEntryDecoder.parseUUID(text) {
            fuzzCheck(UUID(uuidString: text) == id, "parseUUID accepts \(text) as \(id), Foundation reads \(String(describing: UUID(uuidString: text)))")
        }
    }

    /// The entry as sorted JSON: equal entries give equal text, NaN included.
    static func canonical(_ entry: QueueEntry) -> String {
        let encoder = QueueEntry.makeEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let data = try? encoder.encode(entry) else { return "unencodable \(entry)" }
        return String(decoding: data, as: UTF8.self)
    }
}
