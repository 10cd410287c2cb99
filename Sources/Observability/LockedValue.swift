#if canImport(os)
import os
#else
import Synchronization
#endif

/// A value guarded by a lock: Observability's own copy of Retry's package-internal `Locked`.
///
/// A generic type from another module cannot be specialised or inlined into this one, so
/// `Locked.withLock` from here would run unspecialised generic code; this module-internal copy
/// compiles down to the lock calls and the field updates. It guards the collector's rarely taken
/// locks (endpoint registry, thread ordinals); the per-event locks are `LockStripes`.
///
/// On Apple platforms it wraps `OSAllocatedUnfairLock` (iOS 16 / macOS 13), elsewhere
/// `Synchronization.Mutex`, so the deployment targets stay below iOS 18. Critical sections are
/// short and never `await`.
final class LockedValue<State: Sendable>: @unchecked Sendable {
    // @unchecked Sendable: `state` is only reached through `withLock`, i.e. by one thread at a
    // time while it holds the lock; no reference to it escapes a critical section.
    #if canImport(os)
    private let lock: OSAllocatedUnfairLock<State>
    #else
    private let lock: Mutex<State>
    #endif

    init(_ initial: State) {
        #if canImport(os)
        lock = OSAllocatedUnfairLock(uncheckedState: initial)
        #else
        lock = Mutex(initial)
        #endif
    }

    /// Runs `body` with exclusive access to the state.
    @inline(__always)
    func withLock<R>(_ body: (inout State) throws -> R) rethrows -> R {
        #if canImport(os)
        return try lock.withLockUnchecked(body)
        #else
        return try lock.withLock { state in try body(&state) }
        #endif
    }
}
