import Foundation
@_spi(ResilienceCore) import ResilienceCore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The server side of a ``Simulation``: documents that clients read and write, an
/// `Idempotency-Key` table, bearer tokens that can be revoked, and counts of everything a scenario
/// checks its invariants against.
///
/// - `GET /docs/ID` answers `ID=VERSION#SERIAL@USER` (a serial per 200, and the request's
///   `X-Sim-User`) with a strong `ETag` naming the version and the document's `Cache-Control`,
///   or 304 when `If-None-Match` names the current version; ``lastConfirmed(_:version:)`` says
///   when each version was last answered or confirmed.
/// - `PUT`, `PATCH` or `POST /docs/ID` with the body `VERSION` stores that version (a missing
///   document starts at version 0). A request whose `Idempotency-Key` was seen before gets the
///   first answer again and changes nothing (the deduplicating origin). The header
///   `X-Sim-Mutation` names the logical write, so a client that sends one write under two keys
///   shows up in ``effects(of:)`` as two effects; `X-Sim-Order: KEY:SEQUENCE` records the order
///   writes of one ordering key were applied in.
/// - `POST /reject/…` answers 422 (a write the server refuses).
/// - With ``requiresToken``, a request whose `Authorization` is not `Bearer tN` with N at least
///   the current generation gets 401.
public final class SimulatedOrigin: Sendable {
    private struct Document {
        var version = 0
        var cacheControl = "max-age=5"
    }

    /// A note many devices edit (the conflicts scenario): its edits, in the order they arrived,
    /// and its version, which every accepted write moves on.
    private struct Note {
        var edits: [String] = []
        var version = 1
        var requiresPrecondition = false
    }

    private struct State {
        var notes: [String: Note] = [:]
        var preconditionFailures = 0
        var documents: [String: Document] = [:]
        var answersByKey: [String: Answer] = [:]
        var effects: [String: Int] = [:]
        var orders: [String: [Int]] = [:]
        var requiresToken = false
        var validFrom = 0
        var issued = 0
        var requests = 0
        var unauthorized = 0
        var servedGets = 0
        var confirmed: [String: Duration] = [:]
    }

    /// An answer the origin gives.
    public struct Answer: Sendable, Hashable {
        public var status: Int
        public var headers: [String: String]
        public var body: Data
    }

    private let state = Locked(State())

    init() {}

    // MARK: - Tokens

    /// Whether requests must carry a valid bearer token.
    public var requiresToken: Bool {
        get { state.withLock { $0.requiresToken } }
        set { state.withLock { $0.requiresToken = newValue } }
    }

    /// Issues a new token, valid until the next ``revokeTokens()``.
    public func issueToken() -> String {
        state.withLock { state in
            state.issued += 1
            return "t\(state.issued)"
        }
    }

    /// Every token issued so far stops being accepted (an expiry, or a rotation on the server).
    public func revokeTokens() {
        state.withLock { $0.validFrom = $0.issued + 1 }
    }

    /// Tokens issued so far.
    public var tokensIssued: Int { state.withLock { $0.issued } }
    /// 401s answered so far.
    public var unauthorizedCount: Int { state.withLock { $0.unauthorized } }

    // MARK: - Documents

    /// Sets the `Cache-Control` a document is served with (`max-age=5` by default).
    public func setCacheControl(_ value: String, for id: String) {
        state.withLock { $0.documents[id, default: Document()].cacheControl = value }
    }

    /// Changes a document on the server (another client's write).
    public func bump(_ id: String) {
        state.withLock { $0.documents[id, default: Document()].version += 1 }
    }

    /// The document's current version (0 if never written).
    public func version(of id: String) -> Int {
        state.withLock { $0.documents[id]?.version ?? 0 }
    }

    /// How many times the write named `mutation` (its `X-Sim-Mutation`) took effect.
    public func effects(of mutation: String) -> Int {
        state.withLock { $0.effects[mutation] ?? 0 }
    }

    /// Every write that took effect at least once, with its count.
    public var allEffects: [String: Int] { state.withLock { $0.effects } }

    /// The sequence numbers of `orderingKey`'s writes, in the order they took effect.
    public func appliedOrder(of orderingKey: String) -> [Int] {
        state.withLock { $0.orders[orderingKey] ?? [] }
    }

    /// When the origin last answered a GET of `id` while it was at `version` (a 200, or a 304
    /// confirming it): a response served as fresh must have been confirmed within its lifetime.
    public func lastConfirmed(_ id: String, version: Int) -> Duration? {
        state.withLock { $0.confirmed["\(id)-\(version)"] }
    }

    /// Requests the origin has answered.
    public var requestCount: Int { state.withLock { $0.requests } }

    /// Answers `request` and applies its effect (called by ``SimulatedNetwork``).
    // MARK: - Notes (conflicts)

