import Foundation
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Observability

/// One parsed sample line.
struct Sample: Equatable {
    var name: String
    var labels: [String: String]
    var value: Double
}

/// A strict parser for the subset of the text format 0.0.4 that the collector writes: comment
/// lines `# HELP name text` and `# TYPE name type`, and samples `name{l="v",…} value`.
struct ExpositionParser {
    var help: [String: String] = [:]
    var types: [String: String] = [:]
    var samples: [Sample] = []
    /// Family names in the order their TYPE lines appeared.
    var familyOrder: [String] = []

    enum Failure: Error, CustomStringConvertible {
        case line(Int, String)
        var description: String {
            switch self {
            case .line(let number, let reason): "line \(number): \(reason)"
            }
        }
    }

    init(_ text: String) throws {
        #expect(text.hasSuffix("\n"), "the exposition must end with a line feed")
        for (offset, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = offset + 1
            if line.isEmpty { continue }
            if line.hasPrefix("# HELP ") {
                let rest = line.dropFirst(7)
                guard let space = rest.firstIndex(of: " ") else { throw Failure.line(number, "HELP without text") }
                help[String(rest[..<space])] = String(rest[rest.index(after: space)...])
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ")
                guard parts.count == 2 else { throw Failure.line(number, "bad TYPE line") }
                guard ["counter", "gauge", "histogram", "summary", "untyped"].contains(parts[1]) else {
                    throw Failure.line(number, "unknown type \(parts[1])")
                }
                guard types[String(parts[0])] == nil else { throw Failure.line(number, "second TYPE for \(parts[0])") }
                types[String(parts[0])] = String(parts[1])
                familyOrder.append(String(parts[0]))
            } else if line.hasPrefix("#") {
                continue
            } else {
                samples.append(try Self.sample(line, number))
            }
        }
    }

    private static func sample(_ line: Substring, _ number: Int) throws -> Sample {
        var index = line.startIndex
        while index < line.endIndex, line[index] != "{", line[index] != " " { index = line.index(after: index) }
        let name = String(line[line.startIndex..<index])
        guard name.range(of: "^[a-zA-Z_:][a-zA-Z0-9_:]*$", options: .regularExpression) != nil else {
            throw Failure.line(number, "bad metric name \(name)")
        }
        var labels: [String: String] = [:]
        if index < line.endIndex, line[index] == "{" {
            index = line.index(after: index)
            while line[index] != "}" {
                let nameStart = index
                while line[index] != "=" { index = line.index(after: index) }
                let label = String(line[nameStart..<index])
                guard label.range(of: "^[a-zA-Z_][a-zA-Z0-9_]*$", options: .regularExpression) != nil else {
                    throw Failure.line(number, "bad label name \(label)")
                }
                index = line.index(after: index)
                guard line[index] == "\"" else { throw Failure.line(number, "label value not quoted") }
                index = line.index(after: index)
                var value = ""
                while line[index] != "\"" {
                    if line[index] == "\\" {
                        index = line.index(after: index)
                        switch line[index] {
                        case "\\": value.append("\\")
                        case "\"": value.append("\"")
                        case "n": value.append("\n")
                        default: throw Failure.line(number, "bad escape \\\(line[index])")
                        }
                    } else {
                        guard line[index] != "\n" else { throw Failure.line(number, "raw line feed in label") }
                        value.append(line[index])
                    }
                    index = line.index(after: index)
                }
                index = line.index(after: index)
                guard labels[label] == nil else { throw Failure.line(number, "duplicate label \(label)") }
                labels[label] = value
                if line[index] == "," { index = line.index(after: index) }
            }
            index = line.index(after: index)
        }
        guard index < line.endIndex, line[index] == " " else { throw Failure.line(number, "no value") }
        let valueText = line[line.index(after: index)...]
        guard let value = Double(valueText), !valueText.contains(" ") else {
            throw Failure.line(number, "bad value \(valueText)")
        }
        return Sample(name: name, labels: labels, value: value)
    }

    /// The family a sample belongs to (histogram samples carry a suffix).
    func family(of sample: Sample) -> String? {
        if types[sample.name] != nil { return sample.name }
        for suffix in ["_bucket", "_sum", "_count"] where sample.name.hasSuffix(suffix) {
            let base = String(sample.name.dropLast(suffix.count))
            if types[base] == "histogram" { return base }
        }
        return nil
    }
}

