// The umbrella module: `import Resilience` brings every layer in.
@_exported import Auth
@_exported import Drainer
@_exported import Observability
@_exported import OfflineQueue
@_exported import RequestEngine
@_exported import Retry
