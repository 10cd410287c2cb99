// swift-tools-version: 6.0
// Writes and checks the public-API baselines in API/ (one file per product). A package of its own,
// with no dependencies, so the root manifest stays as it is; `.ci/run` builds and runs it.
import PackageDescription

let package = Package(
    name: "APIBaseline",
    targets: [
        .executableTarget(name: "api-baseline", swiftSettings: [.swiftLanguageMode(.v6)])
    ]
)
