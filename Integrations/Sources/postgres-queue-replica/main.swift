import Foundation

// Replicas of a service that delivers the offline queue's entries from one PostgreSQL table, for
// the replica test (Tests/ResiliencePostgresTests/PostgresReplicaKillTests.swift) and the replica
// benchmark (Integrations/Benchmark/postgres-replicas.sh). The database is the one the
// ResiliencePostgres tests use (RESILIENCE_POSTGRES_URL, see ReplicaDatabase).
//
//   postgres-queue-replica drain --table T [--lease-ms 2000] [--poll-ms 500]
//   postgres-queue-replica enqueue --table T --origin URL [--count 10000] [--keys 200] [--workers 4] [--run ID]
//   postgres-queue-replica bench [--replicas 1,2,4] [--entries 5000] [--keys 0] [--rounds 3] [--lease-ms 2000] [--poll-ms 500]

let usage = """
    usage: postgres-queue-replica drain --table T [--lease-ms N] [--poll-ms N]
           postgres-queue-replica enqueue --table T --origin URL [--count N] [--keys N] [--workers N] [--run ID]
           postgres-queue-replica bench [--replicas 1,2,4] [--entries N] [--keys N] [--rounds N] [--lease-ms N] [--poll-ms N]
    """

do {
    let arguments = try ReplicaArguments(Array(CommandLine.arguments.dropFirst()))
    switch arguments.mode {
    case "drain": try await DrainCommand.run(arguments)
    case "enqueue": try await EnqueueCommand.run(arguments)
    case "bench": try await BenchCommand.run(arguments)
    default: throw UsageError("unknown mode \(arguments.mode)")
    }
} catch let error as UsageError {
    log("postgres-queue-replica: \(error)\n\(usage)")
    exit(2)
} catch {
    log("postgres-queue-replica: \(error)")
    exit(1)
}
