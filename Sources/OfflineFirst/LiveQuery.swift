import Observation
import RequestEngine
import ResponseCache

/// A live read as an observable model for SwiftUI: `snapshot` follows
/// `OfflineFirstClient.snapshots(for:mode:staleTime:)`, updated on the main actor.
///
/// ```swift
/// struct NotesScreen: View {
///     @State var notes = LiveQuery(client: client, request: NotesRequest())
///     var body: some View {
///         List(Notes.decode(notes.snapshot?.data)) { Text($0) }
///             .overlay { if notes.snapshot?.isPaused == true { OfflineBadge() } }
///     }
/// }
/// ```
///
/// The read runs from `init` until `cancel()` or until the model is released.
@available(macOS 14.0, iOS 17.0, tvOS 17.0, watchOS 10.0, visionOS 1.0, *)
@MainActor
@Observable
public final class LiveQuery {
    /// The latest snapshot; `nil` until the first arrives (at once, from the store).
    public private(set) var snapshot: QuerySnapshot?
    /// Why the read ended, if it ended other than by `cancel()` (it does not end on its own).
    public private(set) var error: NetworkError?

    @ObservationIgnored private let task: Task<Void, Never>

    public init(client: OfflineFirstClient, request: some NetworkRequest, mode: NetworkMode = .offlineFirst, staleTime: StaleTime = .http) {
        let stream = client.snapshots(for: request, mode: mode, staleTime: staleTime)
        let model = WeakModel()
        task = Task { @MainActor in
            do {
                for try await snapshot in stream { model.query?.snapshot = snapshot }
            } catch {
                if !Task.isCancelled { model.query?.error = NetworkError(mapping: error) }
            }
        }
        model.query = self
    }

    /// Ends the read (and everything it started).
    public func cancel() {
        task.cancel()
    }

    deinit {
        task.cancel()
    }

    /// The model as the read's task sees it: weakly, so the task never keeps it alive.
    @MainActor
    private final class WeakModel {
        weak var query: LiveQuery?
    }
}
