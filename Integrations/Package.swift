// swift-tools-version:6.0
import PackageDescription

// Bridges from the dependency-free root package to the server-side Swift ecosystem, kept in their
// own package so that the root manifest never grows a dependency (the way swift-openapi-runtime
// keeps its transports beside it). See Docs/Integrations.md.
let package = Package(
    name: "ResilienceIntegrations",
    platforms: [.macOS(.v15)],  // AsyncHTTPClient's and the root's own minimums, and Synchronization.Mutex
    products: [
        .library(name: "ResilienceAsyncHTTPClient", targets: ["ResilienceAsyncHTTPClient"]),
        .library(name: "ResilienceLogging", targets: ["ResilienceLogging"]),
        .library(name: "ResilienceMetrics", targets: ["ResilienceMetrics"]),
        .library(name: "ResilienceTracing", targets: ["ResilienceTracing"]),
        .library(name: "ResilienceServiceLifecycle", targets: ["ResilienceServiceLifecycle"]),
        .library(name: "ResiliencePostgres", targets: ["ResiliencePostgres"]),
        .library(name: "ResilienceOpenAPI", targets: ["ResilienceOpenAPI"]),
    ],
    dependencies: [
        // The root package. `name:` fixes its identity whatever the clone's folder is called, so
        // `.product(package: "Resilience")` below works on every machine and in CI.
        .package(name: "Resilience", path: ".."),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        // Already in AsyncHTTPClient's graph; named here to tell TLS failures apart by type.
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        .package(url: "https://github.com/apple/swift-service-context", from: "1.5.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-openapi-runtime", from: "1.13.4"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        // The notes API's origin in the OpenAPI tests and example: a server generated from the same
        // document, on Hummingbird (not a product's dependency).
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/swift-openapi-hummingbird", from: "2.1.0"),
        // The transport ResilienceTransport is measured against (openapi-benchmark only).
        .package(url: "https://github.com/swift-server/swift-openapi-async-http-client", from: "1.5.0"),
    ],
    targets: [
        .target(
            name: "ResilienceAsyncHTTPClient",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        // What the event-sink bridges share (endpoint labels, the trace-id table); not a product.
        .target(
            name: "ResilienceBridgeSupport",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Observability", package: "Resilience"),
            ]
        ),
        .target(
            name: "ResilienceLogging",
            dependencies: [
                "ResilienceBridgeSupport",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Observability", package: "Resilience"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "ResilienceMetrics",
            dependencies: [
                "ResilienceBridgeSupport",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Observability", package: "Resilience"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
            ]
        ),
        .target(
            name: "ResilienceTracing",
            dependencies: [
                "ResilienceBridgeSupport",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Observability", package: "Resilience"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
                .product(name: "ServiceContextModule", package: "swift-service-context"),
            ]
        ),
        .target(
            name: "ResilienceServiceLifecycle",
            dependencies: [
                .product(name: "Drainer", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The offline queue on PostgreSQL: a queue table claimed with `FOR UPDATE SKIP LOCKED` under
        // leases, for a service's replicas, and the transactional outbox.
        .target(
            name: "ResiliencePostgres",
            dependencies: [
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // A generated OpenAPI client's transport over the stack (`ResilienceTransport`).
        .target(
            name: "ResilienceOpenAPI",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        // The notes API (Sources/NotesAPI/openapi.yaml): its types, client and server, generated by
        // Scripts/openapi-generate.sh and committed (not a product).
        .target(
            name: "NotesAPI",
            dependencies: [
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            exclude: ["openapi.yaml", "openapi-generator-config.yaml"]
        ),
        // The notes API's origin, generated server on Hummingbird, with switches for 503 bursts,
        // Retry-After, 401 on expired tokens, slow responses and ETags (not a product).
        .target(
            name: "NotesOrigin",
            dependencies: [
                "NotesAPI",
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "OpenAPIHummingbird", package: "swift-openapi-hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // A notes app's process for the OpenAPI relaunch test: enqueues a generated `createNote`
        // offline, or drains the queue online (GeneratedClientTests).
        .executableTarget(
            name: "notes-offline-client",
            dependencies: [
                "NotesAPI",
                "ResilienceOpenAPI",
                "ResilienceAsyncHTTPClient",
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
            ]
        ),
        // Docs/Integrations.md's generated-client example: NotesApp.swift is the user's code
        // (shown verbatim), main.swift drives it against the generated server.
        .executableTarget(
            name: "openapi-example",
            dependencies: [
                "NotesAPI",
                "NotesOrigin",
                "ResilienceOpenAPI",
                "ResilienceAsyncHTTPClient",
                .product(name: "Auth", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "Reachability", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "Retry", package: "Resilience"),
            ]
        ),
        // The generated client over ResilienceTransport (the engine over AHC) against the same
        // client over swift-openapi-async-http-client's transport: CPU per operation, sequential
        // and at 64 in flight, interleaved, the origin in a child process (Benchmarks/README.md).
        .executableTarget(
            name: "openapi-benchmark",
            dependencies: [
                "NotesAPI",
                "NotesOrigin",
                "ResilienceOpenAPI",
                "ResilienceAsyncHTTPClient",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "OpenAPIAsyncHTTPClient", package: "swift-openapi-async-http-client"),
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
            ]
        ),
        // The README's and Docs/Integrations.md's adoption snippet and the outbox recipe, compiled by CI.
        .executableTarget(
            name: "integrations-example",
            dependencies: [
                "ResilienceAsyncHTTPClient", "ResilienceLogging", "ResilienceMetrics", "ResilienceTracing",
                "ResilienceServiceLifecycle", "ResiliencePostgres",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Resilience", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        // Engine over AHC against raw AHC and the engine over URLSession, on LoopbackHTTPServer.
        .executableTarget(
            name: "integrations-benchmark",
            dependencies: [
                "ResilienceAsyncHTTPClient",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ]
        ),

        // The shared PostgreSQL's settings, read from the environment by the replicas and the tests
        // (not a product).
        .target(name: "PostgresEnvironment", dependencies: [.product(name: "PostgresNIO", package: "postgres-nio")]),

        // Replicas draining one PostgreSQL queue table, for the replica test (PostgresReplicaKillTests)
        // and the replica benchmark (Benchmark/postgres-replicas.sh).
        .executableTarget(
            name: "postgres-queue-replica",
            dependencies: [
                "ResilienceAsyncHTTPClient",
                "ResiliencePostgres",
                "PostgresEnvironment",
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // The response cache behind an HTTP gateway, for the HTTP-caching conformance suite
        // (Integrations/Scripts/cache-conformance.sh).
        .executableTarget(
            name: "cache-conformance-gateway",
            dependencies: [
                "ResilienceAsyncHTTPClient",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "Reachability", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),

        // Helpers shared by the test targets (requests, an event recorder, a refusing port, a token provider).
        .target(
            name: "IntegrationTestSupport",
            dependencies: [
                .product(name: "Auth", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Tests/IntegrationTestSupport"
        ),
        .testTarget(
            name: "ResilienceAsyncHTTPClientTests",
            dependencies: [
                "IntegrationTestSupport",
                "ResilienceAsyncHTTPClient",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Auth", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "ResilienceOpenAPITests",
            dependencies: [
                "IntegrationTestSupport",
                "NotesAPI",
                "NotesOrigin",
                .product(name: "Auth", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                "ResilienceAsyncHTTPClient",
                "ResilienceOpenAPI",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Reachability", package: "Resilience"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "Retry", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "OpenAPIRuntime", package: "swift-openapi-runtime"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        .testTarget(
            name: "ResilienceBridgesTests",
            dependencies: [
                "IntegrationTestSupport",
                "ResilienceAsyncHTTPClient", "ResilienceLogging", "ResilienceMetrics", "ResilienceTracing",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Observability", package: "Resilience"),
                .product(name: "Auth", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "InMemoryLogging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ]
        ),
        .testTarget(
            name: "ResilienceServiceLifecycleTests",
            dependencies: [
                "IntegrationTestSupport",
                "ResilienceAsyncHTTPClient",
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "Logging", package: "swift-log"),
                "ResilienceServiceLifecycle",
                .product(name: "Drainer", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "ServiceLifecycleTestKit", package: "swift-service-lifecycle"),
            ]
        ),
        // Against a real PostgreSQL (Scripts/postgres.sh); skipped, saying why, when none answers and
        // neither CI nor RESILIENCE_POSTGRES_URL is set (failed when one is).
        .testTarget(
            name: "ResiliencePostgresTests",
            dependencies: [
                "ResiliencePostgres",
                "PostgresEnvironment",
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "OfflineFirst", package: "Resilience"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
