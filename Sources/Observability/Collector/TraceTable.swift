import Foundation

/// Remembers which endpoint each request in flight belongs to, from its `started` event to its
/// `succeeded` or `failed` event (which carry only the trace id).
///
/// Fixed memory: `capacity` slots in lock stripes chosen by a hash of the trace id, each stripe a
/// 4-way set-associative table. An entry is removed by its terminal event. When all four slots of
/// a set are taken, the oldest entry of the set is evicted (and counted), so a sink that misses
/// terminal events, or more requests in flight than `capacity`, cannot grow memory: the terminal
/// events of evicted requests are then counted under the `__unknown__` endpoint.
final class TraceTable: Sendable {
    static let ways = 4

    let capacity: Int
    private let stripes: LockStripes<Stripe>
    private let stripeShift: UInt64
    private let setMask: Int

    struct Slot {
        var low: UInt64 = 0
        var high: UInt64 = 0
        /// The endpoint row; -1 marks an empty slot.
        var row: Int32 = -1
        /// The stripe's insertion clock when this entry was written (wrapping).
        var stamp: UInt32 = 0
    }

    struct Stripe {
        var slots: [Slot]
        var clock: UInt32 = 0
        var occupied = 0
        var evictions = 0
        private var padding = CacheLinePadding()

        init(slotCount: Int) {
            slots = Array(repeating: Slot(), count: slotCount)
        }
    }

    /// A table for `capacity` requests in flight (rounded up to a power of two, at least 4).
    init(capacity requested: Int) {
        var slots = 4
        while slots < requested, slots < 1 << 24 { slots <<= 1 }
        capacity = slots
        // Stripes of at least 64 slots, at most 64 stripes.
        var stripeCount = 1
        while stripeCount < 64, slots / (stripeCount * 2) >= 64 { stripeCount <<= 1 }
        let slotsPerStripe = slots / stripeCount
        stripes = LockStripes(count: stripeCount) { _ in Stripe(slotCount: slotsPerStripe) }
        stripeShift = UInt64(64 - stripeCount.trailingZeroBitCount)
        setMask = slotsPerStripe / Self.ways - 1
    }

    @inline(__always)
    private func locate(_ id: UUID) -> (stripe: Int, firstSlot: Int, low: UInt64, high: UInt64) {
        let (low, high) = withUnsafeBytes(of: id.uuid) { bytes in
            (bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self), bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        }
        let product = (low ^ 0x243F_6A88_85A3_08D3).multipliedFullWidth(by: high ^ 0x1319_8A2E_0370_7344)
        let hash = product.high ^ product.low
        let stripe = stripeShift >= 64 ? 0 : Int(truncatingIfNeeded: hash >> stripeShift)
        let set = Int(truncatingIfNeeded: hash) & setMask
        return (stripe, set * Self.ways, low, high)
    }

    /// Remembers `row` for trace `id` (replacing an earlier entry for the same id).
    @inline(__always)
    func insert(_ id: UUID, row: Int32) {
        let (stripe, first, low, high) = locate(id)
        stripes.withLock(stripe) { stripe in
            stripe.clock &+= 1
            let clock = stripe.clock
            var free = -1
            var oldest = first
            var oldestAge: UInt32 = 0
            for slot in first..<first + Self.ways {
                let entry = stripe.slots[slot]
                if entry.row < 0 {
                    if free < 0 { free = slot }
                    continue
                }
                if entry.low == low && entry.high == high {
                    stripe.slots[slot].row = row
                    stripe.slots[slot].stamp = clock
                    return
                }
                let age = clock &- entry.stamp
                if age >= oldestAge {
                    oldestAge = age
                    oldest = slot
                }
            }
            if free >= 0 {
                stripe.occupied += 1
                stripe.slots[free] = Slot(low: low, high: high, row: row, stamp: clock)
            } else {
                stripe.evictions += 1
                stripe.slots[oldest] = Slot(low: low, high: high, row: row, stamp: clock)
            }
        }
    }

    /// The row remembered for `id`, if any.
    @inline(__always)
    func row(of id: UUID) -> Int32? {
        let (stripe, first, low, high) = locate(id)
        return stripes.withLock(stripe) { stripe -> Int32? in
            for slot in first..<first + Self.ways {
                let entry = stripe.slots[slot]
                if entry.row >= 0 && entry.low == low && entry.high == high { return entry.row }
            }
            return nil
        }
    }

    /// Forgets `id` and returns its row, if it was remembered.
    @inline(__always)
    func remove(_ id: UUID) -> Int32? {
        let (stripe, first, low, high) = locate(id)
        return stripes.withLock(stripe) { stripe -> Int32? in
            for slot in first..<first + Self.ways {
                let entry = stripe.slots[slot]
                if entry.row >= 0 && entry.low == low && entry.high == high {
                    stripe.slots[slot].row = -1
                    stripe.occupied -= 1
                    return entry.row
                }
            }
            return nil
        }
    }

    /// Requests remembered now, and entries evicted so far.
    func counts() -> (tracked: Int, evicted: Int) {
        (0..<stripes.count).reduce(into: (0, 0)) { totals, index in
            let (occupied, evictions) = stripes.withLock(index) { ($0.occupied, $0.evictions) }
            totals.0 += occupied
            totals.1 += evictions
        }
    }

    /// Zeroes the eviction count (entries stay, so requests in flight keep their endpoint).
    func resetEvictions() {
        for index in 0..<stripes.count { stripes.withLock(index) { $0.evictions = 0 } }
    }
}
