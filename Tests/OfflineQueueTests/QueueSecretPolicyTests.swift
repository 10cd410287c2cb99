import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import OfflineQueue

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The rule itself: which header and parameter names are secret, which are not, and how a caller
/// extends or replaces it.
@Suite("QueueSecretPolicy: secret header and parameter names")
struct QueueSecretPolicyTests {
    let policy = QueueSecretPolicy.standard

    @Test(arguments: [
        "Authorization", "proxy-authorization", "COOKIE", "Cookie2", "X-Api-Key", "Api-Key", "X-Goog-Api-Key",
        "X-Auth-Token", "X-Access-Token", "X-Refresh-Token", "Private-Token", "X-CSRF-Token", "X-XSRF-TOKEN",
        "X-Client-Secret", "X-User-Password", "X-Session-Id", "X-Hub-Signature-256", "X-Amz-Security-Token",
        "X-Credential", "DPoP", "Ocp-Apim-Subscription-Key", "X-Functions-Key",
    ])
    func secretHeaderNamesMatch(name: String) {
        #expect(policy.isSecretHeader(name))
    }

    @Test(arguments: [
        "Content-Type", "Accept", "Accept-Language", "Accept-Encoding", "User-Agent", "X-Request-ID",
        "X-Correlation-ID", "If-Match", "If-None-Match", "Idempotency-Key", "Cache-Control", "Keep-Alive",
        "X-Forwarded-For", "Content-Length", "X-Trace", "Prefer", "Origin", "X-Monkey",
    ])
    func ordinaryHeaderNamesDoNotMatch(name: String) {
        #expect(!policy.isSecretHeader(name))
    }

    @Test(arguments: [
        "key", "KEY", "sid", "pwd", "jwt", "token", "access_token", "accessToken", "id_token", "refresh-token",
        "api_key", "apikey", "x-api-key", "client_secret", "password", "user.password", "signature",
        "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "AWSAccessKeyId", "sig", "auth",
        "session", "sessionid", "jsessionid", "PHPSESSID", "private_key", "aws_secret_key",
    ])
    func secretParameterNamesMatch(name: String) {
        #expect(policy.isSecretParameter(name))
    }

    @Test(arguments: [
        "monkey", "sort", "keyword", "keys", "page", "sort_key", "keyboard", "account_sid", "sidebar", "inside",
        "signup", "designation", "author", "oauth_provider", "tokens", "passport", "compass", "q", "limit",
        "offset", "id", "user_id", "session_count", "secretary_name",
    ])
    func ordinaryParameterNamesDoNotMatch(name: String) {
        #expect(!policy.isSecretParameter(name))
    }

    @Test func eachSetCanBeExtendedInAnyLetterCase() {
        var policy = QueueSecretPolicy.standard
        policy.secretHeaderNames.insert("X-Tenant-Id")
        policy.secretHeaderNameFragments.insert("Private")
        policy.secretParameterNames.insert("Ticket")
        policy.secretParameterNameSuffixes.insert("PIN")
        #expect(policy.isSecretHeader("x-tenant-id"))
        #expect(policy.isSecretHeader("X-Private-Note"))
        #expect(policy.isSecretParameter("TICKET"))
        #expect(policy.isSecretParameter("card_pin"))
        #expect(!policy.isSecretParameter("spin"))
        #expect(policy.isSecretHeader("X-Api-Key"))  // the standard names are still there
        #expect(policy != .standard)
    }

