// swift-tools-version:6.0
import PackageDescription

// libFuzzer targets for the parsers of untrusted bytes, in a package of their own so that the
// root manifest and its builds stay as they are. Scripts/fuzz.sh builds them with the sanitizer
// flags (which then apply to the root's modules too) and runs them; the harnesses reach internal
// parsers with `@testable import` (a debug build is built for testing). Seeds: Corpus/<target>/.
let package = Package(
    name: "ResilienceFuzz",
    dependencies: [
        // The root package, named so that `package: "Resilience"` works whatever the clone's folder is called.
        .package(name: "Resilience", path: "..")
    ],
    targets: [
        // libFuzzer's driver entry point, declared for Swift.
        .target(name: "CLibFuzzer"),
        .target(name: "FuzzSupport", dependencies: ["CLibFuzzer"]),
        .executableTarget(name: "fuzz-queue-entry", dependencies: ["FuzzSupport", .product(name: "OfflineQueue", package: "Resilience")]),
        .executableTarget(name: "fuzz-cache-file", dependencies: ["FuzzSupport", .product(name: "ResponseCache", package: "Resilience")]),
        .executableTarget(
            name: "fuzz-cache-headers",
            dependencies: ["FuzzSupport", .product(name: "ResponseCache", package: "Resilience"), .product(name: "Retry", package: "Resilience")]
        ),
        .executableTarget(name: "fuzz-stale-marks", dependencies: ["FuzzSupport", .product(name: "ResponseCache", package: "Resilience")]),
        .executableTarget(name: "fuzz-http-date", dependencies: ["FuzzSupport", .product(name: "Retry", package: "Resilience")]),
        .executableTarget(name: "fuzz-loopback-request", dependencies: ["FuzzSupport", .product(name: "ResilienceTesting", package: "Resilience")]),
        // Writes Corpus/ (run it after changing a seed).
        .executableTarget(
            name: "fuzz-seeds", dependencies: [.product(name: "OfflineQueue", package: "Resilience"), .product(name: "ResponseCache", package: "Resilience")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
