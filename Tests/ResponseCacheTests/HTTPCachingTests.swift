import Foundation
import Reachability
import RequestEngine
import ResilienceTestSupport
import ResilienceTesting
import Retry
import Testing

@testable import ResponseCache

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `CachedRequestEngine` against the rules of RFC 9111 and RFC 5861, one rule per test (its
/// section in the name), on a manual clock and a scripted network.
@Suite("CachedRequestEngine follows RFC 9111 and RFC 5861", .timeLimit(.minutes(1)))
struct HTTPCachingTests {
    /// An HTTP date `offset` seconds from now (for `Date`, `Expires`, `Last-Modified`).
    static func date(_ offset: Double) -> String { HTTPDate.format(Date().addingTimeInterval(offset)) }

    // MARK: A 304 updates only what its validators select (§4.3.4)

    /// The poisoning case: a caller's own `If-None-Match: "X"` answered 304 must not relabel the
    /// stored `"Y"` response, nor be answered from it.
    @Test func aCallersOwnConditionalRequestPassesThroughAndItsNotModifiedNeverTouchesTheStoredResponse_Section4_3_4() async throws {
        let h = try CacheHarness([
            .ok("body Y", headers: ["ETag": "\"Y\"", "Cache-Control": "max-age=600"]),
            .status(304, headers: ["ETag": "\"X\"", "Cache-Control": "max-age=600"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let conditional = try await h.engine.response(for: Read("/doc", headers: ["If-None-Match": "\"X\""]), mode: .online, staleTime: .http)
        #expect(conditional.source == .network && conditional.response.statusCode == 304)
        #expect(h.session.requests[1].value(forHTTPHeaderField: "If-None-Match") == "\"X\"")  // the caller's, untouched
        let plain = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(plain.source == .cache && h.body(plain) == "body Y")
        #expect(plain.response.value(forHTTPHeaderField: "ETag") == "\"Y\"")
        #expect(h.session.callCount == 2)
    }

    @Test func a304MatchingNoneOfSeveralStoredVariantsUpdatesNoneAndTheReadIsFetchedInFull_Section4_3_4() async throws {
        let h = try CacheHarness([
            .ok("english", headers: ["ETag": "\"en\"", "Vary": "Accept-Language", "Cache-Control": "max-age=10"]),
            .ok("french", headers: ["ETag": "\"fr\"", "Vary": "Accept-Language", "Cache-Control": "max-age=10"]),
            .status(304, headers: ["ETag": "\"zz\"", "Cache-Control": "max-age=600"]),
            .ok("english 2", headers: ["ETag": "\"en2\"", "Vary": "Accept-Language", "Cache-Control": "max-age=600"]),
        ])
        let english = Read("/doc", headers: ["Accept-Language": "en"])
        let french = Read("/doc", headers: ["Accept-Language": "fr"])
        _ = try await h.engine.response(for: english, mode: .online, staleTime: .http)
        _ = try await h.engine.response(for: french, mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        let answer = try await h.engine.response(for: english, mode: .online, staleTime: .http)
        #expect(answer.source == .network && h.body(answer) == "english 2")
        #expect(h.session.requests[2].value(forHTTPHeaderField: "If-None-Match") == "\"en\"")
        #expect(h.session.requests[3].value(forHTTPHeaderField: "If-None-Match") == nil)  // sent again in full
        // The 304's freshness reached neither variant: French is still stale, with its own tag.
        let stored = h.cache.variants(for: [CachedRequestEngine.Plan(french, partition: nil).primaryKey])
        let storedFrench = try #require(stored.first { $0.header("ETag") == "\"fr\"" })
        #expect(storedFrench.header("Cache-Control") == "max-age=10")
        #expect(!HTTPCachePolicy.reuse(storedFrench, request: CacheControl(), staleTime: .http, now: h.engine.now).isFresh)
    }

    /// A 304 that says the resource now varies on another field moves the stored response to
    /// the key those fields give: it answers requests that differ only in the old field, and
    /// never one that differs in the new one.
    @Test func a304WithADifferentVaryReKeysTheStoredResponse_Section4_3_4() async throws {
        let h = try CacheHarness([
            .ok("the doc", headers: ["ETag": "\"v1\"", "Vary": "Accept-Language", "Cache-Control": "max-age=10"]),
            .status(304, headers: ["ETag": "\"v1\"", "Vary": "Accept-Encoding", "Cache-Control": "max-age=600"]),
            .ok("the doc, brotli", headers: ["ETag": "\"v1-br\"", "Vary": "Accept-Encoding", "Cache-Control": "max-age=600"]),
        ])
        let english = Read("/doc", headers: ["Accept-Language": "en", "Accept-Encoding": "gzip"])
        _ = try await h.engine.response(for: english, mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        let revalidated = try await h.engine.response(for: english, mode: .online, staleTime: .http)
        #expect(revalidated.source == .cache && h.body(revalidated) == "the doc")
        // Another language, the same encoding: the stored response answers it now.
        let french = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "fr", "Accept-Encoding": "gzip"]), mode: .online, staleTime: .http)
        #expect(french.source == .cache && h.body(french) == "the doc")
        // Another encoding: not the stored response's to answer.
        let brotli = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "en", "Accept-Encoding": "br"]), mode: .online, staleTime: .http)
        #expect(brotli.source == .network && h.body(brotli) == "the doc, brotli")
        #expect(h.session.callCount == 3)
        let stored = h.cache.variants(for: [CachedRequestEngine.Plan(english, partition: nil).primaryKey], counting: false)
        #expect(stored.allSatisfy { $0.varyNames == ["accept-encoding"] } && stored.count == 2)
    }

    @Test func a304WithTheStoredStrongValidatorFreshensItAndKeepsItsBody_Section4_3_4() async throws {
        let h = try CacheHarness([
            .ok("the body", headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=10", "X-Version": "1"]),
            .status(304, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=600", "X-Version": "2", "Set-Cookie": "s=1"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        let revalidated = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(revalidated.source == .cache && !revalidated.isStale && h.body(revalidated) == "the body")
        #expect(revalidated.response.value(forHTTPHeaderField: "X-Version") == "2")
        #expect(revalidated.response.value(forHTTPHeaderField: "Set-Cookie") == "s=1")  // the 304's, to its caller only
        h.clock.advance(by: .seconds(500))
        let again = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(again.source == .cache && again.response.value(forHTTPHeaderField: "Set-Cookie") == nil)
        #expect(h.session.callCount == 2)
    }

    // MARK: Never stale when forbidden (§4.2.4)

    @Test(arguments: ["no-cache", "must-revalidate, max-age=1"])
    func aResponseThatForbidsStaleIsNeverServedStaleInAnyMode_Section4_2_4(directive: String) async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": directive, "ETag": "\"v1\""]), .urlError(.cannotConnectToHost)])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .seconds(60))
        h.clock.advance(by: .seconds(5))
        // The origin cannot be reached: an error, not the stored response.
        await #expect(throws: NetworkError.self) { try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .seconds(60)) }
        await #expect(throws: NetworkError.self) { try await h.engine.response(for: Read("/doc"), mode: .offlineFirst, staleTime: .seconds(60)) }
        // Offline, offline-first, never touching the network: a 504, not the stored response.
        await h.monitor.setConnected(false)
        let offline = try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "only-if-cached"]), mode: .offlineFirst, staleTime: .seconds(60))
        #expect(offline.response.statusCode == 504 && offline.data.isEmpty)
        // A stream yields nothing from the store either: it waits for the network.
        let stream = h.engine.responses(for: Read("/doc"), mode: .offlineFirst, staleTime: .seconds(60))
        let reader = Task {
            var iterator = stream.makeAsyncIterator()
            return try await iterator.next()?.source
        }
        while await h.monitor.subscriberCount == 0 { await Task.yield() }
        reader.cancel()
        let shown = try? await reader.value
        #expect(shown == nil)
        #expect(h.session.callCount == 3)
    }

    @Test func aNoCacheResponseIsStoredButRevalidatedBeforeEveryUse_Section5_2_2_4() async throws {
        let h = try CacheHarness([
            .ok("v1", headers: ["Cache-Control": "no-cache, max-age=600", "ETag": "\"v1\""]),
            .status(304, headers: ["ETag": "\"v1\""]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        for round in 2...3 {
            let answer = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
            #expect(answer.source == .cache && h.body(answer) == "v1")
            #expect(h.session.requests.last?.value(forHTTPHeaderField: "If-None-Match") == "\"v1\"")
            #expect(h.session.callCount == round)
        }
    }

    @Test func aQualifiedNoCacheWithholdsItsFieldsUntilRevalidated_Section5_2_2_4() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "no-cache=\"X-Secret\", max-age=600", "X-Secret": "s", "X-Open": "o"])])
        let first = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(first.response.value(forHTTPHeaderField: "X-Secret") == "s")
        let reused = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(reused.source == .cache && reused.response.value(forHTTPHeaderField: "X-Secret") == nil)
        #expect(reused.response.value(forHTTPHeaderField: "X-Open") == "o")
    }

    // MARK: Freshness (§4.2)

    @Test func theDefaultForSendFollowsHTTPFreshness_Section4_2_1() async throws {
        let h = try CacheHarness([
            .ok("long", headers: ["Cache-Control": "max-age=86400"]),
            .ok("silent"),
            .ok("silent 2"),
        ])
        _ = try await h.engine.send(Read("/long"))
        h.clock.advance(by: .seconds(3_600))
        let (long, _) = try await h.engine.send(Read("/long"))  // fresh for a day: no request
        #expect(String(decoding: long, as: UTF8.self) == "long" && h.session.callCount == 1)
        _ = try await h.engine.send(Read("/silent"))
        let (silent, _) = try await h.engine.send(Read("/silent"))  // no freshness information: stale at once
        #expect(String(decoding: silent, as: UTF8.self) == "silent 2" && h.session.callCount == 3)
    }

    @Test func anAppStaleTimeIsAnUpperBoundThatStandsInWhenHTTPSaysNothing() async throws {
        let h = try CacheHarness([.ok("explicit", headers: ["Cache-Control": "max-age=600"]), .ok("silent"), .ok("again")])
        _ = try await h.engine.response(for: Read("/explicit"), mode: .online, staleTime: .seconds(60))
        _ = try await h.engine.response(for: Read("/silent"), mode: .online, staleTime: .seconds(60))
        h.clock.advance(by: .seconds(59))
        #expect(try await h.engine.response(for: Read("/silent"), mode: .online, staleTime: .seconds(60)).source == .cache)
        #expect(try await h.engine.response(for: Read("/silent"), mode: .online, staleTime: .http(atMost: .seconds(60))).source == .network)
        h.clock.advance(by: .seconds(2))
        #expect(try await h.engine.response(for: Read("/explicit"), mode: .online, staleTime: .http).source == .cache)
        #expect(try await h.engine.response(for: Read("/explicit"), mode: .online, staleTime: .seconds(60)).source == .network)
    }

    @Test func heuristicFreshnessReusesALastModifiedResponse_Section4_2_2() async throws {
        let h = try CacheHarness([
            .ok("old document", headers: ["Last-Modified": Self.date(-10 * 86_400), "Date": Self.date(0)]),
            .ok("new document", headers: ["Last-Modified": Self.date(-10 * 86_400), "Date": Self.date(0)]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(86_400 - 60))  // 10 % of ten days: one day
        #expect(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http).source == .cache)
        h.clock.advance(by: .seconds(120))
        let revalidated = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(revalidated.source == .network && h.body(revalidated) == "new document")
        #expect(h.session.requests[1].value(forHTTPHeaderField: "If-Modified-Since") != nil)
    }

    @Test func theAgeImpliedByDateCountsAndEveryStoredAnswerCarriesItsAge_Section4_2_3() async throws {
        let h = try CacheHarness([
            .ok("v1", headers: ["Cache-Control": "max-age=300", "Date": Self.date(-200)]),
            .ok("v2", headers: ["Cache-Control": "max-age=300", "Age": "7200, 0"]),
        ])
        _ = try await h.engine.response(for: Read("/dated"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(50))
        let aged = try await h.engine.response(for: Read("/dated"), mode: .online, staleTime: .http)
        #expect(aged.source == .cache)
        let age = try #require(aged.response.value(forHTTPHeaderField: "Age").flatMap { Int($0) })
        #expect((250...252).contains(age))  // 200 s old on arrival (its Date), 50 s since
        h.clock.advance(by: .seconds(60))  // 310 s: stale, although received only 110 s ago
        #expect(try await h.engine.response(for: Read("/dated"), mode: .online, staleTime: .http).source == .network)
        // §5.1: a list-valued Age counts as its first member (7200): stale on arrival.
        _ = try await h.engine.response(for: Read("/listed"), mode: .online, staleTime: .http)
        #expect(try await h.engine.response(for: Read("/listed"), mode: .online, staleTime: .http).source == .network)
        #expect(h.session.callCount == 4)
    }

    // MARK: Request directives (§5.2.1)

    @Test(arguments: [["Cache-Control": "no-cache"], ["Cache-Control": "max-age=0"], ["Pragma": "no-cache"]])
    func aRequestThatAsksForValidationRevalidatesAFreshStoredResponse_Section5_2_1(headers: [String: String]) async throws {
        let h = try CacheHarness([
            .ok("v1", headers: ["Cache-Control": "max-age=600", "ETag": "\"v1\""]),
            .status(304, headers: ["ETag": "\"v1\""]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let answer = try await h.engine.response(for: Read("/doc", headers: headers), mode: .online, staleTime: .http)
        #expect(answer.source == .cache && h.body(answer) == "v1" && h.session.callCount == 2)
        #expect(h.session.requests[1].value(forHTTPHeaderField: "If-None-Match") == "\"v1\"")
    }

    @Test func requestMaxStaleAndMinFreshMoveTheLine_Section5_2_1_2_and_5_2_1_3() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=100"]), .ok("v2", headers: ["Cache-Control": "max-age=100"])])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(150))
        let stale = try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "max-stale=60"]), mode: .online, staleTime: .http)
        #expect(stale.source == .cache && stale.isStale && h.session.callCount == 1)
        let fresh = try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "max-stale=10"]), mode: .online, staleTime: .http)
        #expect(fresh.source == .network && h.body(fresh) == "v2")
        h.clock.advance(by: .seconds(50))  // 50 s left
        #expect(try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "min-fresh=40"]), mode: .online, staleTime: .http).source == .cache)
        #expect(try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "min-fresh=60"]), mode: .online, staleTime: .http).source == .network)
    }

    @Test func onlyIfCachedAnswersFromTheStoreOrWithA504AndNeverUsesTheNetwork_Section5_2_1_7() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=100"])], connected: false)
        let onlyIfCached = ["Cache-Control": "only-if-cached"]
        // Offline and nothing stored: a 504 at once, not a wait.
        let missing = try await h.engine.response(for: Read("/doc", headers: onlyIfCached), mode: .online, staleTime: .http)
        #expect(missing.response.statusCode == 504 && missing.source == .cache)
        do {
            try await h.engine.send(Read("/doc", headers: onlyIfCached))
            Issue.record("send answered a 504 without throwing")
        } catch let error as NetworkError {
            #expect(error.statusCode == 504)
        }
        await h.monitor.setConnected(true)
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let stored = try await h.engine.response(for: Read("/doc", headers: onlyIfCached), mode: .always, staleTime: .http)
        #expect(stored.source == .cache && h.body(stored) == "v1")
        h.clock.advance(by: .seconds(200))
        let stale = try await h.engine.response(for: Read("/doc", headers: onlyIfCached), mode: .online, staleTime: .http)
        #expect(stale.response.statusCode == 504)
        #expect(h.session.callCount == 1)
    }

    @Test func requestNoStoreNeitherStoresNorIsAnsweredFromTheStore_Section5_2_1_5() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=600"]), .ok("secret", headers: ["Cache-Control": "max-age=600"])])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let secret = try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "no-store"]), mode: .online, staleTime: .http)
        #expect(secret.source == .network && h.body(secret) == "secret")
        #expect(h.body(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)) == "v1")
        #expect(!(await h.bytesOnDisk()).contains("secret"))
    }

    // MARK: Storing (§3, §4.1)

    @Test func statusesHTTPAllowsAreStoredAndOthersAreNot_Section3() async throws {
        let h = try CacheHarness([
            .status(404, headers: ["Last-Modified": Self.date(-86_400), "Date": Self.date(0)]),
            .status(201),
            .status(201, headers: ["Cache-Control": "max-age=600"]),
            .respond(status: 206, headers: ["Cache-Control": "max-age=600", "Content-Range": "bytes 0-0/9"], body: Data("a".utf8)),
            .status(500),
        ])
        for path in ["/gone", "/created", "/created-fresh", "/partial", "/broken"] {
            _ = try await h.engine.response(for: Read(path), mode: .online, staleTime: .http)
        }
        await h.cache.waitForWrites()
        #expect(h.cache.count == 2)  // the 404 (heuristically cacheable) and the 201 with max-age
        let gone = try await h.engine.response(for: Read("/gone"), mode: .online, staleTime: .http)
        #expect(gone.source == .cache && gone.response.statusCode == 404)  // heuristically fresh for 2.4 h
        #expect(try await h.engine.response(for: Read("/created-fresh"), mode: .online, staleTime: .http).response.statusCode == 201)
        #expect(h.session.callCount == 5)
    }

    @Test(arguments: [500, 502, 503, 504])
    func aServerErrorNeverReplacesTheStoredResponseEvenWithFreshness(status: Int) async throws {
        let h = try CacheHarness([
            .ok("good", headers: ["Cache-Control": "max-age=10"]),
            .status(status, headers: ["Cache-Control": "private, max-age=600"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        let failing = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(failing.source == .cache && failing.isStale && h.body(failing) == "good")  // stale-if-error
        await h.cache.waitForWrites()
        await h.monitor.setConnected(false)
        let offline = try await h.engine.response(for: Read("/doc"), mode: .offlineFirst, staleTime: .http)
        #expect(offline.response.statusCode == 200 && h.body(offline) == "good")
    }

    @Test func fieldsNamedInConnectionAndSetCookieAreNotStored_Section3_1() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=60", "Connection": "X-Hop", "X-Hop": "hop-value", "X-End": "e"])])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let reused = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(reused.source == .cache && reused.response.value(forHTTPHeaderField: "X-Hop") == nil)
        #expect(reused.response.value(forHTTPHeaderField: "X-End") == "e")
        #expect(!(await h.bytesOnDisk()).contains("hop-value"))
    }

    @Test func variantsOfOneURLAreKeptSideBySideAndComparedNormalised_Section4_1() async throws {
        let vary = ["Vary": "Accept-Language", "Cache-Control": "max-age=600"]
        let h = try CacheHarness([.ok("english", headers: vary), .ok("french", headers: vary)])
        _ = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "en, de"]), mode: .online, staleTime: .http)
        _ = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "fr"]), mode: .online, staleTime: .http)
        let english = try await h.engine.response(for: Read("/doc", headers: ["accept-language": " DE ,en"]), mode: .online, staleTime: .http)
        let french = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "fr"]), mode: .online, staleTime: .http)
        #expect(english.source == .cache && h.body(english) == "english")
        #expect(french.source == .cache && h.body(french) == "french")
        #expect(h.session.callCount == 2)
    }

    @Test func aURLKeepsAtMostEightVariantsDroppingTheOldest() async throws {
        let h = try CacheHarness([.ok("variant", headers: ["Vary": "X-Variant", "Cache-Control": "max-age=600"])])
        for variant in 0..<12 {  // all stored at the same manual-clock instant: the order of storing decides
            _ = try await h.engine.response(for: Read("/doc", headers: ["X-Variant": "\(variant)"]), mode: .online, staleTime: .http)
        }
        await h.cache.waitForWrites()
        #expect(h.cache.count == DiskResponseCache.maxVariants)
        for kept in 4..<12 {
            #expect(try await h.engine.response(for: Read("/doc", headers: ["X-Variant": "\(kept)"]), mode: .online, staleTime: .http).source == .cache, "variant \(kept)")
        }
        #expect(try await h.engine.response(for: Read("/doc", headers: ["X-Variant": "3"]), mode: .online, staleTime: .http).source == .network)
        #expect(h.session.callCount == 13)
    }

    @Test func aNewResponseReplacesTheVariantsItsRequestWouldHaveSelected_Section4_1() async throws {
        let h = try CacheHarness([
            .ok("by language", headers: ["Vary": "Accept-Language", "Cache-Control": "max-age=1"]),
            .ok("for everyone", headers: ["Cache-Control": "max-age=600"]),
        ])
        _ = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "en"]), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(5))
        _ = try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "en"]), mode: .online, staleTime: .http)
        await h.cache.waitForWrites()
        #expect(h.cache.count == 1)
        #expect(h.body(try await h.engine.response(for: Read("/doc", headers: ["Accept-Language": "de"]), mode: .online, staleTime: .http)) == "for everyone")
    }

    // MARK: HEAD (§4.3.5)

    @Test func aHEADResponseFreshensTheStoredGETItDescribes_Section4_3_5() async throws {
        let h = try CacheHarness([
            .ok("the body", headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=10", "X-Version": "1"]),
            .status(200, headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=600", "X-Version": "2"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        let head = try await h.engine.response(for: Read("/doc", method: .head), mode: .online, staleTime: .http)
        #expect(head.source == .network && h.session.requests[1].httpMethod == "HEAD")
        await h.cache.waitForWrites()
        let get = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(get.source == .cache && !get.isStale && h.body(get) == "the body")
        #expect(get.response.value(forHTTPHeaderField: "X-Version") == "2")
        #expect(h.session.callCount == 2)
    }

    @Test func aHEADResponseThatDisagreesMarksTheStoredGETStale_Section4_3_5() async throws {
        let h = try CacheHarness([
            .ok("the body", headers: ["ETag": "\"v1\"", "Cache-Control": "max-age=600"]),
            .status(200, headers: ["ETag": "\"v2\"", "Cache-Control": "max-age=600"]),
            .ok("new body", headers: ["ETag": "\"v2\"", "Cache-Control": "max-age=600"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        _ = try await h.engine.response(for: Read("/doc", method: .head, headers: ["Cache-Control": "no-cache"]), mode: .online, staleTime: .http)
        let get = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(get.source == .network && h.body(get) == "new body")
    }

    @Test func aHEADIsAnsweredFromAFreshStoredGETWithoutItsBody() async throws {
        let h = try CacheHarness([.ok("the body", headers: ["Cache-Control": "max-age=600", "X-A": "1"])])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let head = try await h.engine.response(for: Read("/doc", method: .head), mode: .online, staleTime: .http)
        #expect(head.source == .cache && head.data.isEmpty && head.response.value(forHTTPHeaderField: "X-A") == "1")
        #expect(h.session.callCount == 1)
    }

    // MARK: Invalidation (§4.4)

    @Test func aSuccessfulUnsafeRequestMarksItsURLAndItsSameOriginLocationsStale_Section4_4() async throws {
        let fresh = ["Cache-Control": "max-age=600"]
        let h = try CacheHarness([
            .ok("item", headers: fresh), .ok("list", headers: fresh), .ok("other", headers: fresh), .ok("elsewhere", headers: fresh),
            .status(201, headers: ["Location": "/items/list", "Content-Location": "https://cdn.example.test/x"]),
            .ok("refetched", headers: fresh),
        ])
        for path in ["/items/1", "/items/list", "/other"] { _ = try await h.engine.response(for: Read(path), mode: .online, staleTime: .http) }
        let elsewhere = Read("/x", headers: [:], host: "https://cdn.example.test")
        _ = try await h.engine.response(for: elsewhere, mode: .online, staleTime: .http)
        _ = try await h.engine.send(Read("/items/1", method: .post))
        await h.cache.waitForWrites()
        #expect(try await h.engine.response(for: Read("/items/1"), mode: .online, staleTime: .http).source == .network)
        #expect(try await h.engine.response(for: Read("/items/list"), mode: .online, staleTime: .http).source == .network)
        #expect(try await h.engine.response(for: Read("/other"), mode: .online, staleTime: .http).source == .cache)
        #expect(try await h.engine.response(for: elsewhere, mode: .online, staleTime: .http).source == .cache)  // another origin
    }

    @Test func aReadRightAfterAMutationIsRevalidatedEvenWithinStaleWhileRevalidate_Section4_4() async throws {
        let h = try CacheHarness([
            .ok("before", headers: ["Cache-Control": "max-age=600, stale-while-revalidate=3600"]),
            .status(201),
            .ok("after", headers: ["Cache-Control": "max-age=600"]),
        ])
        _ = try await h.engine.response(for: Read("/list"), mode: .online, staleTime: .http)
        _ = try await h.engine.send(Read("/list", method: .post))
        let read = try await h.engine.response(for: Read("/list", headers: ["Cache-Control": "max-stale"]), mode: .online, staleTime: .http)
        #expect(read.source == .network && h.body(read) == "after")
    }

    @Test func anInvalidatedReadIsStillShownOfflineAndAFailedMutationInvalidatesNothing_Section4_4() async throws {
        let h = try CacheHarness([.ok("list", headers: ["Cache-Control": "max-age=600"]), .status(500), .status(204)])
        _ = try await h.engine.response(for: Read("/list"), mode: .online, staleTime: .http)
        _ = try? await h.engine.send(Read("/list", method: .put))
        #expect(try await h.engine.response(for: Read("/list"), mode: .online, staleTime: .http).source == .cache)
        _ = try await h.engine.send(Read("/list", method: .put))
        await h.cache.waitForWrites()
        await h.monitor.setConnected(false)
        let shown = try await h.engine.response(for: Read("/list"), mode: .offlineFirst, staleTime: .http)
        #expect(shown.source == .cache && shown.isStale && h.body(shown) == "list")
    }

    @Test func storedResponseAnswersFromTheStoreAloneAndMarkStaleKeepsWhatItMarks() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=60"]), .ok("v2", headers: ["Cache-Control": "max-age=60"])])
        #expect(h.engine.storedResponse(for: Read("/doc"), staleTime: .http) == nil)
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        let fresh = try #require(h.engine.storedResponse(for: Read("/doc"), staleTime: .http))
        #expect(h.body(fresh) == "v1" && !fresh.isStale && fresh.source == .cache)
        #expect(h.engine.markStale { _, url in url.path == "/doc" } == 1)
        let marked = try #require(h.engine.storedResponse(for: Read("/doc"), staleTime: .http))
        #expect(h.body(marked) == "v1" && marked.isStale)  // kept, to show offline
        #expect(h.session.callCount == 1)  // neither call sent anything
        #expect(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http).source == .network)
    }

    /// A first fetch in flight when the URL is marked stale (a write to it was just delivered)
    /// may carry the state from before the write: with nothing stored yet, `markStale(where:)`
    /// must still reach it, so that what it brings is stored stale, not served as fresh after.
    @Test(arguments: [false, true])
    func aFetchInFlightWhenItsURLIsMarkedStaleOrInvalidatedStoresItsAnswerStale_Section4_4(invalidating: Bool) async throws {
        let h = try CacheHarness([.held(.ok("before the write", headers: ["Cache-Control": "max-age=600"])), .ok("after", headers: ["Cache-Control": "max-age=600"])])
        let first = Task { try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http) }
        await h.session.waitForCalls(1)
        if invalidating {
            #expect(h.cache.invalidate { _, url in url.path == "/doc" } == 0)  // nothing stored yet
        } else {
            #expect(h.engine.markStale { _, url in url.path == "/doc" } == 0)
        }
        h.session.releaseHeld()
        #expect(h.body(try await first.value) == "before the write")  // the caller that asked before gets it
        let stored = try #require(h.engine.storedResponse(for: Read("/doc"), staleTime: .http))
        #expect(stored.isStale)  // kept to show offline, never fresh
        let next = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(next.source == .network && h.body(next) == "after")
    }

    // MARK: RFC 5861

    @Test func staleWhileRevalidateServesAtOnceAndRefreshesInTheBackground_RFC5861_Section3() async throws {
        let h = try CacheHarness([
            .ok("v1", headers: ["Cache-Control": "max-age=10, stale-while-revalidate=60", "ETag": "\"v1\""]),
            .ok("v2", headers: ["Cache-Control": "max-age=10, stale-while-revalidate=60", "ETag": "\"v2\""]),
            .ok("v3", headers: ["Cache-Control": "max-age=10"]),
        ])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(30))
        let stale = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(stale.source == .cache && stale.isStale && h.body(stale) == "v1")
        await h.engine.waitForBackgroundRevalidations()
        #expect(h.session.requests[1].value(forHTTPHeaderField: "If-None-Match") == "\"v1\"")
        #expect(h.body(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)) == "v2")
        h.clock.advance(by: .seconds(100))  // past the window: the read waits for the network
        let late = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(late.source == .network && h.body(late) == "v3")
    }

    @Test func staleIfErrorEndsServingStaleOnErrorsAfterItsWindow_RFC5861_Section4() async throws {
        let h = try CacheHarness([.ok("v1", headers: ["Cache-Control": "max-age=10, stale-if-error=30"]), .status(500)])
        _ = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        h.clock.advance(by: .seconds(20))
        #expect(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http).source == .cache)
        h.clock.advance(by: .seconds(30))  // 40 s past its lifetime
        #expect(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http).response.statusCode == 500)
        // The request's own window decides first.
        let strict = try await h.engine.response(for: Read("/doc", headers: ["Cache-Control": "stale-if-error=1"]), mode: .online, staleTime: .seconds(5))
        #expect(strict.response.statusCode == 500)
    }

    /// A read that found nothing stored, whose exchange then fails, serves what another read
    /// stored meanwhile (its exchange begun after a marking stale, so not shared), as it would
    /// had that been stored when it began.
    @Test func aFailedExchangeServesWhatAnotherReadStoredMeanwhileThoughNothingWasStoredAtFirst_RFC5861_Section4() async throws {
        let h = try CacheHarness([.held(.status(500)), .ok("stored meanwhile", headers: ["Cache-Control": "max-age=600"]), .status(503)])
        let first = Task { try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http) }
        await h.session.waitForCalls(1)
        _ = h.engine.markStale { _, url in url.path == "/doc" }  // a write delivered: later reads fetch anew
        let second = try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http)
        #expect(second.source == .network && h.body(second) == "stored meanwhile")
        h.session.releaseHeld()
        let answer = try await first.value
        #expect(answer.source == .cache && answer.isStale && h.body(answer) == "stored meanwhile")
        // With nothing stored at all, the failing response is the answer.
        #expect(h.cache.remove(url: Read("/doc").url) == 1)
        #expect(try await h.engine.response(for: Read("/doc"), mode: .online, staleTime: .http).response.statusCode == 503)
    }
}