    @Test func eachSetCanBeReplacedButAuthorizationProxyAuthorizationAndCookieAreAlwaysSecret() {
        let policy = QueueSecretPolicy(
            secretHeaderNames: ["x-only"], secretHeaderNameFragments: [],
            secretParameterNames: [], secretParameterNameSuffixes: ["magic"]
        )
        #expect(policy.isSecretHeader("X-Only"))
        #expect(!policy.isSecretHeader("X-Api-Key"))
        #expect(!policy.isSecretHeader("X-Refresh-Token"))
        for name in ["Authorization", "Proxy-Authorization", "Cookie"] { #expect(policy.isSecretHeader(name)) }
        #expect(policy.isSecretParameter("my_magic"))
        #expect(!policy.isSecretParameter("key"))
        #expect(!policy.isSecretParameter("access_token"))
    }

    @Test func theFragmentIsRemovedAndNothingElseChanges() {
        let cases = [
            ("https://api.example.test/a?b=c#access_token=s3cr3t", "https://api.example.test/a?b=c"),
            ("https://api.example.test/a#", "https://api.example.test/a"),
            ("https://api.example.test/a%23b?c=d%23e", "https://api.example.test/a%23b?c=d%23e"),
        ]
        for (input, expected) in cases {
            #expect(QueueSecretPolicy.removingFragment(from: URL(string: input)!).absoluteString == expected)
        }
    }

    @Test func pathParametersAreFoundInAnySegment() {
        func pathParameter(_ url: String) -> String? {
            URLComponents(string: url).flatMap(policy.secretPathParameter(in:))
        }
        #expect(pathParameter("https://h.test/a;jsessionid=X1/b") == "jsessionid")
        #expect(pathParameter("https://h.test/a/b;v=1;SID=X2") == "SID")
        #expect(pathParameter("https://h.test/a;%6Asessionid=X3") == "jsessionid")  // percent-encoded name
        #expect(pathParameter("https://h.test/;jsessionid=X4") == "jsessionid")  // a segment of parameters only
        #expect(pathParameter("https://h.test/cars;color=red/a;b") == nil)
        #expect(pathParameter("https://h.test/a?x=1;jsessionid=2") == nil)  // a query, not a path
    }

    @Test func errorDescriptionsNameThePartNeverItsValue() {
        #expect("\(OfflineQueueError.credentialsInURL)" == "offline queue refuses a URL with user-info (user:password@)")
        #expect("\(OfflineQueueError.sensitivePathParameter("jsessionid"))" == "offline queue refuses a URL with the credential-like path parameter 'jsessionid'")
    }

    // MARK: An entry for a front door without an engine (the outbox)

    @Test func anEntryForAFrontDoorIsStrippedAndCheckedAsTheEngineStoresIt() throws {
        var request = Mutation("/orders")
        request.url = URL(string: "https://api.example.test/orders#token=abc")!
        request.headers = ["Authorization": "Bearer s3cret", "X-Api-Key": "k", "Content-Type": "application/json"]
        request.idempotencyKey = "order-1"
        let entry = try QueueSecretPolicy.standard.entry(for: request)
        #expect(entry.headers == ["Content-Type": "application/json"])
        #expect(entry.url.absoluteString == "https://api.example.test/orders")
        #expect(entry.idempotencyKey == "order-1")

        let withUser = Mutation("/a", base: URL(string: "https://user:pw@api.example.test")!)
        #expect(throws: OfflineQueueError.credentialsInURL) { try QueueSecretPolicy.standard.entry(for: withUser) }
        var spent = Mutation("/a")
        spent.deadline = .zero
        #expect(throws: NetworkError.self) { try QueueSecretPolicy.standard.entry(for: spent) }
    }
}

/// What enqueue does with each kind of secret, read back from the entry file's bytes.
@Suite("OfflineQueueEngine: secrets never reach the queue files")
struct QueueSecretsOnDiskTests {
    static let secretValues = ["s3cr3t-api-key", "s3cr3t-bearer", "s3cr3t-cookie", "s3cr3t-session", "s3cr3t-fragment"]

    /// Every byte under the queue's folder (entry files, temp files, dead letters, quarantine).
    static func allBytes(under directory: URL) throws -> String {
        var text = ""
        let files = FileManager.default.enumerator(at: directory, includingPropertiesForKeys: nil)
        while let file = files?.nextObject() as? URL {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: file.path, isDirectory: &isDirectory), !isDirectory.boolValue else { continue }
            text += String(decoding: try Data(contentsOf: file), as: UTF8.self)
        }
        return text
    }

