import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Testing

/// The one request value the layers pass down: each property read once, headers set without
/// leaving a second copy under another letter case.
@Suite("PreparedRequest")
struct PreparedRequestTests {
    /// Counts how often each property is read.
    final class CountingRequest: NetworkRequest, @unchecked Sendable {
        let reads = Locked<[String: Int]>([:])
        private func read<T>(_ name: String, _ value: T) -> T {
            reads.withLock { $0[name, default: 0] += 1 }
            return value
        }
        var url: URL { read("url", URL(string: "https://api.example.test/a")!) }
        var method: HTTPMethod { read("method", .post) }
        var headers: [String: String] { read("headers", ["X-A": "1"]) }
        var body: Data? { read("body", Data("b".utf8)) }
        var timeout: TimeInterval { read("timeout", 5) }
        var maximumResponseBodySize: Int? { read("maximumResponseBodySize", 100) }
        var deadline: Duration? { read("deadline", .seconds(9)) }
    }

    @Test func everyPropertyIsReadOnceAndKept() {
        let source = CountingRequest()
        let prepared = PreparedRequest(source)
        #expect(
            source.reads.withLock { $0 } == [
                "url": 1, "method": 1, "headers": 1, "body": 1, "timeout": 1, "maximumResponseBodySize": 1, "deadline": 1,
            ])
        #expect(
            prepared
                == PreparedRequest(
                    url: URL(string: "https://api.example.test/a")!, method: .post, headers: ["X-A": "1"], body: Data("b".utf8),
                    timeout: 5, maximumResponseBodySize: 100, deadline: .seconds(9)
                ))
        #expect(PreparedRequest(prepared) == prepared)
    }

    @Test func theDefaultsAreNetworkRequests() {
        struct Plain: NetworkRequest { let url = URL(string: "https://api.example.test/")!; let method = HTTPMethod.get }
        #expect(PreparedRequest(Plain()) == PreparedRequest(url: URL(string: "https://api.example.test/")!))
    }

    @Test func settingAHeaderReplacesItInAnyLetterCase() {
        let request = PreparedRequest(url: URL(string: "https://api.example.test/")!, headers: ["authorization": "old", "Accept": "x"])
        let set = request.settingHeader("Authorization", to: "Bearer new")
        #expect(set.headers == ["Authorization": "Bearer new", "Accept": "x"])
        #expect(set.header("AUTHORIZATION") == "Bearer new")
        #expect(request.settingHeader("ACCEPT", to: nil).headers == ["authorization": "old"])
        #expect(request.settingHeaders(["If-None-Match": "\"v1\"", "accept": "y"]).headers == ["authorization": "old", "accept": "y", "If-None-Match": "\"v1\""])
        #expect(request.settingHeaders([:]) == request)
    }
}
