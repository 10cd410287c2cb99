@testable import Retry
import ResilienceCore

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
