import Foundation

extension RequestMetricsCollector {
    /// How a `RequestMetricsCollector` groups requests and how much memory it may use.
    public struct Configuration: Sendable {
        /// Turns a URL into the endpoint template requests are grouped by. Default:
        /// `.collapsingIdentifiers` (numeric, UUID and long hex segments become `{id}`).
        public var pathTemplate: PathTemplate
        /// How many distinct endpoints (method + template) get a row of their own. Requests of
        /// endpoints first seen after the cap is reached are counted under `METHOD __other__`.
        /// Default 100; at least 0.
        public var maximumEndpoints: Int
        /// How many requests in flight the collector can map from trace id to endpoint (rounded up
        /// to a power of two). Beyond that the oldest are forgotten and their terminal events count
        /// under `__unknown__` (see `RequestMetrics.evictedRequests`). Default 4096 (about 100 KiB).
        public var maximumTrackedRequests: Int
        /// How many statistics shards the recording threads spread over (rounded up to a power of
        /// two, 1…64). Default: the number of active processors, at most 16.
        public var shardCount: Int

        /// A configuration; every parameter has the default described on its property.
        public init(
            pathTemplate: PathTemplate = .collapsingIdentifiers,
            maximumEndpoints: Int = 100,
            maximumTrackedRequests: Int = 4096,
            shardCount: Int? = nil
        ) {
            self.pathTemplate = pathTemplate
            self.maximumEndpoints = max(0, maximumEndpoints)
            self.maximumTrackedRequests = max(4, maximumTrackedRequests)
            self.shardCount = shardCount ?? min(16, ProcessInfo.processInfo.activeProcessorCount)
        }
    }
}
