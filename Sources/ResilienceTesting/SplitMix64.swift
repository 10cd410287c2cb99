import ResilienceCore

/// SplitMix64 (Steele, Lea & Flood): a tiny seeded random number generator, so a test that draws
/// "random" jitter, inputs or schedules draws the same values on every run and fails the same way
/// twice.
///
/// ```swift
/// var generator = SplitMix64(seed: 42)
/// let delay = policy.delay(forAttempt: 0, using: &generator)
/// ```
///
/// Defined in the package's core (so `FaultInjectingSession` draws from the same generator) and
/// published here under its usual name.
public typealias SplitMix64 = ResilienceCore.SplitMix64
