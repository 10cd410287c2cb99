import Foundation
import FuzzSupport

@testable import ResponseCache
@testable import Retry

/// The header fields the response cache parses (`CacheControl`, `HTTPCachePolicy`): the input's
/// lines are, in order, the response's `Cache-Control`, the request's `Cache-Control`, `Vary`,
/// the request's `Accept-Language`, `Content-Language`, the stored `ETag`, a `304`'s `ETag`, `Age`,
/// `Date`, `Expires`, `Last-Modified`, the request's `Pragma` and the response's `Connection`.
///
/// Contract: no input crashes or takes more than linear time; parsed values stay in their ranges
/// (delta-seconds saturate at 2^31, ages and lifetimes are finite and bounded); `Cache-Control`
/// reads the same printed back from what it parsed, split into two fields or joined, and (for
/// ASCII, where case folding is plain) in any letter case; header names match in any case; a `Vary`
/// value normalised once is normalised; a stored response matches the request it was stored for;
/// entity tags read back; the `Reuse` verdicts are consistent with one another.
@main
enum CacheHeadersFuzzer {
    static let received = Date(timeIntervalSince1970: 1_700_000_000)

    static func main() {
        FuzzDriver.run { data, size in
            CacheHeadersFuzzer.check(FuzzInput(data, size))
            return 0
        }
    }

