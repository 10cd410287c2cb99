/// A fixed-memory histogram of non-negative integers (here: nanoseconds) with a relative error
/// of at most 1/128 (0.79 %) for every value it reports.
///
/// Layout (log-linear, as in HdrHistogram): values below 64 have a bucket each; every power of
/// two above, `[2^k, 2^(k+1))` for k = 6…42, is split into 64 equal buckets of width 2^(k-6).
/// A bucket's reported value is its midpoint, at most half a bucket width, 2^(k-7), from any value
/// in it, and every value in it is at least 2^k: hence the 1/128 bound. Values above
/// `maximumValue` (2^43 − 1 ns, about 2 h 26 min) are counted as `maximumValue`.
///
/// Memory is bounded by 38 blocks of 64 counters (19.5 KiB). A block is allocated the first time
/// a value lands in it, so a histogram whose values span three octaves holds three blocks; once
/// its blocks exist, recording never allocates.
struct LogLinearHistogram: Sendable, Equatable {
    static let subBucketBits = 6
    static let subBucketCount = 1 << subBucketBits
    /// The largest value kept as is.
    static let maximumValue: UInt64 = (1 << 43) - 1
    /// Block 0 holds 0…63; block b ≥ 1 holds the octave [2^(b+5), 2^(b+6)).
    static let blockCount = 38

    private(set) var blocks: [[UInt64]] = []
    private(set) var count: UInt64 = 0
    private(set) var minimum: UInt64 = .max
    private(set) var maximum: UInt64 = 0

    /// The block and the bucket within it that `value` (≤ `maximumValue`) falls in.
    @inline(__always)
    static func location(of value: UInt64) -> (block: Int, bucket: Int) {
        if value < UInt64(subBucketCount) { return (0, Int(value)) }
        let octave = 63 - value.leadingZeroBitCount
        let shift = UInt64(octave - subBucketBits)
        return (octave - subBucketBits + 1, Int((value >> shift) & UInt64(subBucketCount - 1)))
    }

    /// The value reported for a bucket: its midpoint (rounded down).
    static func representativeValue(block: Int, bucket: Int) -> UInt64 {
        if block == 0 { return UInt64(bucket) }
        let shift = UInt64(block - 1)
        let lower = UInt64(subBucketCount + bucket) << shift
        let width = UInt64(1) << shift
        return lower + (width - 1) / 2
    }

    /// Counts one value (clamped to `maximumValue`).
    @inline(__always)
    mutating func record(_ rawValue: UInt64) {
        let value = Swift.min(rawValue, Self.maximumValue)
        let (block, bucket) = Self.location(of: value)
        if blocks.isEmpty { blocks = Array(repeating: [], count: Self.blockCount) }
        if blocks[block].isEmpty { blocks[block] = Array(repeating: 0, count: Self.subBucketCount) }
        blocks[block][bucket] &+= 1
        count &+= 1
        if value < minimum { minimum = value }
        if value > maximum { maximum = value }
    }

    /// Adds every count of `other` to this histogram.
    mutating func merge(_ other: LogLinearHistogram) {
        guard other.count > 0 else { return }
        if blocks.isEmpty { blocks = Array(repeating: [], count: Self.blockCount) }
        for block in other.blocks.indices where !other.blocks[block].isEmpty {
            // Always into a block of our own: sharing `other`'s storage would make its next
            // `record` copy the block (an allocation on the recording path).
            if blocks[block].isEmpty { blocks[block] = Array(repeating: 0, count: Self.subBucketCount) }
            for bucket in 0..<Self.subBucketCount {
                blocks[block][bucket] &+= other.blocks[block][bucket]
            }
        }
        count &+= other.count
        minimum = Swift.min(minimum, other.minimum)
        maximum = Swift.max(maximum, other.maximum)
    }

    /// Zeroes every count, keeping the allocated blocks (so recording after a reset does not allocate).
    mutating func zero() {
        for block in blocks.indices where !blocks[block].isEmpty {
            blocks[block].withUnsafeMutableBufferPointer { $0.update(repeating: 0) }
        }
        count = 0
        minimum = .max
        maximum = 0
    }

    /// The nearest-rank percentile: the value of rank ⌈fraction × count⌉ (at least 1) in ascending
    /// order, reported as its bucket's midpoint and clamped to the exact minimum and maximum seen.
    /// `nil` when empty.
    func percentile(_ fraction: Double) -> UInt64? {
        guard count > 0 else { return nil }
        let clamped = Swift.min(Swift.max(fraction, 0), 1)
        let wanted = Swift.max(1, UInt64(Swift.min((clamped * Double(count)).rounded(.up), Double(count))))
        if wanted == 1 { return minimum }
        if wanted == count { return maximum }
        var seen: UInt64 = 0
        for block in blocks.indices where !blocks[block].isEmpty {
            for bucket in 0..<Self.subBucketCount {
                seen &+= blocks[block][bucket]
                if seen >= wanted {
                    let value = Self.representativeValue(block: block, bucket: bucket)
                    return Swift.min(Swift.max(value, minimum), maximum)
                }
            }
        }
        return maximum
    }
}
