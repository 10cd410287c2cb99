import Foundation
import Retry
import Testing

@testable import ResponseCache

/// RFC 9111's rules as pure functions: directive parsing, freshness, age, validation, `Vary`.
/// Each test names the section it pins.
@Suite("HTTP caching rules (RFC 9111, RFC 5861) as pure functions")
struct HTTPCachePolicyTests {
    static let received = Date(timeIntervalSince1970: 1_800_000_000)

    static func stored(
        _ headers: [String: String], status: Int = 200, etag: String? = nil, storedAt: Date = received, initialAge: Double = 0,
        varyNames: [String] = [], requestHeaders: [String: String] = [:]
    ) -> StoredResponse {
        var headers = headers
        if let etag { headers["ETag"] = etag }
        let primary = CacheDigest("GET\nhttps://example.test/r\n")
        let digest = HTTPCachePolicy.varyDigest(names: varyNames, requestHeaders: requestHeaders)
        return StoredResponse(
            key: StoredResponse.variantKey(primary: primary, varyNames: varyNames, varyDigest: digest), primaryKey: primary,
            method: "GET", url: "https://example.test/r", partition: nil, storedAt: storedAt, initialAge: initialAge,
            statusCode: status, headers: HTTPCachePolicy.withDate(headers, receivedAt: storedAt), varyNames: varyNames,
            varyDigest: digest, body: Data("body".utf8)
        )
    }

    static func date(_ offset: Double) -> String { HTTPDate.format(received.addingTimeInterval(offset)) }

    // MARK: Cache-Control grammar (§5.2, §1.2.2)

