#if canImport(os)
import os
#else
import Synchronization
#endif

/// A fixed number of independently locked values in one allocation: the collector's per-thread
/// statistics shards and its trace-table stripes, each taken once or twice per event.
///
/// Why not an array of lock objects: reading a class reference out of an array retains and
/// releases it, two atomic read-modify-writes on the object's header per lock taken, on a cache
/// line that every recording thread writes. Here the locks (a `Synchronization.Mutex` per value)
/// sit in memory that the `LockStripes` object owns for its whole life and are reached by address,
/// with no reference counting. Each value should end with `CacheLinePadding` so that neighbours'
/// lock words do not share a cache line.
///
/// On Apple platforms the values are `OSAllocatedUnfairLock`s in an array (iOS 16 / macOS 13;
/// `Mutex` needs iOS 18).
final class LockStripes<State: Sendable>: @unchecked Sendable {
    // @unchecked Sendable: the values are only reached through `withLock`, one thread at a time per
    // value while it holds that value's lock. On Linux `locks` points to `count` initialised
    // mutexes that live until deinit, and the pointer itself never changes.
    let count: Int
    #if canImport(os)
    private let locks: [OSAllocatedUnfairLock<State>]
    #else
    private let locks: UnsafeMutablePointer<Mutex<State>>
    #endif

    /// `count` values (at least 1), the value at index `i` being `make(i)`.
    init(count requested: Int, _ make: (Int) -> State) {
        count = max(1, requested)
        #if canImport(os)
        locks = (0..<count).map { OSAllocatedUnfairLock(uncheckedState: make($0)) }
        #else
        locks = UnsafeMutablePointer<Mutex<State>>.allocate(capacity: count)
        for index in 0..<count {
            (locks + index).initialize(to: Mutex(make(index)))
        }
        #endif
    }

    deinit {
        #if !canImport(os)
        locks.deinitialize(count: count)
        locks.deallocate()
        #endif
    }

    /// Runs `body` with exclusive access to the value at `index` (0 ..< count).
    @inline(__always)
    func withLock<R>(_ index: Int, _ body: (inout State) throws -> R) rethrows -> R {
        precondition(index >= 0 && index < count, "LockStripes index out of range")
        #if canImport(os)
        return try locks[index].withLockUnchecked(body)
        #else
        return try locks[index].withLock { state in try body(&state) }
        #endif
    }
}

/// 128 bytes that keep the hot fields of one lock-striped object off the cache lines of the
/// objects allocated next to it (false sharing between recording threads).
struct CacheLinePadding {
    private var words:
        (
            UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64,
            UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64
        ) = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}
