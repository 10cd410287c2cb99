/// SplitMix64 (Steele, Lea & Flood): a tiny seeded random number generator, so whatever draws from
/// it (`FaultInjectingSession`'s seeded faults, the simulation's schedule, a test's jitter) draws
/// the same values on every run. `ResilienceTesting` publishes it as `SplitMix64`.
package struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    package init(seed: UInt64) {
        state = seed
    }

    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