    /// Makes writes to note `id` without `If-Match` (or `If-Unmodified-Since`) answer `428`.
    public func requirePrecondition(for id: String) {
        state.withLock { $0.notes[id, default: Note()].requiresPrecondition = true }
    }

    /// The edits note `id` holds now, in the order they arrived.
    public func edits(of id: String) -> [String] {
        state.withLock { $0.notes[id]?.edits ?? [] }
    }

    /// How many writes were refused with `412` or `428`.
    public var preconditionFailures: Int { state.withLock { $0.preconditionFailures } }

    /// `GET /notes/<id>`: its edits, comma-separated, `ETag: "<id>.<version>"`, `max-age=5`.
    /// `PUT /notes/<id>`: the body (comma-separated edits) replaces the note's edits — `412` when
    /// `If-Match` names another version, `428` without one on a note that requires it, once per
    /// `Idempotency-Key` (a repeated key gets the first answer). A write without a precondition
    /// on a note that does not require one replaces whatever is there: last write wins.
    private static func handleNote(
        _ id: String, method: String, request: URLRequest, header: (String) -> String?, _ state: inout State
    ) -> Answer {
        var note = state.notes[id] ?? Note()
        let etag = "\"\(id).\(note.version)\""
        if method == "GET" || method == "HEAD" {
            return Answer(status: 200, headers: ["ETag": etag, "Cache-Control": "max-age=5"], body: Data(note.edits.joined(separator: ",").utf8))
        }
        if let key = header("Idempotency-Key"), let first = state.answersByKey[key] { return first }
        let answer: Answer
        if let match = header("If-Match"), match != etag {
            answer = Answer(status: 412, headers: ["ETag": etag], body: Data())
            state.preconditionFailures += 1
        } else if header("If-Match") == nil, note.requiresPrecondition {
            answer = Answer(status: 428, headers: [:], body: Data())
            state.preconditionFailures += 1
        } else {
            note.edits = String(decoding: request.httpBody ?? Data(), as: UTF8.self).split(separator: ",").map(String.init)
            note.version += 1
            state.notes[id] = note
            answer = Answer(status: 200, headers: ["ETag": "\"\(id).\(note.version)\""], body: Data())
        }
        if let key = header("Idempotency-Key") { state.answersByKey[key] = answer }
        return answer
    }

    func handle(_ request: URLRequest, at now: Duration) -> Answer {
        let method = request.httpMethod ?? "GET"
        let path = request.url?.path ?? "/"
        let header = { (name: String) in request.value(forHTTPHeaderField: name) }
        return state.withLock { state -> Answer in
            state.requests += 1
            if state.requiresToken {
                let token = header("Authorization") ?? ""
                let generation = token.hasPrefix("Bearer t") ? Int(token.dropFirst(8)) : nil
                guard let generation, generation >= state.validFrom, generation <= state.issued else {
                    state.unauthorized += 1
                    return Answer(status: 401, headers: ["WWW-Authenticate": "Bearer"], body: Data())
                }
            }
            if path.hasPrefix("/reject/") { return Answer(status: 422, headers: [:], body: Data()) }
            if path.hasPrefix("/notes/") { return Self.handleNote(String(path.dropFirst("/notes/".count)), method: method, request: request, header: header, &state) }
            guard path.hasPrefix("/docs/") else { return Answer(status: 404, headers: [:], body: Data()) }
            let id = String(path.dropFirst("/docs/".count))
            if method == "GET" || method == "HEAD" {
                let document = state.documents[id] ?? Document()
                let etag = "\"\(id)-\(document.version)\""
                let headers = ["ETag": etag, "Cache-Control": document.cacheControl]
                state.confirmed["\(id)-\(document.version)"] = now
                if header("If-None-Match") == etag { return Answer(status: 304, headers: headers, body: Data()) }
                state.servedGets += 1
                let body = "\(id)=\(document.version)#\(state.servedGets)@\(header("X-Sim-User") ?? "-")"
                return Answer(status: 200, headers: headers, body: Data(body.utf8))
            }
            if let key = header("Idempotency-Key"), let first = state.answersByKey[key] { return first }
            let version = Int(String(decoding: request.httpBody ?? Data(), as: UTF8.self)) ?? 0
            state.documents[id, default: Document()].version = version
            if let mutation = header("X-Sim-Mutation") { state.effects[mutation, default: 0] += 1 }
            if let order = header("X-Sim-Order"), let colon = order.lastIndex(of: ":"), let sequence = Int(order[order.index(after: colon)...]) {
                state.orders[String(order[..<colon]), default: []].append(sequence)
            }
            let answer = Answer(status: 200, headers: [:], body: Data("\(id)=\(version)".utf8))
            if let key = header("Idempotency-Key") { state.answersByKey[key] = answer }
            return answer
        }
    }
}
