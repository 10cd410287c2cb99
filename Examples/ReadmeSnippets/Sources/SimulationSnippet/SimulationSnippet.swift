import RequestEngine
import ResilienceSimulation

// The README's "Testing your code" simulation snippet, as the README shows it (compiled here;
// `resilience-demo simulate` and the package's SimulationTests run simulations).
public func simulationSnippet() -> Simulation.Run {
    let run = Simulation.run(seed: 42) { simulation in
        simulation.network.setHost("api.example", .init(faults: .init(resetAfter: 0.1)))
        let engine = AsyncRequestEngine(session: simulation.network, clock: simulation.clock)
        await yourWorkload(engine)  // then check simulation.origin.effects(of:), run.ending, run.trace
    }
    return run
}

func yourWorkload(_ engine: AsyncRequestEngine) async {}