    @Test func secretHeadersAndTheFragmentAreStrippedFromTheFileAndTheFirstAttemptStillCarriesTheHeaders() async throws {
        let h = try QueueHarness([.urlError(.notConnectedToInternet)])
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/a?page=2#access_token=s3cr3t-fragment")!
        request.headers = [
            "X-Api-Key": "s3cr3t-api-key", "Authorization": "Bearer s3cr3t-bearer", "Cookie": "id=s3cr3t-cookie",
            "X-Session-Token": "s3cr3t-session", "X-Trace": "t1",
        ]
        let id = try #require(try await h.engine.enqueue(request).queuedID)

        let first = try #require(h.session.requests.first)
        #expect(first.value(forHTTPHeaderField: "X-Api-Key") == "s3cr3t-api-key")
        #expect(first.value(forHTTPHeaderField: "Authorization") == "Bearer s3cr3t-bearer")
        #expect(first.value(forHTTPHeaderField: "Cookie") == "id=s3cr3t-cookie")
        #expect(first.value(forHTTPHeaderField: "X-Session-Token") == "s3cr3t-session")

        let bytes = try Self.allBytes(under: h.directory.url)
        #expect(bytes.contains(id.uuidString))
        for secret in Self.secretValues { #expect(!bytes.contains(secret), "\(secret) reached the disk") }
        #expect(!bytes.contains("X-Api-Key"))
        #expect(!bytes.contains("access_token"))
        #expect(bytes.contains("X-Trace"))
        let entry = try #require(h.store.entry(id: id))
        #expect(entry.url.absoluteString == "https://api.example.test/a?page=2")
        #expect(entry.headers == ["X-Trace": "t1"])
    }

    @Test(arguments: ["https://user:s3cr3t@api.example.test/a", "https://s3cr3t@api.example.test/a", "https://:s3cr3t@api.example.test/a"])
    func userInfoInTheURLIsRefusedAndNothingIsSentOrStored(url: String) async throws {
        let h = try QueueHarness([.ok()])
        var request = Mutation("/a")
        request.url = URL(string: url)!
        let error = await thrownError { try await h.engine.enqueue(request) }
        #expect(error as? OfflineQueueError == .credentialsInURL)
        #expect(!"\(String(describing: error))".contains("s3cr3t"))
        #expect(h.session.callCount == 0)
        #expect(try Self.allBytes(under: h.directory.url).isEmpty)
        #expect(await h.engine.pendingCount() == 0)
    }

    @Test(arguments: ["key", "sid", "jsessionid", "PHPSESSID"])
    func aSecretQueryParameterIsRefused(name: String) async throws {
        let h = try QueueHarness([.ok()])
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/a?\(name)=s3cr3t&page=2")!
        let error = await thrownError { try await h.engine.enqueue(request) }
        #expect(error as? OfflineQueueError == .sensitiveQueryParameter(name))
        #expect(h.session.callCount == 0)
        #expect(try Self.allBytes(under: h.directory.url).isEmpty)
    }

    @Test(arguments: ["jsessionid", "sid", "PHPSESSID"])
    func aSecretPathParameterIsRefused(name: String) async throws {
        let h = try QueueHarness([.ok()])
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/cart;\(name)=s3cr3t/items")!
        let error = await thrownError { try await h.engine.enqueue(request) }
        #expect(error as? OfflineQueueError == .sensitivePathParameter(name))
        #expect(h.session.callCount == 0)
        #expect(try Self.allBytes(under: h.directory.url).isEmpty)
    }

    @Test func ordinaryPathParametersAndQueriesAreKept() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var request = Mutation("/a")
        request.url = URL(string: "https://api.example.test/cars;color=red/a?sort=desc&keyword=x")!
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        #expect(h.store.entry(id: id)?.url == request.url)
    }

    @Test func aCustomPolicyDecidesWhatIsStripped() async throws {
        var policy = QueueSecretPolicy.standard
        policy.secretHeaderNames.insert("X-Tenant")
        let h = try QueueHarness([.ok()], connected: false, configuration: .init(secretPolicy: policy))
        var request = Mutation("/a")
        request.headers = ["X-Tenant": "s3cr3t-tenant", "X-Trace": "t1"]
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        #expect(h.store.entry(id: id)?.headers == ["X-Trace": "t1"])
        #expect(!(try Self.allBytes(under: h.directory.url)).contains("s3cr3t-tenant"))
    }

    @Test func replaysGetTheReplayHeadersValuesButTheFirstAttemptDoesNot() async throws {
        let calls = Locked<[UUID]>([])
        let configuration = OfflineQueueEngine.Configuration(
            retryPolicy: FixedIntervalRetryPolicy(maxRetries: .max, interval: 10),
            replayHeaders: { entry in
                calls.withLock { $0.append(entry.id) }
                return ["X-Api-Key": "replay-key", "x-trace": "replayed", "Idempotency-Key": "hijacked"]
            }
        )
        let h = try QueueHarness([.status(503), .ok()], configuration: configuration)
        var request = Mutation("/a")
        request.idempotencyKey = "key-1"
        request.headers = ["X-Api-Key": "s3cr3t-api-key", "X-Trace": "t1"]
        let id = try #require(try await h.engine.enqueue(request).queuedID)  // first attempt: 503
        #expect(calls.withLock { $0 }.isEmpty)
        #expect(h.session.requests.first?.value(forHTTPHeaderField: "X-Api-Key") == "s3cr3t-api-key")

        h.clock.advance(by: .seconds(10))
        #expect(await h.engine.flush().delivered == [id])
        #expect(calls.withLock { $0 } == [id])
        let replay = try #require(h.session.requests.last)
        #expect(replay.value(forHTTPHeaderField: "X-Api-Key") == "replay-key")
        #expect(replay.value(forHTTPHeaderField: "Idempotency-Key") == "key-1")
        let traces = (replay.allHTTPHeaderFields ?? [:]).filter { $0.key.lowercased() == "x-trace" }
        #expect(traces.values.sorted() == ["replayed"])  // replaced, not doubled
    }

    @Test func withoutAHookAReplayCarriesNoStrippedHeader() async throws {
        let h = try QueueHarness([.ok()], connected: false)
        var request = Mutation("/a")
        request.headers = ["X-Api-Key": "s3cr3t-api-key", "Cookie": "id=s3cr3t-cookie"]
        let id = try #require(try await h.engine.enqueue(request).queuedID)
        await h.monitor.setConnected(true)
        #expect(await h.engine.flush().delivered == [id])
        let replay = try #require(h.session.requests.first)
        #expect(replay.value(forHTTPHeaderField: "X-Api-Key") == nil)
        #expect(replay.value(forHTTPHeaderField: "Cookie") == nil)
    }
}