@Suite("Prometheus text exposition")
struct PrometheusTextFormatTests {
    /// A collector with a realistic mix: several endpoints, successes in many buckets, failures
    /// with and without a response, retries, deduplications, and URLs full of secrets.
    static func populatedCollector() -> RequestMetricsCollector {
        let collector = RequestMetricsCollector()
        var generator = SplitMix64(seed: 11)
        let targets: [(URL, HTTPMethod)] = [
            (url("https://alice:SECRET-PASSWORD@api.example.com/v1/users/42?access_token=SECRET-TOKEN"), .get),
            (url("https://api.example.com/v1/users/43/avatar#SECRET-FRAGMENT"), .get),
            (url("https://api.example.com/v1/orders;jsessionid=SECRET-SESSION?api_key=SECRET-KEY"), .post),
            (url("https://api.example.com/health"), .head),
        ]
        for index in 0..<2_000 {
            let (target, method) = targets[index % targets.count]
            let id = traceID(5, index)
            collector.record(.started(traceID: id, url: target, method: method))
            if index % 7 == 0 { collector.record(.retryScheduled(traceID: id, attempt: 0, delay: 0.1)) }
            switch index % 10 {
            case 0: collector.record(.failed(traceID: id, error: .httpError(statusCode: 503, data: nil), attempt: 1))
            case 1: collector.record(.failed(traceID: id, error: .timedOut, attempt: 0))
            default:
                let seconds = exp(Double.random(in: log(0.0005)...log(20), using: &generator))
                collector.record(.succeeded(traceID: id, statusCode: index % 3 == 0 ? 201 : 200, duration: seconds, attempt: 0))
            }
            if index % 5 == 0 { collector.record(.deduplicated(traceID: UUID(), url: target, method: method)) }
        }
        collector.record(.succeeded(traceID: UUID(), statusCode: 200, duration: 0, attempt: 0))  // unknown trace, le="0"
        return collector
    }

    @Test func outputParsesWithHelpAndTypeForEveryFamilyAndConsistentHistograms() throws {
        let collector = Self.populatedCollector()
        let text = collector.prometheusText()
        let parsed = try ExpositionParser(text)
        let stats = collector.currentSnapshot()

        #expect(
            parsed.familyOrder == [
                "http_client_requests_total", "http_client_request_duration_seconds",
                "http_client_requests_started_total", "http_client_retries_total",
                "http_client_deduplicated_requests_total",
            ])
        for family in parsed.familyOrder {
            #expect(!(parsed.help[family] ?? "").isEmpty, "\(family) has HELP text")
        }
        #expect(parsed.types["http_client_request_duration_seconds"] == "histogram")
        #expect(parsed.types["http_client_requests_total"] == "counter")

        // Every sample belongs to a declared family, and no series appears twice.
        var seen = Set<String>()
        for sample in parsed.samples {
            #expect(parsed.family(of: sample) != nil, "\(sample.name) has a TYPE")
            let identity = sample.name + sample.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
            #expect(seen.insert(identity).inserted, "duplicate series \(identity)")
        }

        // Histograms: per series, `le` ascending from 0 to +Inf with OpenTelemetry's bounds,
        // cumulative counts, and `_count` equal to the +Inf bucket.
        let expectedBounds = ["0", "0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1", "2.5", "5", "7.5", "10", "+Inf"]
        let buckets = parsed.samples.filter { $0.name == "http_client_request_duration_seconds_bucket" }
        let series = Dictionary(grouping: buckets) { "\($0.labels["method"] ?? "")|\($0.labels["endpoint"] ?? "")" }
        #expect(series.count == stats.endpoints.count)
        var totalCount = 0.0
        var totalSum = 0.0
        for (key, samples) in series {
            #expect(samples.map { $0.labels["le"] ?? "?" } == expectedBounds, "\(key)")
            let values = samples.map(\.value)
            #expect(values == values.sorted(), "\(key) buckets are cumulative")
            let labels = samples[0].labels.filter { $0.key != "le" }
            let count = parsed.samples.first { $0.name == "http_client_request_duration_seconds_count" && $0.labels == labels }
            let sum = parsed.samples.first { $0.name == "http_client_request_duration_seconds_sum" && $0.labels == labels }
            #expect(count?.value == values.last, "\(key) _count equals the +Inf bucket")
            #expect((sum?.value ?? -1) >= 0, "\(key) has a _sum")
            totalCount += count?.value ?? 0
            totalSum += sum?.value ?? 0
        }
        #expect(Int(totalCount) == stats.requestsSucceeded)
        #expect(abs(totalSum - stats.totalSuccessDuration) < 1e-6)

