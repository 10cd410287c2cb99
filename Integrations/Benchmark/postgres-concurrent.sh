#!/usr/bin/env bash
# Issue 49's figures: deliveries per second of the disk queue and of 1, 2 and 4
# `postgres-queue-replica drain` replicas at `maxConcurrentDeliveries` N = 1, 16 and 64, against
# an origin answering in 0, 50 and 200 ms (`postgres-queue-replica bench --deliveries N
# --latency-ms M`, release build), each beside its Little's-law bound, with the statements the
# replicas ran a delivery (pg_stat_statements). See Benchmarks/README.md for the figures.
#
#   Integrations/Benchmark/postgres-concurrent.sh                  # every latency, every N; 3 rounds each
#   LATENCIES="50" DELIVERIES="64" Integrations/Benchmark/postgres-concurrent.sh --rounds 5
#
# Each run (one latency, one N) has about four seconds of deliveries for one replica at its
# bound: 4 × N ÷ latency entries (5 000 at 0 ms). It starts the PostgreSQL of Scripts/postgres.sh
# when none answers (with pg_stat_statements loaded), and prints the date, the commit and `uptime`.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

# shellcheck source=replica-bench-setup.sh
source Integrations/Benchmark/replica-bench-setup.sh
for latency in ${LATENCIES:-0 50 200}; do
    for deliveries in ${DELIVERIES:-1 16 64}; do
        if [ "$latency" = 0 ]; then entries=5000; else entries=$((4 * deliveries * 1000 / latency)); fi
        [ "$entries" -ge 20 ] || entries=20
        echo
        echo "## origin $latency ms, N = $deliveries, $entries entries"
        "$binary" bench --replicas 1,2,4 --deliveries "$deliveries" --latency-ms "$latency" --entries "$entries" --keys 0 "$@"
    done
done
echo
echo "uptime after: $(uptime)"
