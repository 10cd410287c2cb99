@_spi(ResilienceCore) import ResilienceCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A small number for the calling OS thread, handed out in order of first use (0, 1, 2, …).
///
/// The collector picks its statistics shard with it: threads that record get consecutive
/// ordinals, so with at least as many shards as threads each thread has a shard of its own and
/// its counters stay in its own core's cache. (A hash of the thread id would put two of four
/// threads on one of eight shards more than half the time.) The ordinal lives in a pthread key,
/// read with one `pthread_getspecific` per event.
enum ThreadOrdinal {
    private static let key: pthread_key_t? = {
        var key = pthread_key_t()
        return pthread_key_create(&key, nil) == 0 ? key : nil
    }()

    private static let next = Locked(0)

    /// The calling thread's ordinal (0 when thread-specific storage is unavailable).
    static var current: Int {
        guard let key else { return 0 }
        if let stored = pthread_getspecific(key) {
            return Int(bitPattern: stored) &- 1
        }
        let ordinal = next.withLock { next -> Int in
            defer { next &+= 1 }
            return next
        }
        // Stored as ordinal + 1 so that a thread without a value (nil) is told apart from ordinal 0.
        _ = pthread_setspecific(key, UnsafeRawPointer(bitPattern: ordinal &+ 1))
        return ordinal
    }
}
