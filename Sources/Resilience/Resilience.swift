@_exported import Auth
@_exported import Drainer
// The umbrella module: `import Resilience` brings every layer in, and Foundation with it (`URL`,
// `Data`, `URLRequest`, `HTTPURLResponse`): on Linux the last two live in FoundationNetworking, so
// code written for SwiftResilience compiles with only `import Resilience` on every platform.
@_exported import Foundation
@_exported import Observability
@_exported import OfflineFirst
@_exported import OfflineQueue
@_exported import Reachability
@_exported import RequestEngine
@_exported import ResponseCache
@_exported import Retry

#if canImport(FoundationNetworking)
@_exported import FoundationNetworking
#endif
