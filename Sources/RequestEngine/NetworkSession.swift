import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The one call the engine needs from a transport. `URLSession` conforms on Linux and Apple
/// platforms; tests use `ScriptedNetworkSession` from `ResilienceTesting`.
///
/// Implementations must honour task cancellation promptly (URLSession does): the engine cancels
/// the call when its timeout fires or when every caller waiting on it is cancelled.
public protocol NetworkSession: Sendable {
    func data(for request: URLRequest) async throws -> (Data, URLResponse)
}

extension URLSession: NetworkSession {
    /// `data(for:delegate:)` with no delegate, so URLSession satisfies `NetworkSession` exactly.
    public func data(for request: URLRequest) async throws -> (Data, URLResponse) {
        try await data(for: request, delegate: nil)
    }
}
