import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Runs `body` and returns the NetworkError it throws (nil if it succeeded or threw something else).
package func networkError(_ body: () async throws -> Void) async -> NetworkError? {
    do {
        try await body()
        return nil
    } catch let error as NetworkError {
        return error
    } catch {
        return nil
    }
}

extension NetworkError {
    /// A stable name of the case for equality checks in tests.
    package var caseName: String {
        switch self {
        case .httpError(let status, _): return "httpError(\(status))"
        case .noConnection: return "noConnection"
        case .timedOut: return "timedOut"
        case .cancelled: return "cancelled"
        case .transport(let failure): return "transport(\(failure.rawValue))"
        case .invalidResponse: return "invalidResponse"
        case .circuitOpen: return "circuitOpen"
        case .invalidRequest: return "invalidRequest"
        case .responseTooLarge(let limit, _): return "responseTooLarge(\(limit))"
        case .underlying: return "underlying"
        case .deadlineExceeded: return "deadlineExceeded"
        case .limited: return "limited"
        case .tooManyRedirects: return "tooManyRedirects"
        case .responseHeadersTooLarge: return "responseHeadersTooLarge"
        }
    }
}

/// Runs `body` and returns the error it throws (nil if it succeeded).
package func thrownError(_ body: () async throws -> Void) async -> (any Error)? {
    do {
        try await body()
        return nil
    } catch {
        return error
    }
}
