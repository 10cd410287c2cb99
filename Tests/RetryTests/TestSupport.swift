@testable import Retry

/// SplitMix64 (Steele, Lea & Flood): a tiny seeded generator, so jitter draws repeat run to run.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Errors thrown by operations under test.
enum TestError: Error, Equatable {
    case transient(attempt: Int)
    case permanent
}

/// A thread-safe append-only log, readable from the test while the code under test runs elsewhere.
final class Log<Element: Sendable>: Sendable {
    private let entries = Locked<[Element]>([])

    func append(_ element: Element) {
        entries.withLock { $0.append(element) }
    }

    var values: [Element] {
        entries.withLock { $0 }
    }

    var count: Int {
        entries.withLock { $0.count }
    }
}

/// A custom policy that answers from a script: `answers[attempt]`, or `nil` past the end.
struct ScriptedPolicy: RetryPolicy {
    let answers: [Double]

    func delay(forAttempt attempt: Int) -> Double? {
        answers.indices.contains(attempt) ? answers[attempt] : nil
    }
}
