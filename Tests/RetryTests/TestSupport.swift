@testable import Retry
import ResilienceCore

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

/// Yields until `condition` holds (other tasks run meanwhile; no wall-clock waiting). The suite's
/// time limit ends a test whose condition never comes true.
func yieldUntil(_ condition: () -> Bool) async {
    while !condition() {
        if Task.isCancelled { return }  // the time limit: the test's own expectations then fail
        await Task.yield()
    }
}
