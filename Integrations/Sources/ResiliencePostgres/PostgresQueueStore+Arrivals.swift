import Foundation
import Logging
import OfflineQueue
import PostgresNIO

extension PostgresQueueStore {
    /// A stream that yields when work may have arrived: once each time it starts listening (at
    /// first, and after a lost connection is replaced, since anything added meanwhile was not
    /// announced), then once per `NOTIFY` of a stored entry on the table's channel, which every
    /// `add` and outbox `enqueue` sends when its transaction commits, on any replica (the notices
    /// of updates and removals, which `changeFeed` follows, wake nobody).
    ///
    /// Each stream holds one of the client's connections for its `LISTEN` while someone iterates
    /// it; when the connection fails, it listens again on another after `reconnectDelay`. Yields
    /// that nobody has read yet collapse into one. The stream ends, and its connection goes back to
    /// the client, when its consumer stops (the iterating task is cancelled, or the stream is
    /// dropped).
    public func arrivals() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let client = self.client
        let channel = names.plain
        let logger = self.logger
        let reconnectDelay = self.reconnectDelay
        let listening = Task {
            while !Task.isCancelled {
                do {
                    try await client.withConnection { connection in
                        try await connection.listen(on: channel) { notifications in
                            continuation.yield()
                            for try await notification in notifications where Self.announcesWork(notification.payload) {
                                continuation.yield()
                            }
                        }
                    }
                } catch is CancellationError {
                    break
                } catch {
                    guard !Task.isCancelled else { break }
                    let failure = PostgresQueueStoreError.wrapping(error, operation: "arrivals")
                    logger.debug("LISTEN connection lost; listening again", metadata: ["error": "\(failure)"])
                }
                try? await Task.sleep(for: reconnectDelay)
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in listening.cancel() }
        return stream
    }

    /// Whether a notice may mean claimable work: a stored entry, or a notice this version cannot
    /// read (an older replica's empty one).
    static func announcesWork(_ payload: String) -> Bool {
        let parts = payload.split(separator: "|", omittingEmptySubsequences: false)
        return parts.count != 4 || parts[1] == "s"
    }
}
