// swift-tools-version:6.0
import PackageDescription

// An outside package, as an adopter would write it: `ReadmeSnippets` depends only on the products
// `Retry` and `RequestEngine` and holds the README / published SwiftResilience snippets unchanged.
// The `readme-snippets` executable runs them against a real server on 127.0.0.1 and checks the
// behaviour DESIGN.md promises. CI builds and runs it so the snippets cannot rot.
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
        .executableTarget(
            name: "readme-snippets",
            dependencies: [
                "ReadmeSnippets",
                .product(name: "ResilienceTesting", package: "Resilience"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
