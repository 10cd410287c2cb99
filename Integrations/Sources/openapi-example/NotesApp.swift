import Auth
import Foundation
import NotesAPI
import OfflineQueue
import Reachability
import RequestEngine
import ResilienceAsyncHTTPClient
import ResilienceOpenAPI
import ResponseCache
import Retry

// Docs/Integrations.md shows the lines between the markers verbatim (`.ci/run` checks).
// notes-app:begin
/// A notes app's network stack under its generated client: retries with backoff (a keyed POST
/// too), one coalesced token refresh on 401, GETs answered from the cache offline, and
/// `createNote` stored while offline and delivered once the network is back.
struct NotesApp {
    let notes: Client
    let offline: OfflineOperations<Client>
    let queue: OfflineQueueEngine

    init(serverURL: URL, folder: URL, user: String, tokens: any TokenProvider, network: any ReachabilityMonitoring) throws {
        let engine = AsyncRequestEngine(
            session: AsyncHTTPClientSession(),
            configuration: .init(retry: .init(policy: ExponentialRetryPolicy(maxRetries: 3, baseDelay: 0.05))))
        let signedIn = AuthenticatedRequestEngine(requestEngine: engine, coordinator: TokenRefreshCoordinator(provider: tokens))
        let cached = CachedRequestEngine(
            requestEngine: signedIn, cache: try DiskResponseCache(directory: folder.appendingPathComponent("cache"), maxBytes: 16 << 20),
            reachabilityMonitor: network, configuration: .init(partition: user))
        notes = Client(serverURL: serverURL, transport: ResilienceTransport(sender: cached))
        queue = OfflineQueueEngine(
            requestEngine: signedIn, reachabilityMonitor: network, store: try DiskQueueStore(directory: folder.appendingPathComponent("queue")))
        offline = OfflineOperations(queue: queue) { Client(serverURL: serverURL, transport: $0) }
    }
}
// notes-app:end
