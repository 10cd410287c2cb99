/// Runs `operation`, retrying failures as `policy` says, sleeping on `clock` between attempts.
///
/// - `operation` receives the zero-based attempt number (0 for the first call).
/// - After a failure, `shouldRetry` decides whether the error is worth another try (by default
///   everything except `CancellationError`); then `policy.delay(forAttempt:)` gives the wait, or
///   `nil` to stop. The delay is sanitised (see `RetryPolicyDelay.sanitized`): negative or NaN
///   waits become zero and huge or infinite ones are capped at `maximumDelay`.
/// - When retrying stops, the last error is rethrown unchanged.
/// - Cancellation: a cancelled task does not start another attempt, and a sleep between
///   attempts ends at once with `CancellationError`.
///
/// ```swift
/// let value = try await retrying(policy: ExponentialRetryPolicy(maxRetries: 5, jitter: .full)) { attempt in
///     try await fetchSomething()
/// }
/// ```
public func retrying<T>(
    policy: some RetryPolicy,
    clock: some Clock<Duration> = ContinuousClock(),
    maximumDelay: Duration = RetryPolicyDelay.defaultMaximum,
    isolation: isolated (any Actor)? = #isolation,
    shouldRetry: (any Error) -> Bool = { !($0 is CancellationError) },
    operation: (_ attempt: Int) async throws -> T
) async throws -> T {
    var attempt = 0
    while true {
        try Task.checkCancellation()
        do {
            return try await operation(attempt)
        } catch {
            guard shouldRetry(error), !Task.isCancelled,
                let seconds = policy.delay(forAttempt: attempt)
            else { throw error }
            let delay = RetryPolicyDelay.sanitized(seconds, maximum: maximumDelay)
            if delay > .zero {
                try await clock.sleep(until: clock.now.advanced(by: delay), tolerance: nil)
            }
            attempt += 1
        }
    }
}
