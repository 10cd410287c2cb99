#if canImport(os)
import os
#elseif canImport(Synchronization)
import Synchronization
#endif

/// A function to keep as a lock's state: `Locked<LockedFunction<@Sendable () -> Void>?>`, not the
/// closure type itself as the state. Stored directly, a closure is reabstracted through
/// `withLock`'s `inout` on every `withLock { $0 }`, and an unoptimized build wraps it in two more
/// thunks each time: the nth call runs through 2n of them (quadratic, then a stack overflow, as in
/// the queue simulation's seed 64). A struct's field is stored as it is. `.ci/run` fails on a
/// closure stored directly.
package struct LockedFunction<Function: Sendable>: Sendable {
    package let function: Function
    package init(_ function: Function) { self.function = function }
}

/// A value guarded by a lock, for the few hot paths where an actor hop per call is too costly
/// (retry budgets, circuit breakers, single-flight waiter bookkeeping, metrics).
///
/// On Apple platforms this wraps `OSAllocatedUnfairLock` (iOS 16 / macOS 13), elsewhere
/// `Synchronization.Mutex`, so the package keeps its deployment targets below iOS 18.
/// Critical sections must be short and must never `await`.
///
/// The one part of ResilienceCore that is not `package`: it and `WaiterList` are SPI
/// (`@_spi(ResilienceCore) public`), so an outside `import ResilienceCore` sees nothing, and the
/// package's other modules still get `withLock` specialised for their state (compiled down to the
/// lock calls and the field updates). Swift 6.3 does not specialise `@inlinable` *package*
/// declarations across modules: with both at `package` access the plain engine ran 41 996
/// instructions a request against 25 466 (callgrind, `Benchmarks/Scripts/plain-engine-at.sh`), and
/// one `withLock` on a small struct took 32 ns against 12 ns.
@_spi(ResilienceCore) public final class Locked<State: Sendable>: @unchecked Sendable {
    // @unchecked Sendable: every access to `state` goes through the lock below; `State` values
    // are only ever touched inside `withLock`, one thread at a time.
    #if canImport(os)
    @usableFromInline let lock: OSAllocatedUnfairLock<State>
    #else
    @usableFromInline let lock: Mutex<State>
    #endif

    @inlinable
    public init(_ initial: State) {
        #if canImport(os)
        lock = OSAllocatedUnfairLock(uncheckedState: initial)
        #else
        lock = Mutex(initial)
        #endif
    }

    /// Runs `body` with exclusive access to the state.
    @inlinable @inline(__always)
    public func withLock<R>(_ body: (inout State) throws -> R) rethrows -> R {
        #if canImport(os)
        return try lock.withLockUnchecked(body)
        #else
        return try lock.withLock { state in try body(&state) }
        #endif
    }
}
