/// SplitMix64 (Steele, Lea & Flood): a tiny seeded random number generator, so a test that draws
/// "random" jitter, inputs or schedules draws the same values on every run and fails the same way
/// twice.
///
/// ```swift
/// var generator = SplitMix64(seed: 42)
/// let delay = policy.delay(forAttempt: 0, using: &generator)
/// ```
///
/// Lives here so non-test modules can draw from it too (`FaultInjectingSession`'s seeded faults);
/// `ResilienceTesting` publishes it under the same name.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) {
        state = seed
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
