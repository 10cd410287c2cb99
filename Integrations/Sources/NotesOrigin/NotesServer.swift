import Foundation
import Hummingbird
import Logging
import NIOCore
import NotesAPI
import OpenAPIHummingbird
import ServiceLifecycle

/// A `NotesOrigin` served over HTTP/1.1 by Hummingbird on 127.0.0.1 (a free port), its
/// operations under `/v1`, until `stop()`.
package final class NotesServer: Sendable {
    package let origin: NotesOrigin
    /// `http://127.0.0.1:<port>/v1`: the generated client's server URL.
    package let baseURL: URL
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    private init(origin: NotesOrigin, baseURL: URL, group: ServiceGroup, task: Task<Void, any Error>) {
        self.origin = origin
        self.baseURL = baseURL
        self.group = group
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
            },
            logger: Self.logger
        )
        let group = ServiceGroup(configuration: .init(services: [app], logger: Self.logger))
        let task = Task { try await group.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next(), port > 0 else {
            await group.triggerGracefulShutdown()
            throw NotesServerError.notListening
        }
        return NotesServer(origin: origin, baseURL: URL(string: "http://127.0.0.1:\(port)/v1")!, group: group, task: task)
    }

    /// Hummingbird's own log: warnings and worse only (not a line per start).
    private static let logger: Logger = {
        var logger = Logger(label: "NotesServer")
        logger.logLevel = .warning
        return logger
    }()

    /// Stops serving (a graceful shutdown: requests in flight are answered) and waits for the
    /// server to end. Held requests are released first.
    package func stop() async {
        origin.release()
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

/// Why a `NotesServer` did not start.
package enum NotesServerError: Error {
    case notListening
}
