import Foundation
import ResilienceTesting
import Testing

@testable import Observability

@Suite("LogLinearHistogram and duration buckets")
struct LogLinearHistogramTests {
    /// Nearest rank over an ascending array, the definition the histogram uses.
    private func exactPercentile(_ sorted: [UInt64], _ fraction: Double) -> UInt64 {
        let rank = max(1, Int((fraction * Double(sorted.count)).rounded(.up)))
        return sorted[min(rank, sorted.count) - 1]
    }

    @Test(arguments: ["log-uniform 50 µs…60 s", "exponential mean 80 ms", "bimodal 3 ms / 900 ms", "uniform 0…2 ms"])
    func percentilesOfOneHundredThousandRandomSamplesAreWithinOnePercentOfAnExactSort(distribution: String) {
        var generator = SplitMix64(seed: UInt64(distribution.utf8.count) &* 7919)
        var histogram = LogLinearHistogram()
        var samples: [UInt64] = []
        samples.reserveCapacity(100_000)
        for _ in 0..<100_000 {
            let seconds: Double
            switch distribution {
            case "log-uniform 50 µs…60 s":
                seconds = exp(Double.random(in: log(50e-6)...log(60), using: &generator))
            case "exponential mean 80 ms":
                seconds = -0.080 * log(1 - Double.random(in: 0..<1, using: &generator))
            case "bimodal 3 ms / 900 ms":
                let base = Bool.random(using: &generator) ? 0.003 : 0.9
                seconds = base * (1 + Double.random(in: -0.2...0.2, using: &generator))
            default:
                seconds = Double.random(in: 0...0.002, using: &generator)
            }
            let nanoseconds = DurationBuckets.nanoseconds(seconds)
            samples.append(nanoseconds)
            histogram.record(nanoseconds)
        }
        samples.sort()
        for fraction in [0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0] {
            let exact = exactPercentile(samples, fraction)
            let estimate = histogram.percentile(fraction) ?? 0
            let error = relativeError(Double(estimate), Double(exact))
            #expect(error <= 0.01, "p\(fraction * 100): estimate \(estimate) ns, exact \(exact) ns, error \(error)")
        }
        #expect(histogram.count == 100_000)
        #expect(histogram.minimum == samples[0])
        #expect(histogram.maximum == samples[samples.count - 1])
    }

    @Test func everyBucketsReportedValueIsWithinOneOver128OfEveryValueInIt() {
        // Values around every power of two and bucket edge up to the maximum.
        var values: [UInt64] = Array(0...300)
        for octave in 6...42 {
            let base = UInt64(1) << UInt64(octave)
            for offset in [0, 1, base / 64 - 1, base / 64, base / 3, base / 2, base - 1] {
                values.append(base + offset)
            }
        }
        for value in values where value <= LogLinearHistogram.maximumValue {
            let (block, bucket) = LogLinearHistogram.location(of: value)
            let reported = LogLinearHistogram.representativeValue(block: block, bucket: bucket)
            let error = relativeError(Double(reported), Double(value))
            #expect(error <= 1.0 / 128, "value \(value) reported as \(reported)")
            #expect(LogLinearHistogram.location(of: reported) == (block, bucket))
        }
    }

    @Test func mergingHistogramsEqualsRecordingEverythingInOne() {
        var generator = SplitMix64(seed: 3)
        var all = LogLinearHistogram(), left = LogLinearHistogram(), right = LogLinearHistogram()
        for index in 0..<5_000 {
            let value = UInt64.random(in: 0...5_000_000_000, using: &generator)
            all.record(value)
            if index.isMultiple(of: 3) { left.record(value) } else { right.record(value) }
        }
        var merged = LogLinearHistogram()
        merged.merge(left)
        merged.merge(right)
        #expect(merged == all)
        // The merge copied counts: recording into a source afterwards leaves the merge alone.
        left.record(1)
        #expect(merged == all)
    }

    @Test func emptyZeroedAndOversizedHistograms() {
        var histogram = LogLinearHistogram()
        #expect(histogram.percentile(0.5) == nil)
        histogram.record(UInt64.max)
        #expect(histogram.maximum == LogLinearHistogram.maximumValue)
        #expect(histogram.percentile(0.99) == LogLinearHistogram.maximumValue)
        histogram.zero()
        #expect(histogram.count == 0)
        #expect(histogram.percentile(0.5) == nil)
        histogram.record(0)
        #expect(histogram.percentile(0.5) == 0)
    }

    @Test func durationBucketIndexIsTheFirstBoundAtOrAboveTheValue() {
        var probes: [Double] = [0, -1, .nan, .infinity, 1e-12, 11, 1e9]
        for bound in DurationBuckets.upperBounds {
            probes += [bound, bound.nextUp, bound.nextDown, bound * 0.999, bound * 1.001]
        }
        for seconds in probes {
            let linear = DurationBuckets.upperBounds.firstIndex { seconds <= $0 } ?? DurationBuckets.upperBounds.count
            let expected = seconds > 0 ? linear : 0  // zero, negative and NaN durations count as 0 s
            #expect(DurationBuckets.index(of: seconds) == expected, "\(seconds)")
        }
        #expect(DurationBuckets.labels.count == DurationBuckets.upperBounds.count)
        #expect(DurationBuckets.labels.map { Double($0) } == DurationBuckets.upperBounds.map { Optional($0) })
    }

    @Test func durationsConvertToNanosecondsSafely() {
        #expect(DurationBuckets.nanoseconds(0.42) == 420_000_000)
        #expect(DurationBuckets.nanoseconds(-3) == 0)
        #expect(DurationBuckets.nanoseconds(.nan) == 0)
        #expect(DurationBuckets.nanoseconds(.infinity) == 1 << 62)
    }
}
