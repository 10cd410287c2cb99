// swift-tools-version:6.0
import PackageDescription

// One package, one target per layer, no package dependencies.
// Imports point down only: Retry <- RequestEngine <- {Reachability, Auth, Observability};
// {RequestEngine, Reachability} <- {OfflineQueue, ResponseCache}; Drainer <- OfflineQueue;
// OfflineFirst <- {OfflineQueue, ResponseCache}.
// ResilienceCore holds shared plumbing and is not a product.
let package = Package(
    name: "Resilience",
    platforms: [.macOS(.v13), .iOS(.v16), .tvOS(.v16), .watchOS(.v9), .visionOS(.v1)],
    products: [
        .library(name: "Retry", targets: ["Retry"]),
        .library(name: "RequestEngine", targets: ["RequestEngine"]),
        .library(name: "Reachability", targets: ["Reachability"]),
        .library(name: "OfflineQueue", targets: ["OfflineQueue"]),
        .library(name: "ResponseCache", targets: ["ResponseCache"]),
        .library(name: "Auth", targets: ["Auth"]),
        .library(name: "Observability", targets: ["Observability"]),
        .library(name: "Drainer", targets: ["Drainer"]),
        .library(name: "OfflineFirst", targets: ["OfflineFirst"]),
        .library(name: "Resilience", targets: ["Resilience"]),
        .library(name: "ResilienceTesting", targets: ["ResilienceTesting"]),
        .library(name: "ResilienceSimulation", targets: ["ResilienceSimulation"]),
        .executable(name: "resilience-demo", targets: ["resilience-demo"]),
    ],
    targets: [
        .target(name: "ResilienceCore"),
        .target(name: "Retry", dependencies: ["ResilienceCore"]),
        // Linux only: mends corelibs-foundation's per-transfer leak for URLSessionTransport.
        // (dlopen and dlsym are in libc from glibc 2.34 on; libdl for older ones.)
        .target(name: "CURLHandleRepair", linkerSettings: [.linkedLibrary("dl", .when(platforms: [.linux]))]),
        .target(
            name: "RequestEngine",
            dependencies: ["Retry", "ResilienceCore", .target(name: "CURLHandleRepair", condition: .when(platforms: [.linux]))]
        ),
        .target(name: "CNetlink"),
        .target(
            name: "Reachability",
            dependencies: ["RequestEngine", "Retry", "ResilienceCore", .target(name: "CNetlink", condition: .when(platforms: [.linux]))]
        ),
        .target(
            name: "OfflineQueue",
            dependencies: ["RequestEngine", "Retry", "ResilienceCore", "Reachability"]
        ),
        .target(name: "ResponseCache", dependencies: ["RequestEngine", "Reachability", "Retry", "ResilienceCore"]),
        .target(name: "Auth", dependencies: ["RequestEngine", "ResilienceCore"]),
        .target(name: "Observability", dependencies: ["RequestEngine", "ResilienceCore"]),
        .target(name: "Drainer", dependencies: ["OfflineQueue", "Retry", "ResilienceCore"]),
        .target(name: "OfflineFirst", dependencies: ["OfflineQueue", "ResponseCache", "RequestEngine", "Reachability", "ResilienceCore"]),
        .target(
            name: "Resilience",
            dependencies: ["Retry", "RequestEngine", "Reachability", "OfflineQueue", "ResponseCache", "Auth", "Observability", "Drainer", "OfflineFirst"]
        ),
        .target(name: "ResilienceTesting", dependencies: ["Retry", "RequestEngine", "Reachability", "ResilienceCore"]),
        .target(
            name: "ResilienceSimulation",
            dependencies: [
                "ResilienceTesting", "RequestEngine", "Auth", "OfflineQueue", "ResponseCache", "Drainer", "OfflineFirst", "Reachability", "Retry",
                "ResilienceCore",
            ]
        ),
        // Helpers for this package's own tests and demo (package access, not a product).
        .target(name: "ResilienceTestSupport", dependencies: ["Retry", "RequestEngine", "ResilienceCore", "OfflineQueue"]),
        .executableTarget(name: "resilience-demo", dependencies: ["Resilience", "ResilienceTesting", "ResilienceSimulation", "ResilienceTestSupport", "ResilienceCore"]),

        .testTarget(name: "ResilienceCoreTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "ResilienceTesting"]),
        .testTarget(name: "RetryTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "Retry", "ResilienceTesting"]),
        .testTarget(
            name: "RequestEngineTests",
            dependencies: [
                "ResilienceCore", "ResilienceTestSupport", "RequestEngine", "ResilienceTesting",
                .target(name: "CURLHandleRepair", condition: .when(platforms: [.linux])),
            ]
        ),
        .testTarget(name: "ResilienceTestingTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "ResilienceTesting"]),
        .testTarget(name: "ReachabilityTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "Reachability", "ResilienceTesting"]),
        .testTarget(name: "OfflineQueueTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "OfflineQueue", "ResilienceTesting"]),
        .testTarget(name: "ResponseCacheTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "ResponseCache", "Auth", "Observability", "ResilienceTesting"]),
        .testTarget(name: "AuthTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "Auth", "OfflineQueue", "ResilienceTesting"]),
        .testTarget(name: "ObservabilityTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "Observability", "ResilienceTesting"]),
        .testTarget(name: "DrainerTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "Drainer", "OfflineQueue", "ResilienceTesting"]),
        .testTarget(name: "ResilienceSimulationTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "ResilienceSimulation", "OfflineQueue", "RequestEngine"]),
        .testTarget(name: "OfflineFirstTests", dependencies: ["ResilienceCore", "ResilienceTestSupport", "OfflineFirst", "OfflineQueue", "ResponseCache", "ResilienceTesting"]),
    ],
    swiftLanguageModes: [.v6]
)
