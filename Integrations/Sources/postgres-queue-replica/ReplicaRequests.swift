import AsyncHTTPClient
import Foundation
import OfflineQueue
import ResilienceAsyncHTTPClient

/// The entries the replicas deliver: entry `number` of a run is a POST to
/// `<origin>/effects/<key>` with ordering key `k<number % keys>` (none when `keys` is 0), the
/// idempotency key `<run>-<number>`, and the body `<key> <index>`, where `index` counts the entries
/// of its key before it, so the origin can tell the order each key was delivered in.
struct ReplicaEntry: Sendable {
    let number: Int
    let orderingKey: String?
    let index: Int
    let idempotencyKey: String

    init(number: Int, keys: Int, run: String) {
        self.number = number
        orderingKey = keys > 0 ? "k\(number % keys)" : nil
        index = keys > 0 ? number / keys : number
        idempotencyKey = "\(run)-\(number)"
    }

    func request(origin: URL) -> QueuedRequest {
        let key = orderingKey ?? "-"
        return QueuedRequest(
            method: .post,
            url: origin.appendingPathComponent("effects").appendingPathComponent(key),
            headers: ["Content-Type": "text/plain"],
            body: Data("\(key) \(index)".utf8),
            idempotencyKey: idempotencyKey,
            orderingKey: orderingKey
        )
    }

    /// The line `enqueue` prints once the entry is committed: `ACK <idempotency key> <key> <index>`.
    var acknowledgement: String { "ACK \(idempotencyKey) \(orderingKey ?? "-") \(index)" }
}

enum ReplicaRequests {
    /// The session a replica sends through: the shared AsyncHTTPClient, or, for more requests in
    /// flight than its 8 connections per host, a client of its own with a connection per request
    /// (kept for the life of the process, as the shared one is).
    static func session(connections: Int) -> AsyncHTTPClientSession {
        guard connections > 8 else { return AsyncHTTPClientSession() }
        var configuration = AsyncHTTPClientSession.recommendedConfiguration
        configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = connections
        return AsyncHTTPClientSession(client: HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration))
    }
}
