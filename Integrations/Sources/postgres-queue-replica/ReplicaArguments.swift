import Foundation

/// `--name value` flags after the mode, as the commands read them.
struct ReplicaArguments {
    let mode: String
    private var values: [String: String] = [:]

    /// Parses `arguments` (without the program's name): a mode, then `--name value` pairs.
    init(_ arguments: [String]) throws(UsageError) {
        guard let mode = arguments.first, !mode.hasPrefix("--") else { throw UsageError("no mode given") }
        self.mode = mode
        var rest = arguments.dropFirst()
        while let flag = rest.popFirst() {
            guard flag.hasPrefix("--"), flag.count > 2 else { throw UsageError("expected a --flag, found \(flag)") }
            guard let value = rest.popFirst() else { throw UsageError("\(flag) needs a value") }
            values[String(flag.dropFirst(2))] = value
        }
    }

    /// The value of `--name`, which must be given.
    func string(_ name: String) throws(UsageError) -> String {
        guard let value = values[name] else { throw UsageError("--\(name) is required") }
        return value
    }

    /// The value of `--name`, or `fallback`.
    func string(_ name: String, default fallback: String) -> String { values[name] ?? fallback }

    /// The integer value of `--name` (at least `minimum`), or `fallback`.
    func integer(_ name: String, default fallback: Int, minimum: Int = 0) throws(UsageError) -> Int {
        guard let text = values[name] else { return fallback }
        guard let value = Int(text), value >= minimum else { throw UsageError("--\(name) needs an integer of at least \(minimum), found \(text)") }
        return value
    }

    /// A comma-separated list of positive integers (`--replicas 1,2,4`), or `fallback`.
    func integers(_ name: String, default fallback: [Int]) throws(UsageError) -> [Int] {
        guard let text = values[name] else { return fallback }
        let numbers = text.split(separator: ",").compactMap { Int($0) }
        guard !numbers.isEmpty, numbers.count == text.split(separator: ",").count, numbers.allSatisfy({ $0 > 0 }) else {
            throw UsageError("--\(name) needs positive integers separated by commas, found \(text)")
        }
        return numbers
    }

    /// An http URL (`--origin http://127.0.0.1:8080`), without a trailing `/`.
    func url(_ name: String) throws(UsageError) -> URL {
        let text = try string(name)
        guard let url = URL(string: text.hasSuffix("/") ? String(text.dropLast()) : text), url.scheme == "http" || url.scheme == "https", url.host != nil else {
            throw UsageError("--\(name) needs an http URL, found \(text)")
        }
        return url
    }

    /// A table name as `PostgresQueueStore` takes it.
    func tableName() throws(UsageError) -> String {
        try string("table")
    }
}

/// A command line that cannot be run; printed with the usage.
struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Writes `line` and a newline to standard output in one `write(2)`, unbuffered: a line is out of
/// the process before the call returns, so a reader sees everything written before a kill, and
/// lines from concurrent tasks never interleave.
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// The same on standard error.
func log(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