    static func check(_ input: FuzzInput) {
        let line = input.lines(atLeast: 13)
        let isASCII = input.bytes.allSatisfy { $0 < 0x80 }

        let response = CacheControl(line[0])
        let request = CacheControl(line[1])
        checkRanges(response)
        checkRanges(request)
        fuzzCheck(CacheControl(printed(response)) == response, "\(line[0]) reads differently printed back as \(printed(response))")
        if !line[0].contains("\"") {
            fuzzCheck(CacheControl([line[0], line[1]]) == CacheControl(line[0] + ", " + line[1]), "two fields differ from the same joined")
        }
        if isASCII {
            fuzzCheck(CacheControl(line[0].uppercased()) == response, "upper case reads differently: \(line[0])")
        }

        var responseHeaders = [
            "Cache-Control": line[0], "Vary": line[2], "Content-Language": line[4], "ETag": line[5], "Age": line[7],
            "Date": line[8], "Expires": line[9], "Last-Modified": line[10], "Connection": line[12], "Set-Cookie": "a=b",
        ]
        for (name, value) in responseHeaders where value.isEmpty { responseHeaders[name] = nil }
        var requestHeaders = ["Cache-Control": line[1], "Accept-Language": line[3], "Pragma": line[11]]
        for (name, value) in requestHeaders where value.isEmpty { requestHeaders[name] = nil }
        for (name, value) in responseHeaders {
            fuzzCheck(HTTPCachePolicy.value(name.uppercased(), in: [name.lowercased(): value]) == value, "\(name) is not found in another case")
        }

        // Vary.
        let varyNames = HTTPCachePolicy.varyNames(responseHeaders)
        if let varyNames {
            fuzzCheck(varyNames == Array(Set(varyNames)).sorted(), "vary names not sorted and unique: \(varyNames)")
            fuzzCheck(varyNames.allSatisfy { !$0.isEmpty && $0 != "*" && $0 == $0.lowercased() }, "vary names: \(varyNames)")
        }
        for name in ["accept-language", "x-custom"] {
            let once = HTTPCachePolicy.normalisedVaryValue(name, line[3])
            fuzzCheck(HTTPCachePolicy.normalisedVaryValue(name, once) == once, "normalising \(line[3]) for \(name) twice changes it")
            fuzzCheck(
                HTTPCachePolicy.varyDigest(names: [name], requestHeaders: [name: once])
                    == HTTPCachePolicy.varyDigest(names: [name], requestHeaders: [name.uppercased(): line[3]]), "a normalised value varies")
        }
        if let language = HTTPCachePolicy.preferredLanguage(line[3]) {
            fuzzCheck(!language.isEmpty && language != "*" && language == language.lowercased(), "preferred language \(language)")
        }

        // Storing.
        let requestTime = received.addingTimeInterval(-Double(input.bytes.count % 7))
        let storable = HTTPCachePolicy.storableHeaders(responseHeaders)
        let connectionNamed = Set(line[12].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
        fuzzCheck(
            storable.keys.allSatisfy { name in !HTTPCachePolicy.unstoredHeaders.contains(name.lowercased()) && !connectionNamed.contains(name.lowercased()) },
            "an unstorable header is stored: \(storable.keys.sorted())")
        let dated = HTTPCachePolicy.withDate(storable, receivedAt: received)
        fuzzCheck(HTTPCachePolicy.value("Date", in: dated).flatMap { HTTPDate.parse($0) } != nil || storable["Date"] != nil, "no Date after withDate")
        let age = HTTPCachePolicy.correctedInitialAge(responseHeaders, requestTime: requestTime, responseTime: received)
        fuzzCheck(age.isFinite && age >= 0 && age <= 2_147_483_648, "corrected initial age \(age)")
        for status in [200, 206, 404, 500] { _ = HTTPCachePolicy.mayStore(status: status, headers: responseHeaders, control: response) }
        if let lifetime = HTTPCachePolicy.explicitLifetime(responseHeaders, control: response, received: received) {
            fuzzCheck(lifetime >= .zero && lifetime <= HTTPCachePolicy.maximumDelta, "explicit lifetime \(lifetime)")
        }
        if let lifetime = HTTPCachePolicy.heuristicLifetime(responseHeaders, status: 200, control: response, received: received) {
            fuzzCheck(lifetime >= .zero && lifetime <= HTTPCachePolicy.maximumHeuristicLifetime, "heuristic lifetime \(lifetime)")
        }

        let names = varyNames ?? []
        let stored = StoredResponse(
            key: CacheDigest("key"), primaryKey: CacheDigest("primary"), method: "GET", url: "https://example.test/", partition: nil,
            storedAt: received, initialAge: age, statusCode: 200, headers: dated, varyNames: names,
            varyDigest: HTTPCachePolicy.varyDigest(names: names, requestHeaders: requestHeaders), body: Data("body".utf8))
        fuzzCheck(HTTPCachePolicy.matches(stored, requestHeaders: requestHeaders), "a response does not match the request it was stored for")
        let shouted = Dictionary(requestHeaders.map { ($0.key.uppercased(), $0.value) }, uniquingKeysWith: { first, _ in first })
        fuzzCheck(HTTPCachePolicy.matches(stored, requestHeaders: shouted), "matching depends on the case of header names")

        // Reuse.
        let requestControl = HTTPCachePolicy.requestDirectives(requestHeaders)
        checkRanges(requestControl)
        for elapsed in [0.0, 1, 3_600, 1e9] {
            for staleTime in [StaleTime.http, .zero, .seconds(60)] {
                let reuse = HTTPCachePolicy.reuse(stored, request: requestControl, staleTime: staleTime, now: received.addingTimeInterval(elapsed))
                fuzzCheck(!reuse.isUsable || !requestControl.noCache, "usable despite the request's no-cache")
                fuzzCheck(!reuse.withinStaleWhileRevalidate || (!reuse.isFresh && reuse.mayServeStale), "stale-while-revalidate on a fresh or unservable response")
                fuzzCheck(!reuse.mayServeOnError || reuse.mayServeStale, "stale-if-error on a response that may not be served stale")
            }
        }

        // Validation.
        for text in [line[5], line[6]] {
            let tag = EntityTag(text)
            let printed = tag.isStrong ? "\"\(tag.opaque)\"" : "W/\"\(tag.opaque)\""
            fuzzCheck(EntityTag(printed) == tag, "the entity tag \(text) reads back as \(EntityTag(printed))")
        }
        let notModified = ["ETag": line[6], "Last-Modified": line[10], "Age": line[7]].filter { !$0.value.isEmpty }
        let selected = HTTPCachePolicy.selectedBy304(notModified, among: [stored])
        fuzzCheck(selected.allSatisfy { $0 == stored }, "a 304 selects a response it was not offered")
        let refreshed = HTTPCachePolicy.refreshed(stored, with: notModified, requestTime: requestTime, responseTime: received)
        fuzzCheck(refreshed.initialAge.isFinite && refreshed.initialAge >= 0, "refreshed age \(refreshed.initialAge)")
        _ = HTTPCachePolicy.headResponse(notModified, describes: stored)
        _ = HTTPCachePolicy.validators(for: stored)
    }

    static func checkRanges(_ control: CacheControl) {
        let bound = 2_147_483_648
        if case .value(let seconds) = control.maxAge { fuzzCheck((0...bound).contains(seconds), "max-age \(seconds)") }
        for value in [control.minFresh, control.staleWhileRevalidate, control.staleIfError].compactMap({ $0 }) {
            fuzzCheck((0...bound).contains(value), "delta-seconds \(value)")
        }
        if let maxStale = control.maxStale { fuzzCheck(maxStale >= 0 && (maxStale <= bound || maxStale == .max), "max-stale \(maxStale)") }
        fuzzCheck(
            control.noCacheFields.allSatisfy { !$0.isEmpty && $0 == $0.lowercased() && $0 == $0.trimmingCharacters(in: .whitespaces) },
            "no-cache fields \(control.noCacheFields)")
    }

    /// `control` as a `Cache-Control` value.
    static func printed(_ control: CacheControl) -> String {
        var directives: [String] = []
        if control.noStore { directives.append("no-store") }
        if control.noCache { directives.append("no-cache") }
        if !control.noCacheFields.isEmpty {
            let fields = control.noCacheFields.joined(separator: ", ").replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            directives.append("no-cache=\"\(fields)\"")
        }
        switch control.maxAge {
        case .absent: break
        case .value(let seconds): directives.append("max-age=\(seconds)")
        case .invalid: directives.append("max-age=invalid")
        }
        if let maxStale = control.maxStale { directives.append(maxStale == .max ? "max-stale" : "max-stale=\(maxStale)") }
        if let minFresh = control.minFresh { directives.append("min-fresh=\(minFresh)") }
        if control.onlyIfCached { directives.append("only-if-cached") }
        if control.mustRevalidate { directives.append("must-revalidate") }
        if control.mustUnderstand { directives.append("must-understand") }
        if control.isPublic { directives.append("public") }
        if let seconds = control.staleWhileRevalidate { directives.append("stale-while-revalidate=\(seconds)") }
        if let seconds = control.staleIfError { directives.append("stale-if-error=\(seconds)") }
        return directives.joined(separator: ", ")
    }
}
