import Dispatch
import Foundation
import RequestEngine
import Synchronization

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

// Issue 18's two measurements of the strategies beyond retry, as a plain executable (no benchmark
// framework: each mode prints its own table). See ../../README.md, "Strategies beyond retry
// (issue 18)", for what each mode measures, the figures and the verdicts.
//
//   strategies-benchmark hedging [requests] [warm-up]      hedged vs unhedged over URLSession and LoopbackHTTPServer
//   strategies-benchmark hedging-nocache [requests] [warm-up] the same, the transport without URLCache
//   strategies-benchmark hedging-stub [requests] [warm-up] the same over an in-process session that sleeps
//   strategies-benchmark overhead [rounds] [requests]      CPU per request, plain engine vs strategies on
//   strategies-benchmark count plain|deadline|breakers|limiter|strategies|adaptive|adaptive-only sequential|concurrent N
//                                                           N sends of one variant and nothing else (for callgrind)

let arguments = Array(CommandLine.arguments.dropFirst())

func argument(_ index: Int, default value: Int) -> Int {
    guard arguments.count > index else { return value }
    guard let parsed = Int(arguments[index]), parsed > 0 else {
        fatalError("argument \(index) must be a positive integer, got \(arguments[index])")
    }
    return parsed
}

func usage() -> Never {
    print(
        """
        usage: strategies-benchmark hedging [requests = 2000] [warm-up = 1000]
               strategies-benchmark hedging-nocache [requests = 2000] [warm-up = 1000]
               strategies-benchmark hedging-stub [requests = 2000] [warm-up = 1000]
               strategies-benchmark overhead [rounds = 15] [requests per block = 20000]
               strategies-benchmark count plain|deadline|breakers|limiter|strategies|adaptive|adaptive-only sequential|concurrent N
        """)
    exit(2)
}

switch arguments.first {
case "hedging":
    let requests = argument(1, default: 2_000), warmUp = argument(2, default: 1_000)
    runBlocking { try await HedgingBenchmark.run(transport: .loopback, requests: requests, warmUp: warmUp) }
case "hedging-nocache":
    let requests = argument(1, default: 2_000), warmUp = argument(2, default: 1_000)
    runBlocking { try await HedgingBenchmark.run(transport: .loopbackWithoutCache, requests: requests, warmUp: warmUp) }
case "hedging-stub":
    let requests = argument(1, default: 2_000), warmUp = argument(2, default: 1_000)
    runBlocking { try await HedgingBenchmark.run(transport: .stub, requests: requests, warmUp: warmUp) }
case "overhead":
    let rounds = argument(1, default: 15), requests = argument(2, default: 20_000)
    runBlocking { try await OverheadBenchmark.run(rounds: rounds, requests: requests) }
case "count":
    guard arguments.count == 4,
        let variant = OverheadBenchmark.Variant(rawValue: arguments[1]),
        let shape = OverheadBenchmark.Shape(rawValue: arguments[2])
    else { usage() }
    let requests = argument(3, default: 1)
    runBlocking { try await OverheadBenchmark.count(variant, shape, requests: requests) }
default:
    usage()
}

/// Runs `work` on the cooperative pool and blocks the main thread until it ends; exits with 1 if
/// it throws. The entry point is synchronous on purpose: under valgrind 3.19 an async `main`
/// (which parks the main thread in libdispatch's `dispatch_main`) crashes valgrind itself with a
/// SIGSEGV, even with `--tool=none`, and the instruction counts need valgrind.
func runBlocking(_ work: @escaping @Sendable () async throws -> Void) {
    let done = DispatchSemaphore(value: 0)
    let failure = Mutex<(any Error)?>(nil)
    Task {
        do { try await work() } catch { failure.withLock { $0 = error } }
        done.signal()
    }
    done.wait()
    if let error = failure.withLock({ $0 }) {
        print("failed: \(error)")
        exit(1)
    }
}
