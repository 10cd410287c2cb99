import Retry

/// A value filled at most once (later fills are ignored) and awaited by one waiter.
final class OneShot<Value: Sendable>: Sendable {
    private struct State: Sendable {
        var value: Value?
        var waiter: CheckedContinuation<Value, Never>?
    }

    private let state = Locked(State())

    /// Fills the box unless it is already full; wakes the waiter.
    func fill(_ value: Value) {
        let waiter = state.withLock { state -> CheckedContinuation<Value, Never>? in
            guard state.value == nil else { return nil }
            state.value = value
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: value)
    }

    /// The value, once filled.
    func value() async -> Value {
        await withCheckedContinuation { (continuation: CheckedContinuation<Value, Never>) in
            let ready = state.withLock { state -> Value? in
                if let value = state.value { return value }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
