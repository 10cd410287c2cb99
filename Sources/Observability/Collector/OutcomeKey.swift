import RequestEngine

/// How one request ended, packed in 16 bits for the per-event path: the HTTP status of a success,
/// the HTTP status of a failure, or the reason of a failure without an HTTP response.
struct OutcomeKey: Hashable, Sendable, Comparable {
    let rawValue: Int16

    private static let failureStatusOffset: Int16 = 1000

    /// The reasons a request can fail without an HTTP response, as label values.
    static let reasonLabels = [
        "no_connection", "timed_out", "cancelled", "cannot_connect", "connection_lost", "dns_failure",
        "tls_failure", "invalid_response", "circuit_open", "invalid_request", "other", "deadline_exceeded",
        "limited", "too_many_redirects", "headers_too_large",
    ]

    /// A success with `statusCode` (clamped to 0…999).
    init(successStatus statusCode: Int) {
        rawValue = Int16(Swift.min(Swift.max(statusCode, 0), 999))
    }

    /// The failure `error` describes.
    init(failure error: NetworkError) {
        let reason: Int
        switch error {
        case .httpError(let statusCode, _):
            rawValue = Self.failureStatusOffset + Int16(Swift.min(Swift.max(statusCode, 0), 999))
            return
        case .noConnection: reason = 0
        case .timedOut: reason = 1
        case .cancelled: reason = 2
        case .transport(let failure):
            switch failure {
            case .cannotConnectToHost: reason = 3
            case .connectionLost: reason = 4
            case .dnsFailure: reason = 5
            case .secureConnectionFailed: reason = 6
            }
        case .invalidResponse: reason = 7
        case .circuitOpen: reason = 8
        case .invalidRequest: reason = 9
        case .responseTooLarge, .underlying: reason = 10
        case .deadlineExceeded: reason = 11
        case .limited: reason = 12
        case .tooManyRedirects: reason = 13
        case .responseHeadersTooLarge: reason = 14
        }
        rawValue = -1 - Int16(reason)
    }

    /// Whether the request succeeded.
    var isSuccess: Bool { rawValue >= 0 && rawValue < Self.failureStatusOffset }

    /// The HTTP status code, when the request got an HTTP response.
    var httpStatus: Int? {
        if rawValue < 0 { return nil }
        return Int(isSuccess ? rawValue : rawValue - Self.failureStatusOffset)
    }

    /// The failure reason label, when the request failed without an HTTP response.
    var reason: String? {
        guard rawValue < 0 else { return nil }
        let index = Int(-1 - rawValue)
        return index < Self.reasonLabels.count ? Self.reasonLabels[index] : "other"
    }

    /// The `status` label: the status code, or the failure reason.
    var statusLabel: String {
        if let httpStatus { return String(httpStatus) }
        return reason ?? "other"
    }

    /// The `outcome` label.
    var outcomeLabel: String { isSuccess ? "success" : "failure" }

    static func < (lhs: OutcomeKey, rhs: OutcomeKey) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// Counts per `OutcomeKey` for one endpoint in one shard: a short list searched linearly (an
/// endpoint sees a handful of distinct outcomes), allocated once, zeroed in place on reset.
struct OutcomeCounts: Sendable {
    private(set) var keys: [Int16] = []
    private(set) var counts: [UInt64] = []

    @inline(__always)
    mutating func increment(_ key: OutcomeKey) {
        for index in keys.indices where keys[index] == key.rawValue {
            counts[index] &+= 1
            return
        }
        if keys.isEmpty {
            keys.reserveCapacity(8)
            counts.reserveCapacity(8)
        }
        keys.append(key.rawValue)
        counts.append(1)
    }

    mutating func zero() {
        counts.withUnsafeMutableBufferPointer { $0.update(repeating: 0) }
    }

    /// Adds every non-zero count to `totals`.
    func add(into totals: inout [OutcomeKey: UInt64]) {
        for index in keys.indices where counts[index] > 0 {
            totals[OutcomeKey(rawValue: keys[index]), default: 0] &+= counts[index]
        }
    }
}

extension OutcomeKey {
    init(rawValue: Int16) { self.rawValue = rawValue }
}
