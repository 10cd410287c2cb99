import Foundation

/// The trace of one random simulation of a Promela model in Models/, as the tests that replay a
/// model's decisions through its Swift state machine read it: spin runs the model with a seed
/// (`spin -T -n<seed>`), and every line the model prints starting with `TRACE` is a step — an
/// event name, then `key=value` fields (integers).
package struct SpinTrace: Sendable {
    package struct Step: Sendable, CustomStringConvertible {
        package let event: String
        package let fields: [String: Int]
        package let line: String
        package var description: String { line }

        package init?(_ line: Substring) {
            let words = line.split(separator: " ")
            guard words.count >= 2, words[0] == "TRACE" else { return nil }
            event = String(words[1])
            var fields: [String: Int] = [:]
            for word in words.dropFirst(2) {
                let pair = word.split(separator: "=", maxSplits: 1)
                if pair.count == 2, let value = Int(pair[1]) { fields[String(pair[0])] = value }
            }
            self.fields = fields
            self.line = String(line)
        }

        /// The field's value; -99 when the step has no such field (no model prints it).
        package subscript(_ key: String) -> Int { fields[key] ?? -99 }
    }

    /// What went wrong running spin.
    package enum Failure: Error, CustomStringConvertible {
        case spinFailed(seed: Int, output: String)
        case assertionViolated(seed: Int, output: String)

        package var description: String {
            switch self {
            case .spinFailed(let seed, let output): "spin -n\(seed) failed: \(output.suffix(500))"
            case .assertionViolated(let seed, let output): "spin -n\(seed) violated an assertion: \(output.suffix(800))"
            }
        }
    }

    /// spin, where Debian and Homebrew install it; `nil` when it is not installed.
    package static let spin: String? = ["/usr/bin/spin", "/usr/local/bin/spin", "/opt/homebrew/bin/spin"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    /// The steps of the model `Models/<name>.pml` simulated with `seed`; `defines` are passed to
    /// spin's preprocessor (`["-DSIM"]`).
    package static func simulate(_ name: String, seed: Int, defines: [String] = []) throws -> [Step] {
        guard let spin else { throw Failure.spinFailed(seed: seed, output: "spin is not installed") }
        let model = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Models/\(name).pml").path
        // spin writes its preprocessed model (`pan.pre`) to its working directory: each run gets
        // one of its own, or simulations running side by side read each other's.
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("spin-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let (termination, output) = try SpawnedProcess.run(
            "/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", folder.path, spin] + defines + ["-T", "-n\(seed)", model])
        let text = String(decoding: output, as: UTF8.self)
        guard termination == .exited(0) else { throw Failure.spinFailed(seed: seed, output: text) }
        guard !text.contains("assertion violated") else { throw Failure.assertionViolated(seed: seed, output: text) }
        return text.split(separator: "\n").compactMap(Step.init)
    }
}
