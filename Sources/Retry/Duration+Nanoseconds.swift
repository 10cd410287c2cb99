extension Duration {
    /// The duration in whole nanoseconds (rounded toward zero), saturating at `Int64`'s bounds
    /// instead of trapping: the limiters and the breaker's time window do their arithmetic on
    /// these integers so that refills and bucket edges are exact.
    var saturatingNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (total, overflowAdding) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflowAdding { return seconds < 0 ? .min : .max }
        return total
    }
}
