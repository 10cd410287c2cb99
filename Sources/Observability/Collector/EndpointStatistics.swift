import Foundation

/// What one statistics shard has counted for one endpoint. Updated under the shard's lock; once
/// its lists exist (the first success, the first outcome of each kind), updates never allocate.
struct EndpointStatistics: Sendable {
    var started: UInt64 = 0
    var succeeded: UInt64 = 0
    var failed: UInt64 = 0
    var retries: UInt64 = 0
    var deduplicated: UInt64 = 0
    /// Sum of success durations, in nanoseconds.
    var successNanoseconds: UInt64 = 0
    /// Successes per `DurationBuckets` bucket (not cumulative); empty until the first success.
    var durationBuckets: [UInt64] = []
    var histogram = LogLinearHistogram()
    var outcomes = OutcomeCounts()

    @inline(__always)
    mutating func recordSuccess(statusCode: Int, duration: TimeInterval) {
        succeeded &+= 1
        let nanoseconds = DurationBuckets.nanoseconds(duration)
        successNanoseconds &+= nanoseconds
        if durationBuckets.isEmpty { durationBuckets = Array(repeating: 0, count: DurationBuckets.count) }
        durationBuckets[DurationBuckets.index(of: duration)] &+= 1
        histogram.record(nanoseconds)
        outcomes.increment(OutcomeKey(successStatus: statusCode))
    }

    @inline(__always)
    mutating func recordFailure(_ key: OutcomeKey) {
        failed &+= 1
        outcomes.increment(key)
    }

    /// Zeroes every count in place, keeping what is allocated.
    mutating func zero() {
        started = 0
        succeeded = 0
        failed = 0
        retries = 0
        deduplicated = 0
        successNanoseconds = 0
        durationBuckets.withUnsafeMutableBufferPointer { $0.update(repeating: 0) }
        histogram.zero()
        outcomes.zero()
    }
}

/// One endpoint's statistics summed over every shard, built by a snapshot.
struct EndpointAggregate: Sendable {
    var started: UInt64 = 0
    var succeeded: UInt64 = 0
    var failed: UInt64 = 0
    var retries: UInt64 = 0
    var deduplicated: UInt64 = 0
    var successNanoseconds: UInt64 = 0
    var durationBuckets = [UInt64](repeating: 0, count: DurationBuckets.count)
    var histogram = LogLinearHistogram()
    var outcomes: [OutcomeKey: UInt64] = [:]

    /// Whether anything was counted (endpoints without activity are left out of snapshots).
    var hasActivity: Bool { started + succeeded + failed + retries + deduplicated > 0 }

    mutating func add(_ statistics: EndpointStatistics) {
        started &+= statistics.started
        succeeded &+= statistics.succeeded
        failed &+= statistics.failed
        retries &+= statistics.retries
        deduplicated &+= statistics.deduplicated
        successNanoseconds &+= statistics.successNanoseconds
        for index in statistics.durationBuckets.indices {
            durationBuckets[index] &+= statistics.durationBuckets[index]
        }
        histogram.merge(statistics.histogram)
        statistics.outcomes.add(into: &outcomes)
    }

    mutating func add(_ other: EndpointAggregate) {
        started &+= other.started
        succeeded &+= other.succeeded
        failed &+= other.failed
        retries &+= other.retries
        deduplicated &+= other.deduplicated
        successNanoseconds &+= other.successNanoseconds
        for index in other.durationBuckets.indices {
            durationBuckets[index] &+= other.durationBuckets[index]
        }
        histogram.merge(other.histogram)
        for (key, count) in other.outcomes { outcomes[key, default: 0] &+= count }
    }
}
