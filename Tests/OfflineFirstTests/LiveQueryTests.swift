import Foundation
import Observation
@_spi(ResilienceCore) import ResilienceCore
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import OfflineFirst

@Suite("LiveQuery: an observable live read", .timeLimit(.minutes(1)))
struct LiveQueryTests {
    @MainActor
    @Test func observersAreToldOfEachSnapshotOnTheMainActor() async throws {
        let h = try OfflineFirstHarness(notes: ["a"], connected: false)
        let query = LiveQuery(client: h.client, request: NotesList(), mode: .offlineFirst)
        while query.snapshot == nil, !Task.isCancelled { await Task.yield() }
        #expect(query.snapshot?.isPaused == true && Notes.decode(query.snapshot?.data) == nil)
        let changed = Locked(false)
        withObservationTracking {
            _ = query.snapshot
        } onChange: {
            changed.withLock { $0 = true }
        }
        try await h.client.mutate(CreateNote("b"))
        while Notes.decode(query.snapshot?.data) != ["b"], !Task.isCancelled { await Task.yield() }  // delivered to the model on the main actor
        #expect(changed.withLock { $0 })
        #expect(query.snapshot?.hasPendingWrites == true)
        query.cancel()
        while await h.monitor.subscriberCount > 0, !Task.isCancelled { await Task.yield() }  // nothing left running
    }
}
