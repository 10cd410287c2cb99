import Foundation
import ResilienceSimulation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `resilience-demo simulate`: runs the deterministic simulation's scenarios under seeds and
/// reports violated invariants with the command that replays each.
enum SimulateCommand {
    static let usage = """
        usage: resilience-demo simulate [--scenario NAME|all] [--seed N | --seeds FIRST..LAST] [--trace] [--stop-at-first]
          scenarios: \(SimulationScenario.all.map { $0.name }.joined(separator: ", "))
          --seed N      run one seed (prints the trace with --trace)
          --seeds A..B  run every seed from A to B (default 1..100)
          --stop-at-first  end a scenario's seeds at its first failing run
        """

    static func run(_ arguments: [String]) -> Int32 {
        // Dictionary order follows the process's hash seed; fix it so a seed replays exactly in
        // any process. The process starts again with the variable set.
        if ProcessInfo.processInfo.environment["SWIFT_DETERMINISTIC_HASHING"] == nil {
            setenv("SWIFT_DETERMINISTIC_HASHING", "1", 1)
            let path = Bundle.main.executablePath ?? CommandLine.arguments[0]
            var argv: [UnsafeMutablePointer<CChar>?] = CommandLine.arguments.map { strdup($0) }
            argv.append(nil)
            execv(path, argv)
            FileHandle.standardError.write(Data("resilience-demo simulate: cannot restart with SWIFT_DETERMINISTIC_HASHING=1\n".utf8))
            return 1
        }
        var scenarios = SimulationScenario.all
        var seeds: ClosedRange<UInt64> = 1...100
        var printTrace = false
        var stopAtFirst = false
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            let value = index + 1 < arguments.count ? arguments[index + 1] : nil
            switch argument {
            case "--scenario":
                guard let value else { return fail("--scenario needs a name") }
                if value != "all" {
                    guard let scenario = SimulationScenario(named: value) else { return fail("no scenario '\(value)'") }
                    scenarios = [scenario]
                }
                index += 2
            case "--seed":
                guard let value, let seed = UInt64(value) else { return fail("--seed needs a number") }
                seeds = seed...seed
                index += 2
            case "--seeds":
                let bounds = value?.components(separatedBy: "..").compactMap { UInt64($0) } ?? []
                guard bounds.count == 2, bounds[0] <= bounds[1] else { return fail("--seeds needs FIRST..LAST") }
                seeds = bounds[0]...bounds[1]
                index += 2
            case "--trace":
                printTrace = true
                index += 1
            case "--stop-at-first":
                stopAtFirst = true
                index += 1
            default:
                return fail("unknown argument '\(argument)'")
            }
        }
        var failures = 0
        for scenario in scenarios {
            let started = ContinuousClock.now
            var runs = 0
            var steps = 0
            for seed in seeds {
                let report = scenario.run(seed: seed)
                runs += 1
                steps += report.run.steps
                if printTrace { for line in report.run.trace { print(line) } }
                if !report.passed {
                    failures += 1
                    print("FAIL \(scenario.name) seed \(seed):")
                    for violation in report.violations { print("  \(violation)") }
                    print("  replay: \(report.replayCommand) --trace")
                    if stopAtFirst { break }
                }
            }
            let elapsed = ContinuousClock.now - started
            print("simulate \(scenario.name): \(runs) seeds (\(seeds.lowerBound)...\(seeds.upperBound)), \(steps) steps, \(elapsed)")
        }
        print(failures == 0 ? "simulate: no invariant violated" : "simulate: \(failures) failing runs")
        return failures == 0 ? 0 : 1
    }

    private static func fail(_ message: String) -> Int32 {
        FileHandle.standardError.write(Data("resilience-demo simulate: \(message)\n\(usage)\n".utf8))
        return 64
    }
}
