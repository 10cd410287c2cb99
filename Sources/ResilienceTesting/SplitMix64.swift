@_spi(ResilienceCore) import ResilienceCore

/// SplitMix64 (Steele, Lea & Flood): a tiny seeded random number generator, so a test that draws
/// "random" jitter, inputs or schedules draws the same values on every run and fails the same way
/// twice.
///
/// ```swift
/// var generator = SplitMix64(seed: 42)
/// let delay = policy.delay(forAttempt: 0, using: &generator)
/// ```
///
/// The same generator `FaultInjectingSession` and the simulation draw from: one seed gives the
/// same values in a test as in the code under it.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var generator: SeededGenerator

    public init(seed: UInt64) {
        generator = SeededGenerator(seed: seed)
    }

    public mutating func next() -> UInt64 {
        generator.next()
    }
}
