// api-baseline: the public API of each product as a sorted text file, from the toolchain's
// symbol graphs (`swift-symbolgraph-extract`), so a public change shows in review as a diff of
// API/<Module>.txt in the same commit.
//
//     api-baseline write <modules-dir> <API-dir> [-I <dir>]... <Module>...   # regenerate the baselines
//     api-baseline check <modules-dir> <API-dir> [-I <dir>]... <Module>...   # fail (exit 1) on any difference
//
// `-I` adds a search path (the include folder of a C target's module map).
// <modules-dir> is where the build put the `.swiftmodule`s (`$(swift build --show-bin-path)/Modules`).
// One line per public symbol: its path, then its declaration as the compiler prints it; then one
// line per conformance it declares (members a protocol extension adds to every conformer are left
// to that line). Deprecated symbols are marked. Doc comments and source
// locations are left out: only what a caller's code can depend on is listed.
import Foundation

struct Failure: Error, CustomStringConvertible {
    let description: String
}

struct SymbolGraph: Decodable {
    struct Symbol: Decodable {
        struct Kind: Decodable { let identifier: String }
        struct Identifier: Decodable { let precise: String }
        struct Fragment: Decodable { let spelling: String }
        struct Availability: Decodable {
            let isUnconditionallyDeprecated: Bool?
            let deprecated: Version?
            let renamed: String?
            let message: String?
        }
        struct Version: Decodable { let major: Int; let minor: Int?; let patch: Int? }
        let kind: Kind
        let identifier: Identifier
        let pathComponents: [String]
        let declarationFragments: [Fragment]?
        let accessLevel: String
        let availability: [Availability]?
    }
    struct Relationship: Decodable {
        let kind: String
        let source: String
        let target: String
        let targetFallback: String?
    }
    let symbols: [Symbol]
    let relationships: [Relationship]
}

func run(_ tool: String, _ arguments: [String]) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = [tool] + arguments
    try process.run()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw Failure(description: "\(tool) \(arguments.joined(separator: " ")) exited with \(process.terminationStatus)")
    }
}

/// The listing of `module`, read from the symbol graphs in `graphs` (its own and those of its
/// extensions to other modules' types).
func listing(of module: String, graphs: URL) throws -> String {
    let names = try FileManager.default.contentsOfDirectory(atPath: graphs.path)
        .filter { $0 == "\(module).symbols.json" || ($0.hasPrefix("\(module)@") && $0.hasSuffix(".symbols.json")) }
        .sorted()
    guard !names.isEmpty else { throw Failure(description: "no symbol graph for \(module)") }
    var lines: Set<String> = []
    for name in names {
        let data = try Data(contentsOf: graphs.appendingPathComponent(name))
        let graph = try JSONDecoder().decode(SymbolGraph.self, from: data)
        var paths: [String: String] = [:]
        for symbol in graph.symbols where symbol.accessLevel == "public" || symbol.accessLevel == "open" {
            // Members a protocol's extension gives every conformer (`!=`, `...`): the conformance
            // line already says so.
            guard !symbol.identifier.precise.contains("::SYNTHESIZED::") else { continue }
            let path = symbol.pathComponents.joined(separator: ".")
            paths[symbol.identifier.precise] = path
            let declaration = (symbol.declarationFragments ?? []).map(\.spelling).joined()
                .split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " ")
            var line = "\(path): \(declaration)"
            if let availability = symbol.availability, availability.contains(where: { $0.isUnconditionallyDeprecated == true || $0.deprecated != nil }) {
                let renamed = availability.compactMap(\.renamed).first.map { " (renamed: \($0))" } ?? ""
                line += "  [deprecated\(renamed)]"
            }
            lines.insert(line)
        }
        for relationship in graph.relationships where relationship.kind == "conformsTo" {
            guard let source = paths[relationship.source] else { continue }
            let target = relationship.targetFallback ?? relationship.target
            lines.insert("\(source): conforms to \(target)")
        }
    }
    guard !lines.isEmpty else { return "(no public symbols of its own)\n" }
    return lines.sorted().joined(separator: "\n") + "\n"
}

func main() throws {
    let arguments = Array(CommandLine.arguments.dropFirst())
    guard arguments.count >= 4, ["write", "check"].contains(arguments[0]) else {
        throw Failure(description: "usage: api-baseline write|check <modules-dir> <API-dir> <Module>...")
    }
    let (mode, modules, baselines) = (arguments[0], arguments[1], URL(fileURLWithPath: arguments[2]))
    let graphs = FileManager.default.temporaryDirectory.appendingPathComponent("api-baseline-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: graphs, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: graphs) }
    try FileManager.default.createDirectory(at: baselines, withIntermediateDirectories: true)
    var includes = ["-I", modules]
    var rest = arguments[3...]
    while rest.first == "-I", rest.count >= 2 {
        includes += ["-I", rest[rest.startIndex + 1]]
        rest = rest.dropFirst(2)
    }
    var differing: [String] = []
    for module in rest {
        try run(
            "swift-symbolgraph-extract",
            [
                "-module-name", module, "-minimum-access-level", "public",
                "-skip-inherited-docs", "-output-dir", graphs.path,
            ] + includes)
        let current = try listing(of: module, graphs: graphs)
        let file = baselines.appendingPathComponent("\(module).txt")
        if mode == "write" {
            try current.write(to: file, atomically: true, encoding: .utf8)
            print("wrote \(file.path) (\(current.split(separator: "\n").count) lines)")
        } else {
            let baseline = (try? String(contentsOf: file, encoding: .utf8)) ?? ""
            guard baseline != current else { continue }
            differing.append(module)
            let old = Set(baseline.split(separator: "\n")), new = Set(current.split(separator: "\n"))
            print("\(module): the public API differs from \(file.path)")
            for line in old.subtracting(new).sorted() { print("  - \(line)") }
            for line in new.subtracting(old).sorted() { print("  + \(line)") }
        }
    }
    if !differing.isEmpty {
        throw Failure(description: "public API changed in \(differing.joined(separator: ", ")); if intended, run Scripts/api-baseline.sh write and commit API/")
    }
}

do {
    try main()
} catch {
    FileHandle.standardError.write(Data("api-baseline: \(error)\n".utf8))
    exit(1)
}
