import Foundation
import RequestEngine

/// What a layer above the queue is told of the sends of its entries, in step with their fate, on
/// the queue's own folder (a `DiskQueueStore`; `OfflineQueueEngine.observeSends(with:)`).
/// OfflineFirst uses it to keep the response cache and the queue's files telling one story across
/// a relaunch: a replay waits while a read of what it changes is being fetched, a read that may
/// hold a write whose fate is unknown is not stored, and a delivered write is recorded with the
/// stored reads it changes before its file goes.
package protocol QueueSendObserver: Sendable {
    /// Whether the sends of `entry` concern the observer at all; for the others none of the calls
    /// below is made, and the queue does for them what it does with no observer.
    func observes(_ entry: QueueEntry) -> Bool

    /// `entry` is about to be sent. A replay (`waits`) returns once nothing it must wait for is in
    /// the way (a fetch of a read it changes, begun before); false when the calling task was
    /// cancelled meanwhile (then nothing is sent and no other call follows). An enqueue's first
    /// attempt (an entry not stored yet, sequence 0) does not wait.
    func sendBegins(_ entry: QueueEntry, waits: Bool) async -> Bool

    /// `entry` was answered 2xx. Called before the queue forgets it; once this returns, the queue
    /// forgets it and deletes its file at once (not in a batch), then calls `deliveryFinished`.
    func delivered(_ entry: QueueEntry) async

    /// The delivered `entry` is forgotten and its file deleted (or it never had one).
    func deliveryFinished(_ entry: QueueEntry)

    /// The send of `entry` ended without a delivery; `mayHaveReachedServer` when the server may
    /// have taken it all the same (a timeout, a lost connection, a cancellation mid-send, a 5xx
    /// other than 503).
    func sendEnded(_ entry: QueueEntry, mayHaveReachedServer: Bool)
}

extension QueueAttemptOutcome {
    /// Whether the server may have taken the request although no 2xx came back: anything but an
    /// answer that says it was refused or not processed (4xx, 429, 503) and a send that never left
    /// (no connection).
    var mayHaveReachedServer: Bool {
        switch self {
        case .delivered: true
        case .permanent: false
        case .offline: false
        case .stop: true
        case .retry(.httpError(let status, _), _): ![429, 503].contains(status) && !(400...499).contains(status)
        case .retry: true
        }
    }
}
