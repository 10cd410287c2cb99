import Foundation
import Hummingbird
import NIOCore
import NotesAPI
import OpenAPIHummingbird

/// A `NotesOrigin` served over HTTP/1.1 by Hummingbird on 127.0.0.1 (a free port), its
/// operations under `/v1`, until `stop()`.
package final class NotesServer: Sendable {
    package let origin: NotesOrigin
    /// `http://127.0.0.1:<port>/v1`: the generated client's server URL.
    package let baseURL: URL
    private let task: Task<Void, any Error>

    private init(origin: NotesOrigin, baseURL: URL, task: Task<Void, any Error>) {
        self.origin = origin
        self.baseURL = baseURL
        self.task = task
    }

    /// Starts serving `origin` and returns once the server listens.
    package static func start(_ origin: NotesOrigin = NotesOrigin()) async throws -> NotesServer {
        let router = Router()
        try origin.registerHandlers(on: router, serverURL: URL(string: "/v1")!, middlewares: [origin.switches])
        let (ports, listening) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in
                listening.yield(channel.localAddress?.port ?? 0)
                listening.finish()
            }
        )
        let task = Task { try await app.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next(), port > 0 else {
            task.cancel()
            throw NotesServerError.notListening
        }
        return NotesServer(origin: origin, baseURL: URL(string: "http://127.0.0.1:\(port)/v1")!, task: task)
    }

    /// Stops serving and waits for the server to end.
    package func stop() async {
        task.cancel()
        _ = try? await task.value
    }
}

/// Why a `NotesServer` did not start.
package enum NotesServerError: Error {
    case notListening
}
