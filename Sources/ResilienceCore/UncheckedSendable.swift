/// Wraps a value the compiler cannot prove Sendable, where the code using it guarantees exclusive
/// access — e.g. a result buffer whose slots are each written by exactly one iteration of
/// `DispatchQueue.concurrentPerform` and read only after it returns.
package struct UncheckedSendable<Value>: @unchecked Sendable {
    // @unchecked Sendable: callers guarantee that no two threads touch the same part of `value`
    // at once (see the type's comment); the wrapper adds no access of its own.
    package let value: Value
    package init(_ value: Value) { self.value = value }
}