        // Requests by status and outcome add up to the completed requests.
        let completed = parsed.samples.filter { $0.name == "http_client_requests_total" }
        #expect(Int(completed.map(\.value).reduce(0, +)) == stats.requestsSucceeded + stats.requestsFailed)
        #expect(Set(completed.map { "\($0.labels["status"] ?? "")/\($0.labels["outcome"] ?? "")" }) == ["200/success", "201/success", "503/failure", "timed_out/failure"])
        let users = completed.filter { $0.labels["endpoint"] == "/v1/users/{id}" && $0.labels["method"] == "GET" }
        #expect(Set(users.map { $0.labels["status"] ?? "" }) == ["200", "201", "503"])
        #expect(Int(parsed.samples.filter { $0.name == "http_client_retries_total" }.map(\.value).reduce(0, +)) == stats.retriesScheduled)
        #expect(Int(parsed.samples.filter { $0.name == "http_client_deduplicated_requests_total" }.map(\.value).reduce(0, +)) == stats.deduplicationsHit)
        #expect(Int(parsed.samples.filter { $0.name == "http_client_requests_started_total" }.map(\.value).reduce(0, +)) == stats.requestsStarted)
    }

    @Test func noSecretFromAURLAppearsAnywhereInTheOutput() throws {
        let text = Self.populatedCollector().prometheusText()
        #expect(!text.contains("SECRET"))
        #expect(!text.contains("alice"))
        #expect(!text.contains("api.example.com"))
        #expect(!text.contains("token"))
        let endpoints = Set(try ExpositionParser(text).samples.compactMap { $0.labels["endpoint"] })
        #expect(endpoints == ["/v1/users/{id}", "/v1/users/{id}/avatar", "/v1/orders", "/health", "__unknown__"])
    }

    @Test func labelValuesAreEscaped() throws {
        let awkward = "a\"quote\\back\nline"
        let collector = RequestMetricsCollector(configuration: .init(pathTemplate: .custom { _ in awkward }))
        let id = UUID()
        collector.record(.started(traceID: id, url: url("https://x.test/anything"), method: .get))
        collector.record(.succeeded(traceID: id, statusCode: 200, duration: 0.2, attempt: 0))
        let text = collector.prometheusText()
        #expect(text.contains(#"endpoint="a\"quote\\back\nline""#))
        let parsed = try ExpositionParser(text)
        #expect(parsed.samples.allSatisfy { $0.labels["endpoint"] == awkward })
        #expect(PrometheusTextFormat.escapeLabelValue("plain /path/{id}") == "plain /path/{id}")
    }

    @Test func emptyCollectorStillDeclaresEveryFamily() throws {
        let parsed = try ExpositionParser(RequestMetricsCollector().prometheusText())
        #expect(parsed.familyOrder.count == 5)
        #expect(parsed.samples.isEmpty)
    }

    @Test func sumIsPrintedAsExactDecimalSeconds() {
        #expect(PrometheusTextFormat.formatSeconds(0) == "0")
        #expect(PrometheusTextFormat.formatSeconds(1_500_000_000) == "1.5")
        #expect(PrometheusTextFormat.formatSeconds(250_001) == "0.000250001")
        #expect(PrometheusTextFormat.formatSeconds(12_000_000_000) == "12")
    }

    static let promtool: String? = ["/usr/bin/promtool", "/usr/local/bin/promtool", "/opt/homebrew/bin/promtool"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    @Test(.enabled(if: promtool != nil, "promtool is not installed (Debian package `prometheus`): skipping `promtool check metrics`"))
    func promtoolCheckMetricsAcceptsTheOutput() throws {
        let promtool = try #require(Self.promtool)
        for text in [Self.populatedCollector().prometheusText(), RequestMetricsCollector().prometheusText()] {
            // SpawnedProcess, not Foundation.Process, whose run() can crash on Linux (see SpawnedProcess).
            let (termination, output) = try SpawnedProcess.run(promtool, ["check", "metrics"], input: Data(text.utf8))
            let report = String(decoding: output, as: UTF8.self)
            #expect(termination == .exited(0), "promtool check metrics: \(report)")
            #expect(report.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "promtool reported: \(report)")
        }
    }
}
