// The engine's API is built on the Retry layer's types (RetryPolicy, RetryBudget, CircuitBreaker),
// so `import RequestEngine` brings them along.
@_exported import Retry
