import Foundation
import Resilience
import ResilienceTesting

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

// `swift run resilience-demo` — every layer built so far, end to end, against an embedded
// LoopbackHTTPServer on 127.0.0.1. Exits 0 only if every scenario met its expectation.

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "simulate" {
    // Before any other task starts: a simulation owns the process's task scheduling.
    exit(SimulateCommand.run(Array(arguments.dropFirst())))
}
if arguments.first == "serve" {
    exit(await Serve.run(Array(arguments.dropFirst())))
}
if arguments.first == "drain" {
    exit(await DrainCommand.run(Array(arguments.dropFirst())))
}
if arguments.first == "notes-relaunch" {
    exit(await NotesRelaunchCommand.run(Array(arguments.dropFirst())))
}
if arguments.contains("--help") || arguments.contains("-h") {
    print(
        """
        usage: resilience-demo                         run every scenario against the embedded loopback server
               resilience-demo --list                  list the scenarios
               resilience-demo stress dedup --callers N | auth --callers N | queue --entries N
               resilience-demo queue inspect DIR       list an on-disk offline queue (read-only)
               resilience-demo simulate [--scenario NAME] [--seed N | --seeds A..B] [--trace]
                                                       the deterministic simulation (seeds 1..100 by default)
               resilience-demo serve [--port N] [--duration S]
                                                       steady workload with Prometheus metrics at /metrics
               resilience-demo drain [--interval S] [--budget S] [--entries N]
                                                       a drain service process; stops cleanly on SIGTERM/SIGINT
               resilience-demo notes-relaunch FOLDER URL
                                                       the offline-notes scenario's second process
        """)
    exit(0)
}
if arguments.contains("--list") {
    for scenario in Demo.scenarios { print("  \(scenario.name)") }
    exit(0)
}
if arguments.first == "stress" {
    exit(await Stress.run(Array(arguments.dropFirst())))
}
if arguments.first == "queue" {
    exit(QueueInspect.run(Array(arguments.dropFirst())))
}
if let unknown = arguments.first {
    FileHandle.standardError.write(Data("resilience-demo: unknown argument '\(unknown)'; try --help\n".utf8))
    exit(64)
}

let passed = await Demo.runAll()
exit(passed ? 0 : 1)
