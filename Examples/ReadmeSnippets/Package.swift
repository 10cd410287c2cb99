// swift-tools-version:6.0
import PackageDescription

// An outside package, as an adopter would write it. Two libraries hold snippets unchanged:
// - `ReadmeSnippets`, on the products `Retry` and `RequestEngine` only: this README's snippets;
// - `OfflineReads`, on the products `ResponseCache`, `OfflineQueue` and `RequestEngine`: this
//   README's offline-reads and pending-indicator snippets;
// - `SimulationSnippet`, on `ResilienceSimulation` and `RequestEngine`: the simulation snippet
//   (compiled; a simulation owns its process while it runs);
// - `PublishedReadme`, on the product `Resilience` only, with nothing but `import Resilience`:
//   SwiftResilience's published README and public API, unchanged but for the import, to prove the
//   drop-in claim, plus the one-line migrations of this README's "Coming from SwiftResilience".
// The `readme-snippets` executable runs them against a real server on 127.0.0.1 and checks the
// behaviour they promise. CI builds and runs it so the snippets cannot rot.
let package = Package(
    name: "ReadmeSnippets",
    platforms: [.macOS(.v13), .iOS(.v16)],
    dependencies: [.package(name: "Resilience", path: "../..")],
    targets: [
        .target(
            name: "ReadmeSnippets",
            dependencies: [
                .product(name: "Retry", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
            ]
        ),
        .target(
            name: "OfflineReads",
            dependencies: [
                .product(name: "ResponseCache", package: "Resilience"),
                .product(name: "OfflineQueue", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
            ]
        ),
        .target(
            name: "SimulationSnippet",
            dependencies: [
                .product(name: "ResilienceSimulation", package: "Resilience"),
                .product(name: "RequestEngine", package: "Resilience"),
            ]
        ),
        .target(
            name: "PublishedReadme",
            dependencies: [.product(name: "Resilience", package: "Resilience")]
        ),
        .executableTarget(
            name: "readme-snippets",
            dependencies: [
                "ReadmeSnippets",
                "OfflineReads",
                "PublishedReadme",
                "SimulationSnippet",
                .product(name: "Resilience", package: "Resilience"),
                .product(name: "ResilienceTesting", package: "Resilience"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
