import Foundation
import HTTPTypes
import NotesAPI
import OpenAPIRuntime
import Synchronization

/// The notes API as a real origin for ResilienceOpenAPI's tests, example and benchmark: the server
/// generated from `NotesAPI/openapi.yaml`, with switches a test turns by hand.
///
/// - **Effects**: `createNote` stores a note once per `Idempotency-Key`; a repeat with a key it has
///   seen answers the same note and adds nothing (`effects` counts the notes made).
/// - **503 bursts**: `failNext(_:retryAfter:operation:afterEffect:)` answers the next requests
///   `503` with `Retry-After` — of one operation or all; `afterEffect` runs the operation first, as
///   a server whose answer is lost after it committed.
/// - **Tokens**: with `requireToken(_:)` every request needs `Authorization: Bearer <token>`;
///   anything else gets `401`. `rotateToken(to:)` expires the old one.
/// - **Slow responses**: `hold(_:)` keeps an operation's requests waiting until `release()`;
///   `delay` answers every request that much later.
/// - **ETags**: `listNotes` and `getNote` answer with an `ETag` of the notes' version and
///   `Cache-Control: max-age=<cacheSeconds>`; a request whose `If-None-Match` matches gets `304`.
/// - **What arrived**: `requests` keeps each request's operation and header fields.
package final class NotesOrigin: APIProtocol {
    /// One request as the origin received it.
    package struct Received: Sendable {
        package let operationID: String
        package let headerFields: HTTPFields
    }

    private struct State {
        var notes: [Components.Schemas.Note] = []
        var notesByKey: [String: Components.Schemas.Note] = [:]
        var failures = 0
        var retryAfter: Int?
        var failing: String?
        var failAfterEffect = false
        var token: String?
        var held: Set<String> = []
        var waiting: [CheckedContinuation<Void, Never>] = []
        /// Tests waiting for a number of held requests.
        var watchers: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var delay: Duration = .zero
        var cacheSeconds = 60
        var received: [Received] = []
    }

    private let state = Mutex(State())

    package init() {}

    // MARK: Switches

    /// Answers the next `count` requests (of `operation` only, when given) `503`, with
    /// `Retry-After: retryAfter` when given; with `afterEffect`, after running the operation.
    package func failNext(_ count: Int, retryAfter: Int? = nil, operation: String? = nil, afterEffect: Bool = false) {
        state.withLock {
            $0.failures = count
            $0.retryAfter = retryAfter
            $0.failing = operation
            $0.failAfterEffect = afterEffect
        }
    }

    /// From now on, requests need `Authorization: Bearer <token>` (nil: none needed).
    package func requireToken(_ token: String?) {
        state.withLock { $0.token = token }
    }

    /// Expires the current token: only `token` is accepted from now on.
    package func rotateToken(to token: String) {
        requireToken(token)
    }

    /// Keeps requests for `operationID` waiting until `release()`.
    package func hold(_ operationID: String) {
        state.withLock { _ = $0.held.insert(operationID) }
    }

    /// Answers every held request and holds no more.
    package func release() {
        let waiting = state.withLock { state in
            state.held = []
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }

    /// How much later than it could every request is answered (default none).
    package var delay: Duration {
        get { state.withLock { $0.delay } }
        set { state.withLock { $0.delay = newValue } }
    }

    /// The `max-age` of the notes' representations (default 60).
    package var cacheSeconds: Int {
        get { state.withLock { $0.cacheSeconds } }
        set { state.withLock { $0.cacheSeconds = newValue } }
    }

    // MARK: What happened

    /// Notes made: one per `Idempotency-Key` (and one per request without a key).
    package var effects: Int { state.withLock { $0.notes.count } }

    /// Every request that reached the origin, in order (refused ones included).
    package var requests: [Received] { state.withLock { $0.received } }

    /// Requests of `operationID` that reached the origin.
    package func hits(_ operationID: String) -> Int {
        state.withLock { $0.received.filter { $0.operationID == operationID }.count }
    }

    /// Waits until `count` requests are held.
    package func waitForHeld(_ count: Int) async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state in
                guard state.waiting.count < count else { return true }
                state.watchers.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
        }
    }

    // MARK: The operations

    package func listNotes(_ input: Operations.listNotes.Input) async throws -> Operations.listNotes.Output {
        let (notes, etag) = state.withLock { ($0.notes.reversed() as [Components.Schemas.Note], Self.etag(of: $0)) }
        return .ok(.init(headers: .init(ETag: etag), body: .json(notes)))
    }

    package func createNote(_ input: Operations.createNote.Input) async throws -> Operations.createNote.Output {
        guard case .json(let new) = input.body else { throw NotesOriginError.unreadableBody }
        let key = input.headers.Idempotency_hyphen_Key
        let note = state.withLock { state -> Components.Schemas.Note in
            if let key, let made = state.notesByKey[key] { return made }
            let note = Components.Schemas.Note(id: "n\(state.notes.count + 1)", text: new.text, createdAt: Date())
            state.notes.append(note)
            if let key { state.notesByKey[key] = note }
            return note
        }
        return .created(.init(body: .json(note)))
    }

    package func getNote(_ input: Operations.getNote.Input) async throws -> Operations.getNote.Output {
        let found = state.withLock { state in
            state.notes.first { $0.id == input.path.noteID }.map { ($0, Self.etag(of: state)) }
        }
        guard let (note, etag) = found else { return .notFound(.init()) }
        return .ok(.init(headers: .init(ETag: etag), body: .json(note)))
    }

    package func echoTags(_ input: Operations.echoTags.Input) async throws -> Operations.echoTags.Output {
        let tags = input.headers.X_hyphen_Tag ?? []
        return .ok(.init(headers: .init(X_hyphen_Tag: tags), body: .json(tags)))
    }

    private static func etag(of state: State) -> String { "\"v\(state.notes.count)\"" }

    // MARK: The switches, in front of the operations

    /// The middleware that records each request and applies the switches before the generated
    /// server decodes it; register it with the handlers.
    package var switches: some ServerMiddleware { Switches(origin: self) }

    private struct Switches: ServerMiddleware {
        let origin: NotesOrigin

        func intercept(
            _ request: HTTPRequest,
            body: HTTPBody?,
            metadata: ServerRequestMetadata,
            operationID: String,
            next: @Sendable (HTTPRequest, HTTPBody?, ServerRequestMetadata) async throws -> (HTTPResponse, HTTPBody?)
        ) async throws -> (HTTPResponse, HTTPBody?) {
            try await origin.answer(request, body: body, metadata: metadata, operationID: operationID, next: next)
        }
    }

    private enum Gate {
        case pass(delay: Duration, hold: Bool, cacheSeconds: Int, etag: String)
        case unavailable(retryAfter: Int?)
        case passThenFail(retryAfter: Int?)
        case unauthorized
    }

    private func answer(
        _ request: HTTPRequest,
        body: HTTPBody?,
        metadata: ServerRequestMetadata,
        operationID: String,
        next: @Sendable (HTTPRequest, HTTPBody?, ServerRequestMetadata) async throws -> (HTTPResponse, HTTPBody?)
    ) async throws -> (HTTPResponse, HTTPBody?) {
        let gate = state.withLock { state -> Gate in
            state.received.append(Received(operationID: operationID, headerFields: request.headerFields))
            if state.failures > 0, state.failing == nil || state.failing == operationID {
                state.failures -= 1
                if !state.failAfterEffect { return .unavailable(retryAfter: state.retryAfter) }
                return .passThenFail(retryAfter: state.retryAfter)
            }
            if let token = state.token, request.headerFields[.authorization] != "Bearer " + token { return .unauthorized }
            return .pass(delay: state.delay, hold: state.held.contains(operationID), cacheSeconds: state.cacheSeconds, etag: Self.etag(of: state))
        }
        switch gate {
        case .unavailable(let retryAfter):
            return (Self.unavailable(retryAfter: retryAfter), nil)
        case .passThenFail(let retryAfter):
            _ = try await next(request, body, metadata)
            return (Self.unavailable(retryAfter: retryAfter), nil)
        case .unauthorized:
            return (HTTPResponse(status: .unauthorized, headerFields: [.wwwAuthenticate: "Bearer"]), nil)
        case .pass(let delay, let hold, let cacheSeconds, let etag):
            if hold {
                await withCheckedContinuation { continuation in
                    let (stillHeld, satisfied) = state.withLock { state in
                        guard state.held.contains(operationID) else { return (false, [CheckedContinuation<Void, Never>]()) }
                        state.waiting.append(continuation)
                        let held = state.waiting.count
                        defer { state.watchers.removeAll { $0.count <= held } }
                        return (true, state.watchers.filter { $0.count <= held }.map(\.continuation))
                    }
                    for watcher in satisfied { watcher.resume() }
                    if !stillHeld { continuation.resume() }
                }
            }
            if delay > .zero { try await Task.sleep(for: delay) }
            let reads = request.method == .get && operationID != "echoTags"
            if reads, request.headerFields[.ifNoneMatch] == etag {
                return (HTTPResponse(status: .notModified, headerFields: [.eTag: etag]), nil)
            }
            var (response, responseBody) = try await next(request, body, metadata)
            if reads, response.status == .ok { response.headerFields[.cacheControl] = "max-age=\(cacheSeconds)" }
            return (response, responseBody)
        }
    }
}

extension NotesOrigin {
    fileprivate static func unavailable(retryAfter: Int?) -> HTTPResponse {
        var response = HTTPResponse(status: .serviceUnavailable)
        if let retryAfter { response.headerFields[.retryAfter] = String(retryAfter) }
        return response
    }
}

/// Why the origin could not answer.
package enum NotesOriginError: Error {
    case unreadableBody
}
