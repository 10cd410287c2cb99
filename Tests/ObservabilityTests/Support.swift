import Foundation
import RequestEngine

@testable import Observability

/// Trace ids made from a counter: `UUID()` reads /dev/urandom on Linux (about 3 µs each), too slow
/// for the tests that record hundreds of thousands of events.
func traceID(_ task: Int, _ index: Int) -> UUID {
    var bytes = [UInt8](repeating: 0, count: 16)
    withUnsafeBytes(of: UInt64(task).littleEndian) { bytes.replaceSubrange(0..<8, with: $0) }
    withUnsafeBytes(of: UInt64(index).littleEndian) { bytes.replaceSubrange(8..<16, with: $0) }
    return UUID(
        uuid: (
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
            bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
        ))
}

func url(_ string: String) -> URL {
    guard let url = URL(string: string) else { fatalError("bad test URL \(string)") }
    return url
}

extension RequestMetrics {
    /// The endpoint with this method and template, if any.
    func endpoint(_ method: String, _ template: String) -> EndpointMetrics? {
        endpoints.first { $0.method == method && $0.template == template }
    }
}

/// Relative difference between an estimate and the exact value.
func relativeError(_ estimate: Double, _ exact: Double) -> Double {
    exact == 0 ? abs(estimate) : abs(estimate - exact) / exact
}
