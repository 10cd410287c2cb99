@_spi(ResilienceCore) import ResilienceCore

@testable import Retry

/// Errors thrown by operations under test.
enum TestError: Error, Equatable {
    case transient(attempt: Int)
    case permanent
}

/// A custom policy that answers from a script: `answers[attempt]`, or `nil` past the end.
struct ScriptedPolicy: RetryPolicy {
    let answers: [Double]

    func delay(forAttempt attempt: Int) -> Double? {
        answers.indices.contains(attempt) ? answers[attempt] : nil
    }
}
