#!/usr/bin/env bash
# Deliveries per second of 1, 2 and 4 `postgres-queue-replica drain` replicas on one PostgreSQL
# table, beside the disk queue's replay of the same entries, against one loopback origin
# (`postgres-queue-replica bench`, release build). See Benchmarks/README.md for the figures.
#
#   Integrations/Benchmark/postgres-replicas.sh                  # 5 000 entries, no ordering keys, then 200 keys; 3 rounds each
#   Integrations/Benchmark/postgres-replicas.sh --rounds 5       # extra flags go to both runs of `bench`
#
# It starts the PostgreSQL of Scripts/postgres.sh when none answers (and leaves it running), and
# prints the date, the commit, the core count and `uptime` before and after, for the README.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

# shellcheck source=replica-bench-setup.sh
source Integrations/Benchmark/replica-bench-setup.sh
echo
echo "## no ordering keys"
"$binary" bench --replicas 1,2,4 --entries 5000 --keys 0 "$@"
echo
echo "## 200 ordering keys"
"$binary" bench --replicas 1,2,4 --entries 5000 --keys 200 "$@"
echo
echo "uptime after: $(uptime)"