    @Test func directivesFollowTheGrammarOfSection5_2() {
        let parsed = CacheControl("public, MAX-AGE=\"120\", no-cache, must-revalidate, stale-if-error=300, stale-while-revalidate=30")
        #expect(parsed.maxAge == .value(120))  // §5.2: a quoted argument is accepted
        #expect(parsed.isPublic && parsed.noCache && parsed.mustRevalidate && !parsed.noStore)
        #expect(parsed.staleIfError == 300 && parsed.staleWhileRevalidate == 30)
        #expect(CacheControl("No-StOrE").noStore)
        #expect(CacheControl("max-age=003600").maxAge == .value(3600))
        // No whitespace around "=": not a valid max-age.
        #expect(CacheControl("max-age =100").maxAge == .absent)
        #expect(CacheControl("max-age= 100").maxAge == .invalid)
        // A quoted string is one directive, whatever commas or names it holds.
        #expect(CacheControl("extension=\"max-age=100, no-store\", max-age=1").maxAge == .value(1))
        #expect(!CacheControl("private=\"a, no-store\"").noStore)
        #expect(
            CacheControl(",,, , =, max-age")
                == {
                    var control = CacheControl()
                    control.maxAge = .invalid
                    return control
                }())
    }

    @Test func anInvalidOrConflictingMaxAgeIsInvalidNotAbsent_Section4_2_1() {
        for value in ["-100", "'3600'", "a100", "100a", "3600.0", "", "1 2"] {
            #expect(CacheControl("max-age=\(value)").maxAge == .invalid, "max-age=\(value)")
        }
        #expect(CacheControl("max-age=10, max-age=10").maxAge == .value(10))
        #expect(CacheControl(["max-age=1800", "max-age=1"]).maxAge == .invalid)
        #expect(CacheControl("max-age=99999999999999999999999").maxAge == .value(2_147_483_648))  // §1.2.2 saturates
    }

    @Test func qualifiedNoCacheListsFieldsInsteadOfForbiddingReuse_Section5_2_2_4() {
        let qualified = CacheControl("no-cache=\"Set-Foo, X-Bar\", max-age=60")
        #expect(!qualified.noCache && qualified.noCacheFields == ["set-foo", "x-bar"])
        #expect(CacheControl("no-cache").noCache)
    }

    @Test func requestDirectivesAndPragmaNoCache_Section5_4() {
        let request = HTTPCachePolicy.requestDirectives(["Cache-Control": "max-stale, min-fresh=5, only-if-cached"])
        #expect(request.maxStale == .max && request.minFresh == 5 && request.onlyIfCached)
        #expect(HTTPCachePolicy.requestDirectives(["Pragma": "no-cache"]).noCache)
        // Pragma counts only when the request has no Cache-Control.
        #expect(!HTTPCachePolicy.requestDirectives(["Pragma": "no-cache", "Cache-Control": "max-stale"]).noCache)
    }

    @Test func aCacheControlOfThousandsOfDirectivesIsParsedInOnePass() {
        let hostile = Array(repeating: "x-junk=\"a,b\"", count: 20_000).joined(separator: ", ") + ", max-age=5"
        #expect(CacheControl(hostile).maxAge == .value(5))
        #expect(CacheControl(String(repeating: "\"", count: 50_000)) == CacheControl())
    }

    // MARK: Freshness (§4.2.1, §4.2.2)

    @Test func explicitLifetimeIsMaxAgeElseExpiresMinusDate_Section4_2_1() {
        let maxAge = Self.stored(["Cache-Control": "max-age=600", "Expires": Self.date(10), "Date": Self.date(0)])
        #expect(HTTPCachePolicy.freshnessLifetime(maxAge, staleTime: .http) == .seconds(600))
        let expires = Self.stored(["Expires": Self.date(90), "Date": Self.date(0)])
        #expect(HTTPCachePolicy.freshnessLifetime(expires, staleTime: .http) == .seconds(90))
        // §5.3: an invalid Expires (such as "0") means already expired; so does a repeated one.
        #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(["Expires": "0"]), staleTime: .http) == .zero)
        #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(["Expires": Self.date(90) + ", " + Self.date(900)]), staleTime: .http) == .zero)
        // An invalid max-age is stale even when Expires or the app's staleTime would say fresh.
        let invalid = Self.stored(["Cache-Control": "max-age=-1", "Expires": Self.date(900)])
        #expect(HTTPCachePolicy.freshnessLifetime(invalid, staleTime: .http) == .zero)
        #expect(HTTPCachePolicy.freshnessLifetime(invalid, staleTime: .seconds(60)) == .zero)
    }

    @Test func staleTimeCombinesWithHTTPAsDocumented() {
        let long = Self.stored(["Cache-Control": "max-age=600"])
        let silent = Self.stored([:])
        let heuristic = Self.stored(["Last-Modified": Self.date(-10 * 86_400)])
        let noCache = Self.stored(["Cache-Control": "no-cache, max-age=600"])
        func lifetime(_ stored: StoredResponse, _ staleTime: StaleTime) -> Duration { HTTPCachePolicy.freshnessLifetime(stored, staleTime: staleTime) }
        #expect([lifetime(long, .http), lifetime(silent, .http), lifetime(heuristic, .http), lifetime(noCache, .http)] == [.seconds(600), .zero, .seconds(86_400), .zero])
        #expect(
            [lifetime(long, .seconds(60)), lifetime(silent, .seconds(60)), lifetime(heuristic, .seconds(60)), lifetime(noCache, .seconds(60))] == [.seconds(60), .seconds(60), .seconds(60), .zero])
        #expect([lifetime(long, .http(atMost: .seconds(60))), lifetime(silent, .http(atMost: .seconds(60))), lifetime(heuristic, .http(atMost: .seconds(60)))] == [.seconds(60), .zero, .seconds(60)])
        #expect(lifetime(long, .zero) == .zero)
    }

    @Test func heuristicFreshnessOnlyForStatusesThatAllowItOrPublic_Section4_2_2() {
        let lastModified = ["Last-Modified": Self.date(-1_000), "Date": Self.date(0)]
        for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
            #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(lastModified, status: status), staleTime: .http) == .seconds(100), "\(status)")
        }
        for status in [201, 202, 302, 307, 403, 500, 502, 503, 504, 599] {
            #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(lastModified, status: status), staleTime: .http) == .zero, "\(status)")
        }
        var publicHeaders = lastModified
        publicHeaders["Cache-Control"] = "public"
        #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(publicHeaders, status: 599), staleTime: .http) == .seconds(100))
        // Capped at 7 days; a Last-Modified after Date gives nothing.
        let ancient = Self.stored(["Last-Modified": "Mon, 01 Jan 1990 00:00:00 GMT", "Date": Self.date(0)])
        #expect(HTTPCachePolicy.freshnessLifetime(ancient, staleTime: .http) == .seconds(7 * 86_400))
        #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(["Last-Modified": Self.date(500), "Date": Self.date(0)]), staleTime: .http) == .zero)
    }

    @Test func whatMayBeStoredByAPrivateCache_Section3() {
        func mayStore(_ status: Int, _ headers: [String: String]) -> Bool {
            HTTPCachePolicy.mayStore(status: status, headers: headers, control: HTTPCachePolicy.cacheControl(headers))
        }
        #expect(mayStore(200, [:]) && mayStore(404, [:]) && mayStore(301, [:]) && mayStore(204, [:]))
        #expect(!mayStore(201, [:]) && !mayStore(500, [:]) && !mayStore(302, [:]))
        #expect(mayStore(201, ["Cache-Control": "max-age=60"]) && mayStore(500, ["Expires": "0"]) && mayStore(302, ["Cache-Control": "private"]))
        #expect(mayStore(599, ["Cache-Control": "public"]))
        #expect(!mayStore(200, ["Cache-Control": "no-store, max-age=60"]))
        #expect(!mayStore(206, ["Cache-Control": "max-age=60"]) && !mayStore(304, ["Cache-Control": "max-age=60"]))
        // §5.2.2.3: must-understand stores an understood status despite no-store, and no other.
        #expect(mayStore(200, ["Cache-Control": "must-understand, no-store, max-age=60"]))
        #expect(!mayStore(299, ["Cache-Control": "must-understand, no-store, max-age=60"]))
    }

    @Test func hopByHopFieldsAndThoseNamedInConnectionAreNotStored_Section3_1() {
        let kept = HTTPCachePolicy.storableHeaders([
            "Connection": "close, X-Secret-Hop", "X-Secret-Hop": "1", "Keep-Alive": "5", "Transfer-Encoding": "chunked",
            "Set-Cookie": "a=b", "Proxy-Authentication-Info": "x", "Content-Length": "4", "Age": "3", "X-Kept": "yes",
        ])
        #expect(kept == ["X-Kept": "yes"])
    }

    // MARK: Age (§4.2.3, §5.1)

    @Test func ageIsTheLargerOfWhatDateImpliesAndAgePlusTheExchangesDuration_Section4_2_3() {
        let sent = Self.received.addingTimeInterval(-2)  // the exchange took 2 s
        // Date 100 s before receipt: 100 s old, even without an Age.
        #expect(HTTPCachePolicy.correctedInitialAge(["Date": Self.date(-100)], requestTime: sent, responseTime: Self.received) == 100)
        // Age 50 plus the 2 s the exchange took, larger than Date's 10.
        #expect(HTTPCachePolicy.correctedInitialAge(["Date": Self.date(-10), "Age": "50"], requestTime: sent, responseTime: Self.received) == 52)
        // Clock skew: the server's Date is an hour ahead of ours; that implies no age at all.
        #expect(HTTPCachePolicy.correctedInitialAge(["Date": Self.date(3_600)], requestTime: sent, responseTime: Self.received) == 2)
        // And an hour behind: it is an hour old.
        #expect(HTTPCachePolicy.correctedInitialAge(["Date": Self.date(-3_600)], requestTime: sent, responseTime: Self.received) == 3_600)
    }

    @Test func anAgeListIsReadAsItsFirstMemberAndAnInvalidAgeIsIgnored_Section5_1() {
        func age(_ value: String) -> Double {
            HTTPCachePolicy.correctedInitialAge(["Age": value, "Date": Self.date(0)], requestTime: Self.received, responseTime: Self.received)
        }
        #expect(age("7200, 0") == 7_200 && age("0, 7200") == 0 && age(" 30 ") == 30)
        #expect(age("abc") == 0 && age("-7200") == 0 && age("7200.0") == 0 && age("") == 0)
        #expect(age("2147483649") == 2_147_483_648)  // saturated, never trapping
        #expect(age("999999999999999999999999999999") == 2_147_483_648)
    }

    @Test func currentAgeAddsTheTimeSinceReceiptAndIgnoresAClockThatWentBackwards() {
        let stored = Self.stored([:], initialAge: 40)
        #expect(HTTPCachePolicy.currentAge(of: stored, now: Self.received.addingTimeInterval(20)) == .seconds(60))
        #expect(HTTPCachePolicy.currentAge(of: stored, now: Self.received.addingTimeInterval(-500)) == .seconds(40))
    }

    @Test func hostileDatesNeverTrap() {
        for text in ["Fri, 31 Dec 99999 23:59:59 GMT", "Sat, 01 Jan 0001 00:00:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT", "\u{0}", String(repeating: "9", count: 10_000)] {
            let stored = Self.stored(["Expires": text, "Last-Modified": text, "Date": text])
            _ = HTTPCachePolicy.freshnessLifetime(stored, staleTime: .http)
            _ = HTTPCachePolicy.correctedInitialAge(stored.headers, requestTime: Self.received, responseTime: Self.received)
        }
        let farFuture = Self.stored(["Expires": "Fri, 31 Dec 9999 23:59:59 GMT", "Date": Self.date(0)])
        #expect(HTTPCachePolicy.freshnessLifetime(farFuture, staleTime: .http) == HTTPCachePolicy.maximumDelta)
        #expect(HTTPDate.format(Date(timeIntervalSince1970: 784_111_777)) == "Sun, 06 Nov 1994 08:49:37 GMT")
        // RFC 9110 §5.6.7: one space between fields; day and month names compared without case.
        #expect(HTTPDate.parse("Sun,  06 Nov 1994 08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("Sun, 06 Nov 1994  08:49:37 GMT") == nil)
        #expect(HTTPDate.parse("sun, 06 NOV 1994 08:49:37 GMT") == Date(timeIntervalSince1970: 784_111_777))
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 1994") == Date(timeIntervalSince1970: 784_111_777))
        #expect(HTTPDate.parse("Sun Nov 6 08:49:37 1994") == nil)
        // An Expires that is not a date is stale; a Date that is not one counts as absent.
        #expect(HTTPCachePolicy.freshnessLifetime(Self.stored(["Expires": "Sun,  06 Nov 2050 08:49:37 GMT"]), staleTime: .http) == .zero)
        let badDate = Self.stored(["Expires": Self.date(600), "Date": "yesterday"])
        #expect(HTTPCachePolicy.freshnessLifetime(badDate, staleTime: .http) == .seconds(600))
        #expect(HTTPDate.parse(HTTPDate.format(Self.received)) == Self.received)
    }

    // MARK: Reuse (§4.2.4, §5.2.1, RFC 5861)

    @Test func requestDirectivesDecideWhatIsUsableWithoutValidation_Section5_2_1() {
        let stored = Self.stored(["Cache-Control": "max-age=100"], initialAge: 30)
        func usable(_ request: String, after seconds: Double = 0) -> Bool {
            HTTPCachePolicy.reuse(stored, request: CacheControl(request), staleTime: .http, now: Self.received.addingTimeInterval(seconds)).isUsable
        }
        #expect(usable("") && !usable("no-cache") && !usable("max-age=0") && !usable("max-age=20") && usable("max-age=40"))
        #expect(!usable("min-fresh=80") && usable("min-fresh=60") && !usable("max-age=abc"))
        #expect(!usable("", after: 80) && usable("max-stale", after: 80) && usable("max-stale=20", after: 80) && !usable("max-stale=5", after: 80))
        // An invalidated response (§4.4) is validated before use: no max-stale, no stale-while-revalidate.
        var invalidated = Self.stored(["Cache-Control": "max-age=100, stale-while-revalidate=600"])
        invalidated.isInvalidated = true
        let afterInvalidation = HTTPCachePolicy.reuse(invalidated, request: CacheControl("max-stale"), staleTime: .http, now: Self.received)
        #expect(!afterInvalidation.isUsable && !afterInvalidation.withinStaleWhileRevalidate && afterInvalidation.mayServeStale)
        // max-stale never beats must-revalidate or no-cache (§4.2.4).
        let strict = Self.stored(["Cache-Control": "max-age=100, must-revalidate"])
        #expect(!HTTPCachePolicy.reuse(strict, request: CacheControl("max-stale"), staleTime: .http, now: Self.received.addingTimeInterval(200)).isUsable)
    }

    @Test func noCacheAndMustRevalidateForbidServingStale_Section4_2_4() {
        for directive in ["no-cache", "must-revalidate, max-age=1"] {
            let reuse = HTTPCachePolicy.reuse(Self.stored(["Cache-Control": directive]), request: CacheControl(), staleTime: .seconds(60), now: Self.received.addingTimeInterval(30))
            #expect(!reuse.mayServeStale && !reuse.mayServeOnError, "\(directive)")
        }
        // proxy-revalidate and s-maxage are for shared caches.
        let shared = HTTPCachePolicy.reuse(
            Self.stored(["Cache-Control": "max-age=1, proxy-revalidate, s-maxage=1"]), request: CacheControl(), staleTime: .http, now: Self.received.addingTimeInterval(30))
        #expect(shared.mayServeStale)
    }

    @Test func staleWhileRevalidateAndStaleIfErrorHaveWindows_RFC5861() {
        let stored = Self.stored(["Cache-Control": "max-age=10, stale-while-revalidate=20, stale-if-error=60"])
        func reuse(after seconds: Double, request: String = "") -> HTTPCachePolicy.Reuse {
            HTTPCachePolicy.reuse(stored, request: CacheControl(request), staleTime: .http, now: Self.received.addingTimeInterval(seconds))
        }
        #expect(!reuse(after: 5).withinStaleWhileRevalidate)  // fresh
        #expect(reuse(after: 25).withinStaleWhileRevalidate && !reuse(after: 35).withinStaleWhileRevalidate)
        #expect(!reuse(after: 25, request: "no-cache").withinStaleWhileRevalidate)
        #expect(reuse(after: 65).mayServeOnError && !reuse(after: 75).mayServeOnError)
        // The request's own stale-if-error decides first.
        #expect(!reuse(after: 65, request: "stale-if-error=1").mayServeOnError)
        // Without stale-if-error, serving stale on errors is the app's choice (the mode).
        #expect(HTTPCachePolicy.reuse(Self.stored(["Cache-Control": "max-age=1"]), request: CacheControl(), staleTime: .http, now: Self.received.addingTimeInterval(1e6)).mayServeOnError)
    }

    // MARK: Validation (§4.3)

    @Test func validatorsAreSentAsTheServerGaveThem_Section4_3_1() {
        #expect(HTTPCachePolicy.validators(for: Self.stored([:], etag: "abc")) == ["If-None-Match": "abc"])
        #expect(HTTPCachePolicy.validators(for: Self.stored(["Last-Modified": "x"], etag: "W/\"abc\"")) == ["If-None-Match": "W/\"abc\"", "If-Modified-Since": "x"])
    }

    @Test func a304SelectsOnlyTheStoredResponsesItsValidatorsMatch_Section4_3_4() {
        let english = Self.stored([:], etag: "\"en\"", varyNames: ["accept-language"], requestHeaders: ["Accept-Language": "en"])
        let french = Self.stored([:], etag: "\"fr\"", varyNames: ["accept-language"], requestHeaders: ["Accept-Language": "fr"])
        let frenchToo = Self.stored([:], etag: "\"fr\"", varyNames: ["accept-language"], requestHeaders: ["Accept-Language": "fr-CA"])
        let variants = [english, french, frenchToo]
        #expect(HTTPCachePolicy.selectedBy304(["ETag": "\"xx\""], among: variants).isEmpty)  // matches none: update none
        #expect(HTTPCachePolicy.selectedBy304(["ETag": "\"fr\""], among: variants).map(\.key) == [french.key, frenchToo.key])
        // A weak validator picks the most recent match only.
        let weakOld = Self.stored([:], etag: "W/\"w\"", storedAt: Self.received, varyNames: ["x"], requestHeaders: ["X": "1"])
        let weakNew = Self.stored([:], etag: "W/\"w\"", storedAt: Self.received.addingTimeInterval(5), varyNames: ["x"], requestHeaders: ["X": "2"])
        #expect(HTTPCachePolicy.selectedBy304(["ETag": "W/\"w\""], among: [weakOld, weakNew]).map(\.key) == [weakNew.key])
        // A strong 304 never selects a weak stored tag.
        #expect(HTTPCachePolicy.selectedBy304(["ETag": "\"w\""], among: [weakOld]).isEmpty)
        // No validator at all: the response whose validators the cache sent, or else only a
        // single stored response without validators either.
        #expect(HTTPCachePolicy.selectedBy304([:], among: variants, nominated: french).map(\.key) == [french.key])
        #expect(HTTPCachePolicy.selectedBy304([:], among: [Self.stored([:])]).count == 1)
        #expect(HTTPCachePolicy.selectedBy304([:], among: [english]).isEmpty)
        #expect(HTTPCachePolicy.selectedBy304([:], among: [Self.stored([:]), Self.stored(["X": "1"], storedAt: Self.received.addingTimeInterval(1))]).isEmpty)
    }

    @Test func a304UpdatesStoredFieldsButNeverContentLengthOrHopByHopFields_Section3_2() {
        let stored = Self.stored(["Cache-Control": "max-age=1", "X-A": "1", "Content-Type": "text/plain"])
        let refreshed = HTTPCachePolicy.refreshed(
            stored, with: ["cache-control": "max-age=60", "X-A": "2", "Content-Length": "999", "Connection": "x-b", "X-B": "hop", "Content-Encoding": "gzip"],
            requestTime: Self.received.addingTimeInterval(100), responseTime: Self.received.addingTimeInterval(101)
        )
        #expect(refreshed.header("Cache-Control") == "max-age=60" && refreshed.header("X-A") == "2" && refreshed.header("Content-Type") == "text/plain")
        #expect(refreshed.header("Content-Length") == nil && refreshed.header("X-B") == nil)
        #expect(refreshed.header("Content-Encoding") == "gzip")  // the body is stored as the transport gave it
        #expect(refreshed.headers.keys.filter { $0.lowercased() == "cache-control" }.count == 1)
        #expect(refreshed.storedAt == Self.received.addingTimeInterval(101) && refreshed.initialAge == 1)
    }

    @Test func aHEADResponseDescribesAStoredGETOnlyWhenItsValidatorsAndLengthAgree_Section4_3_5() {
        let stored = Self.stored(["Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"], etag: "\"v1\"")
        #expect(HTTPCachePolicy.headResponse(["ETag": "\"v1\"", "Content-Length": "4"], describes: stored))
        #expect(HTTPCachePolicy.headResponse([:], describes: stored))
        #expect(!HTTPCachePolicy.headResponse(["ETag": "\"v2\""], describes: stored))
        #expect(!HTTPCachePolicy.headResponse(["ETag": "W/\"v1\""], describes: stored))
        #expect(!HTTPCachePolicy.headResponse(["Last-Modified": "Tue, 02 Jan 2024 00:00:00 GMT"], describes: stored))
        #expect(!HTTPCachePolicy.headResponse(["Content-Length": "5"], describes: stored))
    }

    /// Found by Fuzz/ (fuzz-cache-headers): a tag whose first character is a combining mark
    /// (U+0749 here) was read with its quotes, as the mark joins the opening quote into one
    /// Character; the bare and the quoted form of one tag then differed.
    @Test func anEntityTagIsReadByItsScalarsNotItsCharacters_Section8_8_3() {
        let crash = "\u{0749}.\u{FFFD}00:0J0min-fresh"
        #expect(EntityTag("\"\(crash)\"") == EntityTag(crash))
        #expect(EntityTag("\"\(crash)\"").opaque == crash)
        #expect(EntityTag("W/\"\u{301}x\"") == EntityTag("w/\u{301}x") && !EntityTag("W/\"\u{301}x\"").isStrong)
        #expect(EntityTag("\"\u{301}x\"").opaque == "\u{301}x" && EntityTag("\"\u{301}x\"").isStrong)
        // The 304 carries the quoted form of the tag the server first sent bare.
        let stored = Self.stored([:], etag: "\u{301}v1")
        #expect(HTTPCachePolicy.selectedBy304(["ETag": "\"\u{301}v1\""], among: [stored]).map(\.key) == [stored.key])
    }

    // MARK: Vary (§4.1)

    @Test func aLanguageVariantAnswersARequestThatPrefersItsLanguageMost_Section4_1() {
        let german = Self.stored(["Content-Language": "de"], varyNames: ["accept-language"], requestHeaders: ["Accept-Language": "en, de"])
        #expect(HTTPCachePolicy.matches(german, requestHeaders: ["Accept-Language": "fr;q=0.5, de;q=1.0"]))
        #expect(HTTPCachePolicy.matches(german, requestHeaders: ["Accept-Language": "DE"]))
        #expect(!HTTPCachePolicy.matches(german, requestHeaders: ["Accept-Language": "fr;q=1, de;q=0.9"]))  // prefers French
        #expect(HTTPCachePolicy.preferredLanguage("fr, de") == nil)  // equal weights: no preference
        #expect(!HTTPCachePolicy.matches(german, requestHeaders: ["Accept-Language": "de;q=0, fr"]))
        #expect(!HTTPCachePolicy.matches(german, requestHeaders: [:]))
        let noLanguage = Self.stored([:], varyNames: ["accept-language"], requestHeaders: ["Accept-Language": "en"])
        #expect(!HTTPCachePolicy.matches(noLanguage, requestHeaders: ["Accept-Language": "de"]))
        #expect(HTTPCachePolicy.preferredLanguage("*, en;q=0.9, fr;q=0.95") == "fr")
        #expect(HTTPCachePolicy.preferredLanguage("*;q=1, de;q=abc") == nil)
    }

    @Test func varyValuesAreComparedAfterNormalising_Section4_1() {
        func same(_ name: String, _ a: String, _ b: String) -> Bool {
            HTTPCachePolicy.varyDigest(names: [name], requestHeaders: [name: a]) == HTTPCachePolicy.varyDigest(names: [name], requestHeaders: [name: b])
        }
        #expect(same("foo", "1,2", " 1, 2 ") && same("foo", "1, 2", "1,2"))
        #expect(!same("foo", "1, 2", "2, 1") && !same("foo", "A", "a"))  // unknown fields: order and case matter
        #expect(same("accept-language", "en, de", "De,EN") && same("accept-language", "en ;q=0.5", "EN;q=0.5"))
        #expect(!same("accept-language", "en", "fr"))
        // An absent field differs from an empty one, and the field name is case-insensitive.
        #expect(HTTPCachePolicy.varyDigest(names: ["foo"], requestHeaders: [:]) != HTTPCachePolicy.varyDigest(names: ["foo"], requestHeaders: ["Foo": ""]))
        #expect(HTTPCachePolicy.varyDigest(names: ["foo"], requestHeaders: ["FOO": "1"]) == HTTPCachePolicy.varyDigest(names: ["foo"], requestHeaders: ["foo": "1"]))
        #expect(HTTPCachePolicy.varyNames(["Vary": "Foo, *"]) == nil && HTTPCachePolicy.varyNames(["vary": " B ,a,, A"]) == ["a", "b"])
    }
}
