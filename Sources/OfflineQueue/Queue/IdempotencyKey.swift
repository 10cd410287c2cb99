import Foundation
import RequestEngine

/// Ready-made values for `QueueableRequest.idempotencyKey`.
///
/// The queue's default key is a fresh UUID per request: two identical intents (two likes, two
/// "add one to the cart") are two mutations, and each is applied once. SwiftResilience's default
/// was derived from the request instead; `derived(method:url:body:)` offers that, as an opt-in.
public enum IdempotencyKey {
    /// A key computed from the request itself: the same method, URL and body give the same key, in
    /// every process and on every launch, so the server applies identical requests once — even when
    /// the app built and enqueued them twice (a retried tap, a relaunch that re-enqueues).
    ///
    /// It is the SHA-256 of the method, the absolute URL and the body (a `nil` body and an empty one
    /// are the same), as 64 lowercase hexadecimal digits. SwiftResilience spelled the key as
    /// `"METHOD:URL:base64(body)"`, which put the whole body into a header (servers refuse headers
    /// of a few kilobytes, and logs keep them); this key has the same meaning at a fixed size, and
    /// reveals neither the URL nor the body.
    ///
    /// Use it only where two identical requests really mean one change (setting a value, not
    /// adding one); headers are not part of the key.
    public static func derived(method: HTTPMethod, url: URL, body: Data?) -> String {
        var bytes = Array(method.rawValue.utf8)
        bytes.append(0)
        bytes.append(contentsOf: url.absoluteString.utf8)
        bytes.append(0)
        if let body { bytes.append(contentsOf: body) }
        return SHA256.hexDigest(bytes)
    }
}

extension QueueableRequest {
    /// `IdempotencyKey.derived(method:url:body:)` of this request: SwiftResilience's default key.
    /// To opt in, return it from your conformance:
    /// ```swift
    /// var idempotencyKey: String { derivedIdempotencyKey }
    /// ```
    public var derivedIdempotencyKey: String {
        IdempotencyKey.derived(method: method, url: url, body: body)
    }
}
