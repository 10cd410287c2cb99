// Minimal reproduction of corelibs-foundation's URLSession memory growth on Linux (issue 30):
// N sequential completion-handler data tasks on one ephemeral session with every store off,
// against an HTTP/1.1 keep-alive server on 127.0.0.1; prints the resident set as it goes.
//
//   swiftc -O urlsession-growth.swift -o urlsession-growth
//   ./urlsession-growth http://127.0.0.1:8089/bench 50000
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

func residentMB() -> Double {
    let descriptor = open("/proc/self/statm", O_RDONLY)
    defer { close(descriptor) }
    var buffer = [UInt8](repeating: 0, count: 256)
    let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
    let fields = String(decoding: buffer[0..<max(0, count)], as: UTF8.self).split(separator: " ")
    return Double(Int(fields[1]) ?? 0) * Double(sysconf(Int32(_SC_PAGESIZE))) / 1_048_576
}

let arguments = CommandLine.arguments
let url = URL(string: arguments.count > 1 ? arguments[1] : "http://127.0.0.1:8089/bench")!
let total = arguments.count > 2 ? Int(arguments[2]) ?? 50_000 : 50_000
let configuration = URLSessionConfiguration.ephemeral
configuration.urlCache = nil
configuration.httpCookieStorage = nil
configuration.urlCredentialStorage = nil
let session = URLSession(configuration: configuration)
let done = DispatchSemaphore(value: 0)
for index in 1...total {
    session.dataTask(with: URLRequest(url: url)) { data, response, error in
        precondition(error == nil && (response as? HTTPURLResponse)?.statusCode == 200, "request failed: \(String(describing: error))")
        done.signal()
    }.resume()
    done.wait()
    if index % (total / 10) == 0 { print("\(index) requests: RSS \(String(format: "%.1f", residentMB())) MB") }
}
