// swift-tools-version:6.0
import PackageDescription

// swift-openapi-generator's command-line tool at a pinned version, for Scripts/openapi-generate.sh:
// the notes API's client and server are generated once and committed (Integrations/Sources/NotesAPI),
// so neither the Integrations build nor CI builds the generator.
let package = Package(
    name: "OpenAPIGenerator",
    dependencies: [
        .package(url: "https://github.com/apple/swift-openapi-generator", exact: "1.14.3")
    ]
)
