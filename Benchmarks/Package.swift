// swift-tools-version: 6.3
// ordo-one/benchmark 1.38.1 declares swift-tools-version 6.3 in its own manifest, so this package
// needs a Swift 6.3 toolchain too; `traits:` on a `.package` line needs at least 6.1.
import PackageDescription

// Benchmarks for the root package, kept in their own package so that the root manifest stays
// free of dependencies. Run from this folder: `swift package benchmark` (see README.md).
let package = Package(
    name: "ResilienceBenchmarks",
    platforms: [.macOS(.v15)],  // Synchronization.Mutex and Atomic in the benchmark code
    dependencies: [
        // The root package. `name:` pins the name that `.product(package:)` uses below, so the
        // manifest keeps working when the repository is cloned into a folder with another name.
        .package(name: "Resilience", path: ".."),
        // Only the "MallocInterposer" trait: the default traits also enable "RuntimeInterposer",
        // whose swift-runtime-interposer package is not in this machine's package mirror.
        .package(url: "https://github.com/ordo-one/benchmark", exact: "1.38.1", traits: ["MallocInterposer"]),
        // The overload benchmark drives the engine over AsyncHTTPClient (the integrations package's
        // session) against an upstream written on SwiftNIO.
        .package(name: "ResilienceIntegrations", path: "../Integrations"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
    ],
    targets: [
        .executableTarget(
            name: "RequestEngineBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/RequestEngineBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "OfflineQueueBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/OfflineQueueBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "ResponseCacheBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "Reachability", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/ResponseCacheBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "OfflineFirstBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "OfflineFirst", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "Reachability", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/OfflineFirstBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "AuthBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Auth", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/AuthBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "ObservabilityBenchmarks",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Observability", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Benchmarks/ObservabilityBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // Issue 18's strategies (hedging's tail cut, the cost of deadline + breakers + limiter) as a
        // plain executable, so it can also run under valgrind: `swift run -c release
        // strategies-benchmark` (README.md, "Strategies beyond retry"). Not under Benchmarks/, so
        // `swift package benchmark` does not take it for one of its targets.
        .executableTarget(
            name: "strategies-benchmark",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ],
            path: "Sources/StrategiesBenchmark"
        ),
        // Issue 26's overload benchmark: adaptive limits against an upstream of known capacity in
        // its own process (README.md, "Adaptive limits under overload"): `swift run -c release
        // overload-benchmark`.
        .executableTarget(
            name: "overload-benchmark",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
                .product(name: "ResilienceAsyncHTTPClient", package: "ResilienceIntegrations"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Sources/OverloadBenchmark"
        ),
        // Issue 30's soak: memory over a million requests, one transport per process (README.md,
        // "Memory over a long run"): `swift run -c release soak-benchmark engine-ahc`.
        .executableTarget(
            name: "soak-benchmark",
            dependencies: [
                .product(name: "RequestEngine", package: "Resilience"),
                .product(name: "ResilienceAsyncHTTPClient", package: "ResilienceIntegrations"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            path: "Sources/SoakBenchmark"
        ),
    ],
    swiftLanguageModes: [.v6]
)
